"""Launch plans (fa4cache/decode/launch_plans.py, plan.py, observe.py, launch.py) against FA4's own planning.

FA4's real ``_flash_attn_fwd`` plans each call here on fake CUDA tensors (FakeTensorMode),
with its "is this fake?" answered no, so that it goes on to call the kernel: the compile
cache hands it a recorder instead, which keeps the key and the arguments. No kernel is
compiled or run. Random decode shapes at sm_90 and sm_100 (the seed is printed):

* the claim plans rest on: for a family (every fact but the key count), FA4 takes the same
  kernel with the same arguments at any key count;
* a replayed call hands the kernel exactly what FA4 itself would have, at a new key count;
* what must not replay does not: another FA4 setting, a cleared cache, a call FA4 makes
  tensors for, an FA4 whose sources were not checked, ``FA4CACHE_LAUNCH_PLANS=0``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import random
from typing import Any

import pytest

torch = pytest.importorskip("torch")
fi = pytest.importorskip("flash_attn.cute.interface")

from fa4cache import fa4_releases, settings  # noqa: E402
from fa4cache.decode import launch, observe, plan  # noqa: E402
from fa4cache.decode import launch_plans as lp  # noqa: E402
from fa4cache.fingerprint import fa4_source_digest  # noqa: E402
from tests.helpers.switches import set_switch  # noqa: E402

# Planning is checked against one FA4's internals; on an FA4 whose release does not list
# launch_plans, plans are off (the last test checks that) and FA4 plans every call.
_PLANNED = fa4_releases.why_off(fa4_releases.Coupling.LAUNCH_PLANS) is None
pytestmark = pytest.mark.skipif(
    not _PLANNED,
    reason="launch plans are not verified on this FA4 (tests/test_fa4_releases.py checks they are off)",
)

SEED = int(os.environ.get("FA4CACHE_FUZZ_SEED", random.SystemRandom().randrange(1 << 30)))


class Recorder:
    """A compile cache holding every key: its kernels record the arguments they get."""

    def __init__(self) -> None:
        self.cache: dict[Any, Any] = {}
        self.calls: list[tuple[Any, ...]] = []

    def __contains__(self, key: Any) -> bool:
        if key not in self.cache:
            self.cache[key] = lambda *args: self.calls.append((key, args))
        return True

    def __getitem__(self, key: Any) -> Any:
        return self.cache[key]

    def __setitem__(self, key: Any, fn: Any) -> None:
        raise AssertionError("nothing compiles in these tests")


@pytest.fixture
def fa4(monkeypatch: pytest.MonkeyPatch) -> Recorder:
    """FA4's forward planning for real, its kernels recorded; plans forgotten between tests."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    rec = Recorder()
    monkeypatch.setattr(fi._flash_attn_fwd, "compile_cache", rec)
    monkeypatch.setattr(fi, "is_fake_mode", lambda: False)  # go on to the kernel call
    monkeypatch.setattr(lp, "_verified", [True])
    # Fake tensors have no data pointer: their storage's identity and offset stand in for it,
    # on a 256-byte grid (as FA4 itself takes a fake tensor's address to be its offset).
    monkeypatch.setattr(plan, "_pointers", lambda ts: [fake_address(t) for t in ts])
    lp.clear()
    rec.mode = FakeTensorMode()  # type: ignore[attr-defined]
    yield rec
    lp.clear()


_storages: dict[int, int] = {}


def fake_address(t: Any) -> int:
    base = _storages.setdefault(t.untyped_storage()._cdata, (len(_storages) + 1) << 40)
    return base + t.storage_offset() * t.element_size()


def _whole(arch: int) -> Any:
    def run(q: Any, k: Any, v: Any, **kw: Any) -> Any:
        return fi._flash_attn_fwd(q, k, v, _arch=arch, **kw)[0]

    return run


