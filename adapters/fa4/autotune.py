"""FA4's forward autotuner under fa4cache: candidates compile into the store, winners stay there.

FA4 4.0.0b40's ``flash_attn.cute.autotune.tune_fwd_config`` compiles candidate ``FwdConfig``s in
child processes (``_compile_one``) that hand the kernels back through FA4's own disk cache, then
times them on the GPU and returns the fastest. Under fa4cache FA4's disk cache is closed
(:mod:`.dsl_caches`) and the parent's compile caches are the store, so :func:`apply` (only on FA4
sources where :attr:`~fa4cache.fa4_releases.Coupling.AUTOTUNE` was verified) replaces three names
of that module:

* ``_compile_one``: FA4's child protocol (pickled request on stdin, ``_compile_worker()``), but
  the child installs fa4cache on the parent's store first, so each candidate kernel is published
  there and the parent's miss probe and timing calls load it (disk hits, no compile in the
  parent). Without a GPU the child cross-compiles for the call's arch with the parent's SM count
  (:func:`fa4cache.arch.cross_compile_env`) instead of asking the driver;
* ``CUTE_DSL_CACHE_ENABLED`` (the tuner's own copy of FA4's switch): true, since the store is
  the cache; FA4's disk cache itself stays closed;
* ``tune_fwd_config``: the winner is kept in the store as a small entry of kind ``autotune``,
  keyed by what tuning depends on: the toolchain (arch, SM count, FA4's sources), the GPU's name,
  the candidate list and the call's shape class (each tensor argument's shape, stride and dtype
  after FA4's own normalisation, every other argument by value). The entry holds the winner's
  index into the candidate list. A process, or a node, with the same key gets the winner without
  tuning or compiling.

FA4 checks the call first (its own errors reach the caller unchanged), and anything going wrong
inside fa4cache fails open (:mod:`.fail_open`) to FA4's own ``tune_fwd_config``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import pickle
import subprocess
import sys
import time
import types
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fa4cache.adapters.fa4 import fail_open
from fa4cache.adapters.fa4.fail_open import Stage

from fa4cache.arch import arch_name, cross_compile_env, gpu_present
from fa4cache.hashing import encode_key, key_digest
from fa4cache.store.locks import release
from fa4cache.store.paths import EntryRef

if TYPE_CHECKING:
    from fa4cache.adapters.route import Route

log = logging.getLogger(__name__)

MODULE = "flash_attn.cute.autotune"
KIND = "autotune"
FORMAT = 1  # of the entry's bytes and of its key
WHAT = "an autotuning winner"
# FA4's names this module replaces or calls; all must be there, or FA4's tuner is left alone.
NEEDED = ("_compile_one", "_compile_worker", "_normalize_kwargs", "tune_fwd_config", "CUTE_DSL_CACHE_ENABLED")

# The compile child: FA4's own (it skips flash_attn/__init__.py, which imports the FA2 CUDA
# extension), with fa4cache installed on the parent's store (FA4CACHE_DIR) before FA4 is imported.
# Its flash_attn package has the parent's search path (FA4's child has only the directory FA4
# runs from): a namespace package spread over several directories is then the same FA4 sources
# in both, so the child's kernels are filed under the parent's toolchain.
CHILD = """
import sys
import types
package = types.ModuleType("flash_attn")
package.__path__ = {path!r}
sys.modules["flash_attn"] = package
try:
    import fa4cache
    fa4cache.install()
except Exception as e:  # fail open: the kernel is then compiled again by the parent when it runs
    print(f"fa4cache: not installed in this autotune compile worker ({type(e).__name__}: {e})", file=sys.stderr)
from flash_attn.cute.autotune import _compile_worker
_compile_worker()
"""

_applied: list[tuple[types.ModuleType, str, Any]] = []
_said: set[str] = set()  # entries found holding no valid winner (warned once each)


def apply(route: Route, module: types.ModuleType) -> bool:
    """Route ``module``'s (FA4's autotuner's) compiles and winners through ``route``'s store.
    Any trouble leaves FA4's tuner as it is (one warning); returns whether it was applied."""
    if any(m is module for m, _, _ in _applied):
        return True
    try:
        missing = [n for n in NEEDED if not hasattr(module, n)]
        if missing:
            raise AttributeError(f"{MODULE} has no {', '.join(missing)}")
        replacements = {
            "_compile_one": compile_one_for(route, module),
            "tune_fwd_config": tune_for(route, module, module.tune_fwd_config),
            "CUTE_DSL_CACHE_ENABLED": True,
        }
    except Exception as e:
        fail_open.failed(Stage.PATCH, e, what="FA4's autotuner", store=route.store)
        return False
    for name, value in replacements.items():
        _applied.append((module, name, getattr(module, name)))
        setattr(module, name, value)
    return True


