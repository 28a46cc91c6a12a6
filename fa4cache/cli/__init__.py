"""``fa4cache``: inspect and maintain a kernel store from the shell.

Every command except ``warm`` and ``doctor`` works from files alone: no torch,
cutlass, FA4 or Ray import, so ``fa4cache stats`` answers in milliseconds.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from ..aot.spec import MASKS
from ..arch import ARCHS
from ..errors import Fa4CacheError
from ..version import version
from . import warm_jit
from .bundle import add_bundle_parser
from .doctor import cmd_doctor, cmd_env
from .store_commands import cmd_clear, cmd_ls, cmd_prune, cmd_stats, cmd_verify
from .warm import cmd_warm

log = logging.getLogger(__name__)


CACHE_DIR_HELP = "store directory (default: $FA4CACHE_DIR or ~/.cache/fa4cache)"
VERBOSE_HELP = "log what happens (level info; FA4CACHE_LOG_LEVEL=debug for more)"
QUIET_HELP = "log errors only; no progress bar"
NAMED_NO_STORE = "2 bad input, or a path you named (--cache-dir, FA4CACHE_DIR) that holds no store"
REMOVAL_EXIT = (
    "exit status: 0 done (--dry-run: listed); 1 an entry was skipped (another process holds its "
    "key) or could not be removed, or the confirmation was answered no (nothing removed; as "
    "apt-get's abort); " + NAMED_NO_STORE + ", or a confirmation needed without a terminal (pass --yes)"
)
REMOVAL_JSON_HELP = (
    "print what was (with --dry-run: would be) removed and what remains as JSON: removed "
    "[{kind, digest, toolchain, size}], removed_bytes, removed_toolchains, temp_files, remaining, "
    "remaining_bytes, skipped, failed"
)


def _common_options() -> argparse.ArgumentParser:
    """Options every subcommand also takes after its name (``fa4cache stats --cache-dir X``),
    as pip and huggingface-cli do. SUPPRESS: an option given before the subcommand is not
    overwritten by the subcommand's unset default."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--cache-dir", default=argparse.SUPPRESS, help=CACHE_DIR_HELP)
    common.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help=VERBOSE_HELP)
    common.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help=QUIET_HELP)
    return common


