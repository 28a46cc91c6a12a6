"""``@fa4cache.jit_cache`` (:mod:`fa4cache.adapters.jit.jit_cache`) and its routing of QuACK's own compile caches
(:mod:`fa4cache.adapters.jit.quack`) into the store."""
