"""`mtrl`: one command for the operator, its CRDs, the data plane and the local demo.

Subcommands import their module lazily, so `mtrl crds` never loads torch and `mtrl operator`
never loads an environment plug-in.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path


def _crds(args: argparse.Namespace) -> int:
    from mtrl_operator.api import crdgen

    if args.check:
        stale = crdgen.stale(args.out)
        for name in stale:
            print(f"stale: {args.out / name} (run `mtrl crds`)", file=sys.stderr)
        return 1 if stale else 0
    for path in crdgen.write(args.out):
        print(f"wrote {path}")
    return 0


def _delegate(target: str) -> Callable[[argparse.Namespace], int]:
    """Hand the remaining arguments to `module:function(argv) -> int`."""

    def run(args: argparse.Namespace) -> int:
        import importlib

        module, func = target.split(":")
        return int(getattr(importlib.import_module(module), func)(args.rest) or 0)

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="mtrl", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    crds = sub.add_parser("crds", help="write the CRDs generated from the API models")
    crds.add_argument("--out", type=Path, default=Path("crds"))
    crds.add_argument("--check", action="store_true", help="exit 1 if crds/ is stale")
    crds.set_defaults(func=_crds)

    for name, target, text in (
        ("operator", "mtrl_operator.main:main", "run the operator (kopf)"),
        ("worker", "mtrl_worker.__main__:main", "run a reward worker"),
        ("env", "mtrl_worker.play:env_main", "environment tools: `mtrl env play wordle ...`"),
        ("trainer", "mtrl_trainer.__main__:main", "run the reference GRPO+LoRA trainer"),
        ("cluster", "mtrl_testbed.__main__:main", "local control plane: up | down | moto"),
    ):
        p = sub.add_parser(name, help=text, add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=_delegate(target))

    args = parser.parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