def revert() -> None:
    """Give FA4's autotuner its own functions back (``uninstall()``)."""
    while _applied:
        module, name, original = _applied.pop()
        setattr(module, name, original)


# ---------------------------------------------------------------------- candidate compiles


def compile_one_for(route: Route, module: types.ModuleType) -> Callable[..., None]:
    def _compile_one(config: Any, encoded_kwargs: Mapping[str, Any], device: Any) -> None:
        """Compile a full forward call in a fake-tensor child that publishes into the store."""
        try:
            code = CHILD.replace("{path!r}", repr(fa4_path(module)))
            env = child_env(route, module, encoded_kwargs["_arch"], device)
        except Exception as e:
            # No child: the tuning process compiles the candidate when it times it (slower,
            # never wrong). Not FA4's own child, which would reopen FA4's disk cache.
            fail_open.failed(Stage.PATCH, e, what="an autotune compile worker", store=route.store)
            return
        subprocess.run(
            [sys.executable, "-c", code],
            check=True,
            capture_output=True,
            input=pickle.dumps({"config": config, "forward_kwargs": encoded_kwargs}),
            env=env,
            cwd=module._REPO_ROOT,
            timeout=module._COMPILE_TIMEOUT_SECONDS,
        )

    _compile_one.__fa4cache_autotune__ = True  # type: ignore[attr-defined]
    return _compile_one


def fa4_path(module: types.ModuleType) -> list[str]:
    """The parent's ``flash_attn`` search path (FA4's child's when the parent has none)."""
    package = sys.modules.get("flash_attn")
    path = [str(p) for p in getattr(package, "__path__", None) or ()]
    return path or [os.path.join(str(module._REPO_ROOT), "flash_attn")]


def child_env(route: Route, module: types.ModuleType, device_arch: int, device: Any) -> dict[str, str]:
    """The compile child's environment: the parent's, plus its store's job settings (FA4's and
    the DSL's disk caches stay off) and the target: the caller's GPU where there is one (as FA4
    does), else a cross-compile for the call's arch with the SM count the parent's kernels
    carry, so that the child's kernels are filed under the parent's toolchain."""
    env = os.environ.copy()
    env.update(route.store.settings.job_env())
    env["FA4CACHE_COMPILE_AHEAD"] = "0"  # a worker compiles what it is told, nothing ahead
    if gpu_present():
        import torch

        # A UUID names the caller's GPU whatever form the caller's CUDA_VISIBLE_DEVICES takes.
        env["CUDA_VISIBLE_DEVICES"] = f"GPU-{torch.cuda.get_device_properties(device).uuid}"
        env["CUTE_DSL_ARCH"] = module._cute_dsl_arch(device_arch)
        env["FLASH_ATTENTION_ARCH"] = str(device_arch)
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
        env.update(cross_compile_env(arch_name(device_arch), route.toolchain().num_sms))
    return env


# ---------------------------------------------------------------------- winners


