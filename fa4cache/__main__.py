from fa4cache.cli import main

raise SystemExit(main())