def draw(rng: random.Random) -> dict[str, Any]:
    """A decode call as fa4cache.decode.kv_cache makes it: (row, KV head) pairs as sequences."""
    d = rng.choice([64, 96, 128] + ([256] if rng.random() < 0.2 else []))
    window = rng.choice([None, None, rng.randint(0, 4096)])
    return {
        "n": rng.choice([1, 2, 7, 32, 256, 1024]), "tq": rng.choice([1, 1, 1, 2, 5]),
        "g": rng.choice([1, 2, 4, 5, 8]), "d": d, "dtype": rng.choice([torch.bfloat16, torch.float16]),
        "causal": rng.random() < 0.8, "window": window, "softcap": rng.choice([0.0, 0.0, 30.0]),
        "scale": rng.choice([d**-0.5, 0.1]),
    }  # fmt: skip


def tensors(mode: Any, c: dict[str, Any], tk: int) -> tuple[Any, ...]:
    with mode:
        n, tq, g, d = c["n"], c["tq"], c["g"], c["d"]
        q = torch.empty(n, tq, g, d, dtype=c["dtype"], device="cuda")
        k = torch.empty(n * tk, 1, d, dtype=c["dtype"], device="cuda")
        v = torch.empty(n * tk, 1, d, dtype=c["dtype"], device="cuda")
        out = torch.empty(n, tq, g, d, dtype=c["dtype"], device="cuda")
        cu = torch.empty(n + 1, dtype=torch.int32, device="cuda")
        used = torch.empty(n, dtype=torch.int32, device="cuda")
    return q, k, v, out, cu, used


def kwargs(c: dict[str, Any], t: tuple[Any, ...], tk: int) -> dict[str, Any]:
    w = c["window"]
    return {
        "cu_seqlens_k": t[4], "seqused_k": t[5], "max_seqlen_q": c["tq"], "max_seqlen_k": tk,
        "softmax_scale": c["scale"], "causal": c["causal"], "softcap": c["softcap"],
        "window_size_left": w, "window_size_right": 0 if w is not None else None, "out": t[3],
    }  # fmt: skip


def fa4_plan(rec: Recorder, c: dict[str, Any], tk: int, arch: int) -> plan.Plan | None:
    t = tensors(rec.mode, c, tk)  # type: ignore[attr-defined]
    _, calls = observe.observe(fi._flash_attn_fwd, lambda: _whole(arch)(*t[:3], **kwargs(c, t, tk)))
    return plan.plan_of(rec, calls, t)


@pytest.mark.parametrize("arch", [90, 100])
def test_fa4_picks_kernel_and_arguments_without_the_key_count(fa4: Recorder, arch: int) -> None:
    print(f"FA4CACHE_FUZZ_SEED={SEED}")
    rng = random.Random(SEED + arch)
    planned = 0
    for case in range(40):
        c = draw(rng)
        counts = [1, rng.randint(2, 300), rng.randint(301, 70000), 1 << rng.randint(9, 17)]
        try:
            plans = [fa4_plan(fa4, c, tk, arch) for tk in counts]
        except (AssertionError, ValueError, NotImplementedError) as e:
            # FA4 refuses the shape at this arch (a head dim, a window): at every key count.
            for tk in counts:
                with pytest.raises(type(e)):
                    fa4_plan(fa4, c, tk, arch)
            continue
        assert plans[0] is not None, f"seed {SEED} case {case}: {c}: the call is no plan"
        for tk, p in zip(counts[1:], plans[1:]):
            assert p == plans[0], f"seed {SEED} case {case}: {c}: key count {tk} plans otherwise"
        planned += 1
    assert planned >= 20, planned


def test_plans_are_on_for_an_fa4_whose_planning_was_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    # A new FA4 gets no plans (FA4 plans every call) until the tests above have passed on it
    # and its release lists launch_plans in fa4cache/fa4_releases.py.
    monkeypatch.setattr(lp, "_verified", [])
    assert lp.enabled(), f"FA4 sources {fa4_source_digest()}"