class _SubParsers(argparse._SubParsersAction):  # type: ignore[type-arg]
    """Every subcommand (bundle's too) gets the common options."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        kwargs.setdefault("parents", [_common_options()])
        parser: argparse.ArgumentParser = super().add_parser(name, **kwargs)
        parser.register("action", "parsers", _SubParsers)
        return parser


class _Version(argparse.Action):
    """``--version``: the build's version is computed (git, in a checkout) only when asked,
    and so is the FA4 release and whether fa4cache was verified on it (it walks FA4's sources)."""

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        from ..fa4_releases import installed

        print(f"fa4cache {version()}; {installed().describe()}")
        parser.exit()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fa4cache", description="FlashAttention-4 kernel cache")
    p.register("action", "parsers", _SubParsers)
    p.add_argument(
        "--version",
        action=_Version,
        nargs=0,
        help="show the version (the build's, in a checkout) and the FA4 release, and exit",
    )
    p.add_argument("--cache-dir", help=CACHE_DIR_HELP)
    p.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)
    p.add_argument("-q", "--quiet", action="store_true", help=QUIET_HELP)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser(
        "stats",
        help="entries, hits, misses, compile time spent and saved",
        epilog=f"exit status: 0 shown; {NAMED_NO_STORE}",
    )
    s.add_argument("--json", action="store_true", help="print the numbers as JSON (schema: docs/cli.md)")
    s.add_argument("--zero", action="store_true", help="reset the counters (entries are kept)")
    s.set_defaults(func=cmd_stats)

    s = sub.add_parser("ls", help="one line per entry", epilog=f"exit status: 0 listed; {NAMED_NO_STORE}")
    s.add_argument(
        "--kind", help="only entries of this kernel kind (fwd, bwd, ...: the kinds the store holds)"
    )
    s.add_argument("--json", action="store_true", help="print the entries as a JSON list")
    s.set_defaults(func=cmd_ls)

    s = sub.add_parser(
        "verify",
        help="check every entry's checksum and sidecar",
        epilog="exit status: 0 every entry ok (with --rebuild: every rebuilt entry identical); 1 a bad "
        "entry, a repair that failed, a rebuilt entry that differs, nothing rebuilt, or (--rebuild "
        f"without N) an entry not rebuilt; {NAMED_NO_STORE}",
    )
    s.add_argument("--repair", action="store_true", help="quarantine bad entries")
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    s.add_argument(
        "--rebuild",
        nargs="?",
        type=int,
        const=0,
        metavar="N",
        help="also compile the entries of N recorded specs (default all) again on this machine and "
        "compare the bytes (entries fa4cache warm made; minutes per spec on the CPU); exit 1 if one "
        "differs, or if nothing was rebuilt (no entries, none with a recorded spec, every rebuild "
        "failed); without N, an entry that cannot be rebuilt also fails the check",
    )
    s.set_defaults(func=cmd_verify)

    s = sub.add_parser("prune", help="evict entries (LRU, age, stale toolchains)", epilog=REMOVAL_EXIT)
    s.add_argument(
        "--max-size",
        metavar="SIZE",
        help="evict least recently used entries until the store fits; a unit is required "
        "(B, K, M, G, T: e.g. 20G, 500M)",
    )
    s.add_argument(
        "--older-than",
        metavar="AGE",
        help="evict entries unused for this long; a unit is required (s, m, h, d, w: e.g. 30d, 12h)",
    )
    s.add_argument(
        "--fingerprint", help="'stale': entries of toolchains no process has used for --stale-after"
    )
    s.add_argument(
        "--stale-after", metavar="AGE", help="with --fingerprint stale: unused for this long (default 1d)"
    )
    s.add_argument(
        "--yes",
        action="store_true",
        help="do not ask for confirmation (asked on a terminal when the run would remove more than "
        "half of the store's entries or bytes, where no removes nothing and exits 1; refused "
        "without a terminal, exit 2)",
    )
    s.add_argument(
        "-n", "--dry-run", action="store_true", help="list what the same run would remove; remove nothing"
    )
    s.add_argument("--json", action="store_true", help=REMOVAL_JSON_HELP)
    s.set_defaults(func=cmd_prune)

    s = sub.add_parser("clear", help="remove every entry", epilog=REMOVAL_EXIT)
    s.add_argument("--all", action="store_true", help="also counters and quarantine")
    s.add_argument(
        "--yes",
        action="store_true",
        help="do not ask for confirmation (asked on a terminal, where no removes nothing and exits 1; "
        "refused without a terminal, exit 2)",
    )
    s.add_argument("-n", "--dry-run", action="store_true", help="list what would be removed; remove nothing")
    s.add_argument("--json", action="store_true", help=REMOVAL_JSON_HELP)
    s.set_defaults(func=cmd_clear)

    s = sub.add_parser("warm", help="compile kernel sets ahead of time, without a GPU")
    s.add_argument("--dtype", action="append", choices=["bf16", "fp16"], help="(repeatable; default bf16)")
    s.add_argument(
        "--head-dim", action="append", type=int, help="64, 96, 128, 192 or 256 (repeatable; default 128)"
    )
    s.add_argument("--heads", help="query heads, or Q:KV for GQA (default 16)")
    s.add_argument(
        "--mask",
        action="append",
        choices=MASKS,
        metavar="MASK",
        help=f"{', '.join(MASKS)} (repeatable; default document)",
    )
    s.add_argument(
        "--causal",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="document masks: causal inside documents",
    )
    s.add_argument("--window", type=int, help="document masks: a sliding window of this many earlier keys")
    s.add_argument(
        "--backward",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also compile the backward kernels",
    )
    s.add_argument(
        "--seqlen",
        type=int,
        default=1024,
        help="length of the representative call (kernels serve every length)",
    )
    s.add_argument(
        "--varlen", action="store_true", help="document masks: the kernels fa4cache.attention runs"
    )
    s.add_argument(
        "--arch",
        choices=ARCHS,
        help="target GPU arch to cross-compile for (default sm_90: H100/H200; with --replay: "
        "the arch of the recorded specs, which must then be one)",
    )
    s.add_argument("--manifest", help="a JSON list of kernel specs (fields as in KernelSpec)")
    s.add_argument(
        "--hf-config",
        metavar="PATH",
        help="a transformers model's config.json (or its directory): the kernels its "
        'attn_implementation="fa4cache" runs',
    )
    s.add_argument(
        "--generation",
        action="store_true",
        help="with --hf-config: also the kernels of generation (KV-cache and continuous-batching steps)",
    )
    s.add_argument(
        "--replay",
        action="store_true",
        help="compile every spec recorded in the store (e.g. after an upgrade)",
    )
    s.add_argument(
        "-j",
        "--jobs",
        type=int,
        help="worker processes, each compiling one kernel at a time "
        "(default: as many as CPU cores and kernels; 1: in this process)",
    )
    s.add_argument(
        "--json",
        action="store_true",
        help="print a JSON summary on stdout (target, specs [{spec, label, compiles, present, "
        "compile_seconds, seconds, error}], jit, generation, notes, failed); the tables go to stderr",
    )
    warm_jit.add_arguments(s)
    s.set_defaults(func=cmd_warm)

    s = sub.add_parser("env", help="environment to export for a job")
    s.add_argument(
        "--shell", action="store_true", help='as export lines for a shell (eval "$(fa4cache env --shell)")'
    )
    s.set_defaults(func=cmd_env)

    s = sub.add_parser(
        "doctor", help="check versions, GPU, directory, filesystem, locks (exit 1 when a check fails)"
    )
    s.add_argument(
        "--json",
        action="store_true",
        help="print the checks as JSON: ok, failed, checks [{status, check, detail}]",
    )
    s.set_defaults(func=cmd_doctor)
    add_bundle_parser(sub)
    return p