def tune_for(route: Route, module: types.ModuleType, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def tune_fwd_config(
        configs: Sequence[Any], forward_kwargs: Mapping[str, Any], *, compile_workers: int = 8
    ) -> Any:
        configs = list(configs)  # an iterator is read once, here; FA4 gets the list

        def tune() -> Any:
            return original(configs, forward_kwargs, compile_workers=compile_workers)

        # FA4's own checks, in its order: whatever they refuse, FA4 refuses with its own error.
        try:
            import torch

            candidates = tuple(dict.fromkeys(configs))
            refused = not candidates or compile_workers < 1 or torch.compiler.is_compiling()
            if not refused:
                kwargs = module._normalize_kwargs(forward_kwargs)
                device = kwargs["v"].device
                with torch.cuda.device(device):
                    refused = torch.cuda.is_current_stream_capturing()
        except Exception:
            refused = True
        if refused:
            return tune()
        return Winners(route).tuned(candidates, kwargs, device, tune)

    tune_fwd_config.__fa4cache_autotune__ = True  # type: ignore[attr-defined]
    return tune_fwd_config


class Winners:
    """Autotuning winners in one route's store."""

    def __init__(self, route: Route) -> None:
        self.route = route
        self.store = route.store

    def ref(self, candidates: Sequence[Any], kwargs: Mapping[str, Any], device: Any) -> tuple[str, EntryRef]:
        """The key's text and the entry it names."""
        if gpu_present():
            import torch

            gpu = torch.cuda.get_device_name(device)
        else:
            gpu = None
        encoded = encode_key((FORMAT, gpu, tuple(candidates), shape_class(kwargs)))
        tc = self.route.toolchain().id
        return encoded, EntryRef(tc, KIND, key_digest(tc, KIND, encoded))

    def tuned(
        self, candidates: tuple[Any, ...], kwargs: Mapping[str, Any], device: Any, tune: Callable[[], Any]
    ) -> Any:
        """The stored winner for this call, else ``tune()``'s, which is then stored."""
        store = self.store
        try:
            encoded, ref = self.ref(candidates, kwargs, device)
        except Exception as e:
            fail_open.failed(Stage.KEY, e, what=WHAT, store=store)
            return tune()
        hit = self.load(ref, candidates, remote=False)
        if hit is not None:
            return hit
        # Single flight: other processes of this node (and, with a remote tier, of the job)
        # wait for this tuning instead of repeating it, then load its winner.
        try:
            lock = store.locks.acquire(ref.digest)
        except Exception as e:
            fail_open.failed(Stage.LOCK, e, what=WHAT, store=store)
            lock = None
        try:
            if lock is not None or store.remote is not None:
                hit = self.load(ref, candidates, remote=True)
                if hit is not None:
                    return hit
            t0 = time.perf_counter()
            winner = tune()  # FA4's own errors reach the caller
            self.publish(ref, encoded, candidates, winner, kwargs, time.perf_counter() - t0)
            return winner
        finally:
            release(lock)

    def load(self, ref: EntryRef, candidates: Sequence[Any], *, remote: bool) -> Any | None:
        store = self.store
        try:
            art = store.load(ref, remote=remote)
        except Exception as e:
            stage = Stage.REMOTE if remote and store.remote is not None else Stage.STORE_READ
            fail_open.failed(stage, e, what=WHAT, store=store)
            return None
        if art is None:
            return None
        index = winner_index(art.data, len(candidates))
        if index is None:
            if ref.digest not in _said:  # once, not again after the key's lock
                _said.add(ref.digest)
                log.warning(
                    "fa4cache: autotune entry %s holds no winner among these %d candidates; tuning again",
                    ref.digest[:16],
                    len(candidates),
                )
            return None
        try:
            store.counters.add("disk_hits", kind=KIND)
            store.touch(art)
            store.counters.flush(throttle=1.0)
        except Exception as e:  # bookkeeping only: the winner is known
            fail_open.failed(Stage.STORE_WRITE, e, what="the store's use records", store=store)
        log.info(
            "fa4cache: autotuning winner %d of %d candidates loaded from the store", index, len(candidates)
        )
        return candidates[index]

    def publish(
        self,
        ref: EntryRef,
        encoded: str,
        candidates: Sequence[Any],
        winner: Any,
        kwargs: Mapping[str, Any],
        seconds: float,
    ) -> None:
        store = self.store
        try:
            data = json.dumps(
                {"format": FORMAT, "index": candidates.index(winner), "candidates": len(candidates)}
            )
            v = kwargs["v"]
            store.publish_bytes(
                ref,
                data.encode(),
                key=encoded if len(encoded) <= 64 * 1024 else None,
                summary={
                    "dtype": str(v.dtype).removeprefix("torch."),
                    "head_dim": int(kwargs["q"].shape[-1]),
                },
                compile_seconds=seconds,  # what tuning took: what a hit saves
                tvm_ffi=False,  # not an object file
            )
            store.flush_touches()
            store.counters.flush()
        except Exception as e:
            fail_open.failed(Stage.STORE_WRITE, e, what=WHAT, store=store)


def winner_index(data: bytes, n: int) -> int | None:
    """The winner's index in an entry's bytes, if it is one of ``n`` candidates, else None."""
    try:
        obj = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(obj, dict) or obj.get("format") != FORMAT or obj.get("candidates") != n:
        return None
    index = obj.get("index")
    if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < n:
        return None
    return index


def shape_class(kwargs: Mapping[str, Any]) -> tuple[Any, ...]:
    """What the tuning of a call depends on besides the toolchain, the GPU and the candidates:
    each tensor's shape, stride and dtype (as FA4's ``_compile_barrier`` hands calls to its
    compile workers), every other argument as it is (:func:`~fa4cache.hashing.encode_key`
    refuses what it cannot encode by value). Tensor contents (``cu_seqlens``) are not in it."""
    return tuple((name, _shape(value)) for name, value in sorted(kwargs.items()))


def _shape(value: Any) -> Any:
    if _is_tensor(value):
        return ("tensor", tuple(value.shape), tuple(value.stride()), str(value.dtype).removeprefix("torch."))
    if isinstance(value, (tuple, list)) and any(_is_tensor(v) or isinstance(v, (tuple, list)) for v in value):
        inner = tuple(_shape(v) for v in value)
        fields = getattr(value, "_fields", None)
        return (f"{type(value).__module__}.{type(value).__qualname__}", fields, inner) if fields else inner
    return value


def _is_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)
