"""``fa4cache warm``'s plan: its flags, a manifest, ``--hf-config`` or ``--replay`` (the specs
the store recorded) turned into one :class:`~fa4cache.aot.plan.WarmPlan`."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from typing import Any

from ..aot.plan import DEFAULT_ARCH, GenerationCall, WarmPlan, item_of_record
from ..errors import ConfigError
from .common import NoStoreYet, open_store, plural


def _specs_from_flags(args: argparse.Namespace) -> list[Any]:
    from fa4cache.aot.spec import KernelSpec

    heads, _, hkv = (args.heads or "16").partition(":")
    try:
        h = int(heads)
        h_kv = int(hkv) if hkv else None
    except ValueError:
        raise ConfigError(f"--heads: expected N or N:M, got {args.heads!r}") from None
    out = []
    for dtype in args.dtype or ["bf16"]:
        for hd in args.head_dim or [128]:
            for m in args.mask or ["document"]:
                mask = m
                if m == "document" and args.window:
                    mask = "document_window"
                if m == "document" and args.causal is False:
                    mask = "document_bidirectional"
                out.append(
                    KernelSpec(
                        dtype=dtype,
                        head_dim=hd,
                        heads=h,
                        heads_kv=h_kv,
                        mask=mask,
                        backward=args.backward,
                        seqlen=args.seqlen,
                        window=args.window or 256,
                        arch=args.arch or DEFAULT_ARCH,
                        varlen=args.varlen,
                    )
                )
    return out


@dataclass
class Replay:
    """What ``warm --replay`` found in the store's sidecars."""

    specs: list[Any] = field(default_factory=list)  # FA4 kernel specs for the arch asked for
    jit_calls: list[Any] = field(default_factory=list)  # QuACK / jit_cache calls, same arch
    generation: list[GenerationCall] = field(default_factory=list)  # warm --generation's calls
    other_archs: dict[str, int] = field(default_factory=dict)  # specs left out, by arch
    unreplayable: int = 0  # entries without a recorded spec (training calls, older warms)

    def notes(self) -> list[str]:
        """What was left out, each with the command that includes it."""
        notes = [
            f"left out {plural(n, 'spec')} for {arch}: run `fa4cache warm --replay --arch {arch}` for them"
            for arch, n in sorted(self.other_archs.items())
        ]
        if self.unreplayable:
            notes.append(
                f"{self.unreplayable} {'entry carries' if self.unreplayable == 1 else 'entries carry'} no "
                "replayable spec (compiled by training calls or by `warm --generation`, or by an older "
                "fa4cache): run the jobs or the warm that made them again"
            )
        return notes


def _norm_arch(arch: str) -> str:
    return arch.rstrip("a")


def _replay_specs(args: argparse.Namespace) -> Replay:
    from fa4cache.aot.jit_spec import JitCall

    # Every recorded spec, whatever its toolchain: what is already compiled for the
    # toolchain doing the warming shows as "present".
    rep = Replay()
    try:
        store = open_store(args)
    except NoStoreYet:
        return rep
    seen: dict[str, Any] = {}
    for e in store.entries():
        side = store.read_sidecar(e.ref)
        try:
            item = item_of_record(side.spec if side else None)
        except (ConfigError, ValueError):  # no spec (None), or one this version cannot read
            rep.unreplayable += 1
            continue
        seen[json.dumps([type(item).__name__, item.to_dict()], sort_keys=True)] = item
    archs = sorted({_norm_arch(i.arch) for i in seen.values()})
    want = _norm_arch(args.arch) if args.arch else None
    if want is None and len(archs) > 1:
        raise ConfigError(
            f"the store holds specs for {', '.join(archs)}: one target arch per run (FA4 reads it at "
            f"import); run {' then '.join(f'`fa4cache warm --replay --arch {a}`' for a in archs)}"
        )
    for item in seen.values():
        arch = _norm_arch(item.arch)
        if want is not None and arch != want:
            rep.other_archs[arch] = rep.other_archs.get(arch, 0) + 1
        elif isinstance(item, GenerationCall):
            rep.generation.append(item)
        elif isinstance(item, JitCall):
            rep.jit_calls.append(item)
        else:
            rep.specs.append(item)
    return rep


def plan_from_args(args: argparse.Namespace) -> tuple[WarmPlan, Replay | None]:
    """The plan ``args`` ask for, and what --replay found (None without it)."""
    from fa4cache.aot.spec import load_manifest

    from .warm_jit import calls_from_args  # QuACK / jit_cache kernels (fa4cache.aot.jit_spec)

    rep = None
    generation: list[GenerationCall] = []
    if args.replay:
        rep = _replay_specs(args)
        specs, jit_calls, generation = rep.specs, rep.jit_calls, rep.generation
    else:
        if args.manifest:
            specs = load_manifest(args.manifest)
        elif args.hf_config:
            from fa4cache.aot.model_config import load_config, specs_for

            arch = args.arch or DEFAULT_ARCH
            cfg = load_config(args.hf_config)
            specs = specs_for(cfg, dtypes=args.dtype, backward=args.backward, arch=arch)
            if getattr(args, "generation", False) and specs:
                generation = GenerationCall.for_model(cfg, sorted({s.dtype for s in specs}), arch)
        else:
            specs = _specs_from_flags(args)
        jit_calls = calls_from_args(args)
    return WarmPlan.of([*jit_calls, *specs, *generation]), rep
