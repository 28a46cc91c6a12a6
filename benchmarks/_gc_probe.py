"""H200/H100 probe (not a benchmark): a cold fa4cache step, then the floor (only the forward
missing) twice, printing every full collection each step's process saw (phases: gc_full)."""

import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_cold_start import step_procs  # noqa: E402

with tempfile.TemporaryDirectory() as t:
    tmp = Path(t)
    for tag, ahead, reuse in (("cold", True, False), ("floor-0", False, True), ("floor-1", False, True)):
        if tag.startswith("floor"):
            (tmp / tag).mkdir()
            shutil.copytree(tmp / "cold" / "store", tmp / tag / "store")
            for f in (tmp / tag / "store").glob("v2/*/fwd/*"):
                f.unlink()
        res, _, _, ph = step_procs(tmp, 1, "fa4cache", "varlen", 6144, ahead, tag, reuse=reuse)
        r = res[0]
        go = r["go_at"]
        print(tag, "first step", round(r["first_s"], 3))
        for p in sorted(ph, key=lambda p: p["start"]):
            if (
                p["pid"] == r["pid"]
                and p["phase"] in ("gc_full", "compile", "trace", "preprocess")
                and p["start"] - go < 0.5
            ):
                extra = {k: p[k] for k in ("frozen", "counts", "callbacks", "collected") if k in p}
                if p["phase"] != "preprocess" or p["end"] - p["start"] > 0.05:
                    print(
                        "   ", p["phase"], round(p["start"] - go, 3), round(p["end"] - p["start"], 3), extra
                    )