def test_a_replay_hands_the_kernel_what_fa4_would(fa4: Recorder) -> None:
    rng = random.Random(SEED + 1)
    for case in range(25):
        c = {**draw(rng), "d": rng.choice([64, 128])}
        whole_calls, counted = _counted()
        run = _whole(90)
        tk1, tk2 = rng.randint(2, 5000), rng.randint(1, 5000)  # a plan is made from 2 key rows on
        lp.clear()  # an earlier case may be of the same family
        t1 = tensors(fa4.mode, c, tk1)  # type: ignore[attr-defined]
        launch.replay_or_plan(fi, counted, t1, kwargs(c, t1, tk1))  # planned: FA4 runs whole
        t2 = tensors(fa4.mode, c, tk2)  # type: ignore[attr-defined]
        fa4.calls.clear()
        got = launch.replay_or_plan(fi, counted, t2, kwargs(c, t2, tk2))
        assert whole_calls["whole"] == 1, f"seed {SEED} case {case}: {c}: not replayed"
        assert got is t2[3]
        ((key, replayed),) = fa4.calls
        # What FA4 itself hands its kernel for these very tensors.
        kw2 = kwargs(c, t2, tk2)
        _, calls = observe.observe(fi._flash_attn_fwd, lambda: run(*t2[:3], **kw2))  # noqa: B023
        ((want_key, _fn, want, _kw),) = calls
        assert key == want_key and len(replayed) == len(want), f"seed {SEED} case {case}: {c}"
        for i, (a, b) in enumerate(zip(replayed, want)):
            if isinstance(b, torch.Tensor):
                assert plan._same_tensor(a, b), f"seed {SEED} case {case}: {c}: argument {i}"
            else:
                assert a == b or (a is None and b is None), f"seed {SEED} case {case}: {c}: {a!r} != {b!r}"


def _counted(arch: int = 90) -> tuple[dict[str, int], Any]:
    n = {"whole": 0}
    run = _whole(arch)

    def counted(*a: Any, **kw: Any) -> Any:
        n["whole"] += 1
        return run(*a, **kw)

    return n, counted


def _plan_then(fa4: Recorder, change: Any) -> int:
    """Plan a call, apply ``change``, call again at a new key count: FA4's whole runs."""
    c = {**draw(random.Random(SEED + 2)), "d": 128}
    n, counted = _counted()

    t = tensors(fa4.mode, c, 100)  # type: ignore[attr-defined]
    launch.replay_or_plan(fi, counted, t, kwargs(c, t, 100))
    change()
    t = tensors(fa4.mode, c, 101)  # type: ignore[attr-defined]
    launch.replay_or_plan(fi, counted, t, kwargs(c, t, 101))
    return n["whole"]


def test_unchanged_state_replays(fa4: Recorder) -> None:
    assert _plan_then(fa4, lambda: None) == 1


_FA4_SWITCHES = ("_fa_clc_enabled", "_fa_disable_2cta_enabled", "_fa_disable_2cta_cuda12",
                 "_fa_disable_s_ping_pong_enabled")  # fmt: skip


@pytest.mark.parametrize("change", ["FLASH_ATTENTION_NUM_SMS", "FLASH_ATTENTION_ARCH", *_FA4_SWITCHES])
def test_an_fa4_setting_changed_at_run_time_is_planned_again(
    fa4: Recorder, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest, change: str
) -> None:
    if change == "FLASH_ATTENTION_NUM_SMS":
        flip: Any = lambda: monkeypatch.setenv(change, "78")  # noqa: E731
    elif change == "FLASH_ATTENTION_ARCH":
        # FA4 keeps its arch for the process (lru_cache): it changes only with the cache cleared.
        other = "sm_100" if fi._get_device_arch() == 90 else "sm_90"
        request.addfinalizer(fi._get_device_arch.cache_clear)  # read again after the env is restored

        def flip() -> None:
            monkeypatch.setenv(change, other)
            fi._get_device_arch.cache_clear()

    else:
        flip = lambda: monkeypatch.setattr(fi.utils, change, not getattr(fi.utils, change))  # noqa: E731
    assert _plan_then(fa4, flip) == 2