def commands(parser: argparse.ArgumentParser | None = None) -> dict[str, argparse.ArgumentParser]:
    """Every command's parser by its name (``stats``, ``bundle export``, ...), in the
    parser's order; a command with subcommands is listed with them, not alone."""
    out: dict[str, argparse.ArgumentParser] = {}

    def walk(p: argparse.ArgumentParser, prefix: str) -> None:
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, sp in a.choices.items():
                    full = f"{prefix} {name}".strip()
                    if any(isinstance(x, argparse._SubParsersAction) for x in sp._actions):
                        walk(sp, full)
                    else:
                        out[full] = sp

    walk(parser or build_parser(), "")
    return out


COMMON = ("cache_dir", "verbose", "quiet")  # what every command takes (_common_options)


def options(p: argparse.ArgumentParser, *, common: bool = True) -> list[argparse.Action]:
    """``p``'s documented flags and arguments: not help, not hidden (``SUPPRESS``);
    ``common=False``: without the options every command takes."""
    return [
        a
        for a in p._actions
        if not isinstance(a, argparse._HelpAction)
        and a.help != argparse.SUPPRESS
        and (common or a.dest not in COMMON)
    ]


def markdown_reference() -> str:
    """The CLI reference (``docs/cli.md``'s, at every site build): per command its usage and
    a table of its flags and arguments with their help, from the parser itself."""
    lines = [
        "Every command also takes `--cache-dir DIR`, `-v` (`--verbose`) and `-q` (`--quiet`), "
        "before or after its name ([logging](#logging)).",
        "",
    ]
    for name, p in commands().items():
        usage = " ".join(p.format_usage().split()).removeprefix("usage: ")
        lines += [f"### fa4cache {name}", "", f"`{usage}`", "", "| flag | what it does |", "|---|---|"]
        for a in options(p, common=False):
            flag = ", ".join(a.option_strings) or (a.metavar or a.dest)
            if a.option_strings and a.nargs != 0 and not isinstance(a, argparse.BooleanOptionalAction):
                flag += f" {a.metavar or a.dest.upper()}"
            help_text = (a.help or "").replace("|", "\\|").replace("%%", "%")
            if a.choices and "choices" not in help_text and not isinstance(a, argparse._SubParsersAction):
                help_text += f" (one of: {', '.join(map(str, a.choices))})"
            lines.append(f"| `{flag}` | {help_text} |")
        lines.append("")
        if p.epilog:
            lines += [p.epilog[0].upper() + p.epilog[1:] + ".", ""]
    return "\n".join(lines)


def _configure_logging(args: argparse.Namespace) -> None:
    """Records go to stderr as bare messages; the level is -v (info) or -q (error), else
    FA4CACHE_LOG_LEVEL, else warning. A bad FA4CACHE_LOG_LEVEL is a ConfigError here (exit 2):
    on the command line a typo is said, not skipped."""
    from ..settings import setting

    level = "info" if args.verbose else "error" if args.quiet else None
    if level is None:
        try:
            level = setting("FA4CACHE_LOG_LEVEL") or "warning"
        except Fa4CacheError as e:
            print(f"fa4cache: {e}", file=sys.stderr)
            raise SystemExit(2) from None
    logging.basicConfig(level=level.upper(), format="%(message)s", force=True)
    logging.getLogger("fa4cache").setLevel(level.upper())
    logging.getLogger("fa4cache").propagate = True
    for h in list(logging.getLogger("fa4cache").handlers):  # the root handler shows them
        logging.getLogger("fa4cache").removeHandler(h)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.verbose and args.quiet:
        parser.error("-v/--verbose and -q/--quiet: give one")
    _configure_logging(args)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # `fa4cache stats | head`: the reader left; not an error worth a message.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (Fa4CacheError, OSError, ValueError) as e:
        # One prefix: a message that already names the command is not prefixed twice.
        msg = str(e).removeprefix(f"{args.command}: ")
        print(f"fa4cache {args.command}: {msg}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