def test_fa4_settings_tell_apart_whatever_fa4s_own_getters_do(monkeypatch: pytest.MonkeyPatch) -> None:
    # The family reads FA4's globals and the raw environment, not FA4's getters: over every
    # state of the switches, the SM-count override and the log level, no two states FA4's
    # getters answer differently for may read alike.
    u, seen = fi.utils, {}
    for bits in range(1 << len(_FA4_SWITCHES)):
        for i, name in enumerate(_FA4_SWITCHES):
            monkeypatch.setattr(u, name, bool(bits >> i & 1))
        for sms in ("78", "132", None):
            if sms is None:
                monkeypatch.delenv("FLASH_ATTENTION_NUM_SMS", raising=False)
            else:
                monkeypatch.setenv("FLASH_ATTENTION_NUM_SMS", sms)
            for level in (0, 1, 2):
                monkeypatch.setattr(fi.fa_logging, "_fa_log_level", level)
                getters = (
                    u._get_use_clc_scheduler_default(), u._get_disable_2cta_default(is_fwd=True),
                    u._get_disable_s_ping_pong_default(), os.getenv("FLASH_ATTENTION_NUM_SMS"),
                    fi.fa_logging.get_fa_log_level(),
                )  # fmt: skip
                read = plan.fa4_settings(fi)
                assert seen.setdefault(read, getters) == getters, (read, getters)
    assert len(set(seen.values())) == 3 * 3 * 2**3  # the cuda12 switch only ORs into the 2-CTA one


def test_the_environment_is_read_as_it_is_now(monkeypatch: pytest.MonkeyPatch) -> None:
    def sms() -> Any:
        return plan.fa4_settings(fi)[5]

    monkeypatch.setenv("FLASH_ATTENTION_NUM_SMS", "16")
    assert sms() == "16"
    os.environ.pop("FLASH_ATTENTION_NUM_SMS")  # removed behind monkeypatch's back: seen at once
    assert sms() is None
    monkeypatch.setattr(os, "environ", {"FLASH_ATTENTION_NUM_SMS": "16"})  # a plain mapping in its place
    assert sms() == "16"
    # Another os._Environ with its own key encoding.
    env = os._Environ({"flash_attention_num_sms": "8"}, str.lower, str, str, str)  # type: ignore[attr-defined]
    monkeypatch.setattr(os, "environ", env)
    assert sms() == "8"


def test_the_switch_is_parsed_from_the_value_it_was_compared_by(monkeypatch: pytest.MonkeyPatch) -> None:
    # The environment changed after the switches were read (another thread): the answer kept
    # for "0" must be "off", whatever the environment says by then (the switches are read
    # once a process: fa4cache.settings.decode_switches).
    class Changing(dict):  # type: ignore[type-arg]
        reads = 0

        def get(self, key: Any, default: Any = None) -> Any:
            if key != "FA4CACHE_LAUNCH_PLANS":
                return super().get(key, default)
            self.reads += 1
            return "0" if self.reads == 1 else "1"

    monkeypatch.setattr(lp, "_verified", [True])
    monkeypatch.setattr(settings, "_decode_switches", [])  # not read yet
    monkeypatch.setattr(os, "environ", Changing())
    assert not lp.enabled()
    assert settings._decode_switches == [settings.DecodeSwitches(launch_plans=False)]
    assert not lp.enabled()  # kept, not read again


def test_a_cleared_compile_cache_is_planned_again(fa4: Recorder) -> None:
    assert _plan_then(fa4, fa4.cache.clear) == 2


def test_a_replaced_compile_cache_is_planned_again(fa4: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    other = Recorder()
    other.mode = fa4.mode  # type: ignore[attr-defined]
    assert _plan_then(fa4, lambda: monkeypatch.setattr(fi._flash_attn_fwd, "compile_cache", other)) == 2


def test_a_call_with_tensors_fa4_made_is_no_plan(fa4: Recorder) -> None:
    c = {**draw(random.Random(SEED + 3)), "d": 128}
    t = tensors(fa4.mode, c, 50)  # type: ignore[attr-defined]
    other = tensors(fa4.mode, c, 50)  # type: ignore[attr-defined]
    key = object()
    assert plan.plan_of(fa4, [(key, None, (t[0], t[1]), {})], t) is not None
    assert plan.plan_of(fa4, [(key, None, (t[0], other[1]), {})], t) is None  # not the call's own
    assert plan.plan_of(fa4, [(key, None, (t[0], (t[1],)), {})], t) is None  # a tensor inside an argument
    assert plan.plan_of(fa4, [(key, None, (t[0],), {}), (key, None, (t[0],), {})], t) is None  # two launches
    assert plan.plan_of(fa4, [], t) is None  # no launch (FA4 returned early)


def test_unverified_fa4_and_the_setting_turn_plans_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lp, "_verified", [False])
    assert not lp.enabled()
    monkeypatch.setattr(lp, "_verified", [True])
    assert lp.enabled()
    set_switch(monkeypatch, "FA4CACHE_LAUNCH_PLANS", "0")
    assert not lp.enabled()
    set_switch(monkeypatch, "FA4CACHE_LAUNCH_PLANS", "1")  # read again when set_switch rereads them
    assert lp.enabled()
    set_switch(monkeypatch, "FA4CACHE_LAUNCH_PLANS", "0")
    assert not lp.enabled()
    set_switch(monkeypatch, "FA4CACHE_LAUNCH_PLANS", None)
    assert lp.enabled()


def test_cpu_tensors_run_fa4_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = []
    q = torch.zeros(2, 1, 4, 64)
    k = torch.zeros(20, 1, 64)
    out = torch.zeros(2, 1, 4, 64)
    cu, used = torch.zeros(3, dtype=torch.int32), torch.zeros(2, dtype=torch.int32)
    got, _ = launch.launch_replay(
        lambda *a, **kw: seen.append(kw) or kw["out"], (q, k, k, out, cu, used),
        (1, 0.1, True, 0.0, None, None), 10,
    )  # fmt: skip
    assert got is out and len(seen) == 1
    assert seen[0] == {  # FA4's own argument names
        "cu_seqlens_k": cu, "seqused_k": used, "max_seqlen_q": 1, "max_seqlen_k": 10, "softmax_scale": 0.1,
        "causal": True, "softcap": 0.0, "window_size_left": None, "window_size_right": None, "out": out,
    }  # fmt: skip


def test_the_check_sees_a_planning_that_reads_the_key_count(
    fa4: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The comparison above can fail: an FA4 whose tile depended on max_seqlen_k is caught.
    real = fi._get_fwd_config

    def by_count(**kw: Any) -> Any:
        cfg = real(**kw)
        return dataclasses.replace(cfg, n_block_size=64) if kw["max_seqlen_k"] > 4096 else cfg

    monkeypatch.setattr(fi, "_get_fwd_config", by_count)
    c = {**draw(random.Random(SEED + 4)), "d": 128, "window": None}
    assert fa4_plan(fa4, c, 100, 90) != fa4_plan(fa4, c, 10000, 90)


def test_k_and_v_as_one_tensor_never_lend_their_slots_to_distinct_ones(fa4: Recorder) -> None:
    # A call with k is v is no plan (its arguments cannot say which is which), and a later
    # call of the same shapes with distinct k and v is a family of its own, planned by FA4.
    c = {**draw(random.Random(SEED + 5)), "d": 128}
    n, counted = _counted()

    q, k, _v, out, cu, used = tensors(fa4.mode, c, 40)  # type: ignore[attr-defined]
    same = (q, k, k, out, cu, used)
    for _ in range(2):
        launch.replay_or_plan(fi, counted, same, kwargs(c, same, 40))
    assert n["whole"] == 2  # never replayed
    t = tensors(fa4.mode, c, 41)  # type: ignore[attr-defined]
    launch.replay_or_plan(fi, counted, t, kwargs(c, t, 41))
    assert n["whole"] == 3  # planned: its own family
    t = tensors(fa4.mode, c, 42)  # type: ignore[attr-defined]
    fa4.calls.clear()
    launch.replay_or_plan(fi, counted, t, kwargs(c, t, 42))
    assert n["whole"] == 3
    ((_, args),) = fa4.calls
    assert plan._same_tensor(args[1], t[1]) and plan._same_tensor(args[2], t[2])


def test_a_tensor_off_the_alignment_grid_is_a_family_of_its_own(fa4: Recorder) -> None:
    # FA4 copies a q/k/v that is off its 16-byte grid (the copy is no plan); an aligned plan
    # is never replayed for a misaligned call.
    c = {**draw(random.Random(SEED + 6)), "d": 128, "tq": 1}
    n, counted = _counted()

    t = tensors(fa4.mode, c, 30)  # type: ignore[attr-defined]
    launch.replay_or_plan(fi, counted, t, kwargs(c, t, 30))
    with fa4.mode:  # type: ignore[attr-defined]
        wide = torch.empty(c["n"] * 31 * c["d"] + 1, dtype=c["dtype"], device="cuda")
        k = wide.as_strided((c["n"] * 31, 1, c["d"]), (c["d"], c["d"], 1), 1)  # 2 bytes off the grid
    t = (t[0], k, tensors(fa4.mode, c, 31)[2], *t[3:])  # type: ignore[attr-defined]
    launch.replay_or_plan(fi, counted, t, kwargs(c, t, 31))
    assert n["whole"] == 2
    assert sum(p is lp._NOT_PLANNED for p in lp._plans.values()) == 1  # FA4 copied k: no plan


def test_keys_and_values_of_other_counts_are_fa4s_to_refuse(fa4: Recorder) -> None:
    c = {**draw(random.Random(SEED + 7)), "d": 128}
    n, counted = _counted()
    t = tensors(fa4.mode, c, 20)  # type: ignore[attr-defined]
    launch.replay_or_plan(fi, counted, t, kwargs(c, t, 20))  # planned
    shorter_v = tensors(fa4.mode, c, 19)[2]  # type: ignore[attr-defined]
    t = (*t[:2], shorter_v, *t[3:])
    with pytest.raises(AssertionError):  # FA4's own check, not a replay reading past v
        launch.replay_or_plan(fi, counted, t, kwargs(c, t, 20))
    assert n["whole"] == 2


def test_a_family_is_not_planned_from_one_key_row(fa4: Recorder, monkeypatch: pytest.MonkeyPatch) -> None:
    # At one row torch calls any row stride contiguous: FA4's copy-or-not is unknown then.
    # Here the row stride (132 elements, off the 16-byte grid) makes FA4 copy k from two
    # rows on: no plan is ever made, and FA4 runs whole at every count.
    from flash_attn.cute import cute_dsl_utils as cu_utils

    def maybe_contiguous(t: Any, align_bytes: int = 16) -> Any:
        # FA4's own, with its .contiguous() as the same copy by clone (a fake CUDA tensor's
        # .contiguous() needs a CUDA torch outside the fake mode).
        copy = cu_utils.maybe_contiguous(t, align_bytes) if t is None or t.is_contiguous() else None
        if copy is not None or t is None:
            return copy
        if cu_utils._has_aligned_pointer(t, align_bytes) and cu_utils._is_aligned_layout(t, align_bytes):
            return t
        return t.clone(memory_format=torch.contiguous_format)

    monkeypatch.setattr(fi, "maybe_contiguous", maybe_contiguous)
    c = {**draw(random.Random(SEED + 8)), "d": 128, "n": 1, "tq": 1}
    n, counted = _counted()
    for rows in (1, 1, 9, 12):
        q, _k, v, out, cu, used = tensors(fa4.mode, c, rows)  # type: ignore[attr-defined]
        with fa4.mode:  # type: ignore[attr-defined]
            wide = torch.empty(rows * 132 + 128, dtype=c["dtype"], device="cuda")
            k = wide.as_strided((rows, 1, 128), (132, 128, 1))
        t = (q, k, v, out, cu, used)
        launch.replay_or_plan(fi, counted, t, kwargs(c, t, rows))
    assert n["whole"] == 4
    assert list(lp._plans.values()) == [lp._NOT_PLANNED]


def test_an_arch_whose_planning_was_not_checked_gets_no_plans(
    fa4: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(launch, "VERIFIED_ARCHS", frozenset())
    assert _plan_then(fa4, lambda: None) == 2


def test_fa4s_log_level_changed_at_run_time_is_planned_again(
    fa4: Recorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    level = fi.fa_logging.get_fa_log_level()
    assert _plan_then(fa4, lambda: monkeypatch.setattr(fi.fa_logging, "_fa_log_level", level + 1)) == 2


def test_an_observed_cache_is_unwrapped_for_other_threads(fa4: Recorder) -> None:
    seen = observe._Observed(fa4)
    assert observe.unobserved(seen) is fa4 and observe.unobserved(fa4) is fa4


# launch_replay(): the decode layer's entry, where the family stands in for a plain-tensor check
# before a replay (a plan is made only for plain tensors; type, device and grad are facts).


def _scalars(c: dict[str, Any]) -> tuple[Any, ...]:
    w = c["window"]
    return (c["tq"], c["scale"], c["causal"], c["softcap"], w, 0 if w is not None else None)


def _planned(fa4: Recorder) -> tuple[dict[str, Any], dict[str, int], Any]:
    c = {**draw(random.Random(SEED + 20)), "d": 128}
    n, counted = _counted()
    t = tensors(fa4.mode, c, 30)  # type: ignore[attr-defined]
    launch.replay_or_plan(fi, counted, t, kwargs(c, t, 30))  # a plan for fake tensors taken as plain
    assert any(type(p) is plan.Plan for p in lp._plans.values())
    return c, n, counted


@pytest.mark.parametrize("change", ["requires_grad", "device"])
def test_launch_does_not_replay_a_call_of_another_grad_flag_or_device(fa4: Recorder, change: str) -> None:
    c, n, counted = _planned(fa4)
    t = list(tensors(fa4.mode, c, 31))  # type: ignore[attr-defined]
    with fa4.mode:  # type: ignore[attr-defined]
        if change == "requires_grad":
            t[0] = t[0].detach().requires_grad_(True)
        else:
            t = [x.to("cuda:1") for x in t]
    with contextlib.suppress(Exception):  # FA4's own answer to such a call; only a replay is wrong
        launch.launch_replay(counted, tuple(t), _scalars(c), 31)
    assert n["whole"] == 2, "a plan of another family was replayed"


def test_a_tensor_subclass_is_a_family_of_its_own() -> None:
    class Sub(torch.Tensor):
        pass

    q = torch.zeros(2, 1, 4, 64, dtype=torch.float16)
    k = torch.zeros(20, 1, 64, dtype=torch.float16)
    t = (q, k, torch.zeros_like(k), torch.zeros_like(q), torch.zeros(3, dtype=torch.int32),
         torch.zeros(2, dtype=torch.int32))  # fmt: skip
    s = (1, 0.1, True, 0.0, None, None)
    assert plan.family(fi, t, s) != plan.family(fi, (q.as_subclass(Sub), *t[1:]), s)


def test_launch_never_plans_tensors_that_are_not_plain(fa4: Recorder) -> None:
    # Fake tensors outside their mode are not plain tensors: FA4 runs whole at every call.
    c = {**draw(random.Random(SEED + 21)), "d": 128}
    n, counted = _counted()
    for tk in (30, 31, 32):
        launch.launch_replay(counted, tensors(fa4.mode, c, tk), _scalars(c), tk)  # type: ignore[attr-defined]
    assert n["whole"] == 3 and not any(type(p) is plan.Plan for p in lp._plans.values())


def test_launch_does_not_replay_inside_a_fake_mode(fa4: Recorder) -> None:
    c, n, counted = _planned(fa4)
    t = tensors(fa4.mode, c, 31)  # type: ignore[attr-defined]
    with fa4.mode:  # type: ignore[attr-defined]
        launch.launch_replay(counted, t, _scalars(c), 31)
    assert n["whole"] == 2


def test_launch_replays_a_planned_family(fa4: Recorder) -> None:
    # The other side of the tests above: the same family at a new key count is replayed.
    c, n, counted = _planned(fa4)
    fa4.calls.clear()
    launch.launch_replay(counted, tensors(fa4.mode, c, 77), _scalars(c), 77)  # type: ignore[attr-defined]
    assert n["whole"] == 1 and len(fa4.calls) == 1
