"""`mtrl env list`: the environments the registry knows, each with its one-line summary, the
parameters it takes (spec.rollout.environmentArgs), its reward components (spec.reward) and
whether it makes its own tasks (spec.dataset.generated). `build` is the same as data: the
catalog `mtrl crds` writes into mtrl_api for the operator and the trainer."""

from __future__ import annotations

import argparse
import inspect
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from mtrl_api.environments import CATALOG_FILE, Catalog, ComponentInfo, EnvironmentInfo
from mtrl_worker.environments.base import Environment
from mtrl_worker.environments.registry import BUILTIN, available, environment_class


def summary(cls: type[Environment]) -> str:
    """The first line of the environment's module docstring (its class's when it has none)."""
    doc = sys.modules[cls.__module__].__doc__ or cls.__doc__ or ""
    return doc.strip().splitlines()[0] if doc.strip() else "(no description)"


def parameters(cls: type[Environment]) -> list[str]:
    """`name=default` (or `name`, when it has none) of each keyword the class takes, with
    what it takes where the class declares it."""
    declared = {p.name: p for p in cls.parameters or ()}
    out = []
    for name, p in inspect.signature(cls).parameters.items():
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            text = name if p.default is p.empty else f"{name}={p.default!r}"
            out.append(f"{text} ({declared[name].expects()})" if name in declared else text)
    return out


def info(name: str, cls: type[Environment]) -> EnvironmentInfo:
    """What the class declares, as catalog data."""
    return EnvironmentInfo(
        name=name, summary=summary(cls),
        parameters=list(cls.parameters) if cls.parameters is not None else None,
        components=[ComponentInfo(name=c.name, kind=c.kind, weight=c.weight, low=c.low,
                                  high=c.high, doc=c.doc) for c in cls.components],
        generates_tasks=cls.generate_tasks(1, "train") is not None,
        task_fields=list(cls.task_fields) if cls.task_fields is not None else None,
        exactly_one_of=[list(group) for group in cls.exactly_one_of])


def build() -> Catalog:
    """The catalog of the environments the default worker image ships (the built-ins)."""
    return Catalog(environments=[info(name, environment_class(name)) for name in sorted(BUILTIN)])


def render() -> str:
    return json.dumps(build().wire(), indent=2, sort_keys=True) + "\n"


CATALOG_PATH = Path(__file__).resolve().parents[2] / "api" / "mtrl_api" / CATALOG_FILE


def describe(name: str, cls: type[Environment]) -> list[str]:
    lines = [f"{name}: {summary(cls)}",
             f"  parameters: {', '.join(parameters(cls)) or 'none'}",
             f"  generates tasks: {'yes' if cls.generate_tasks(1, 'train') is not None else 'no'}",
             "  reward components (name, kind, default weight, range):"]
    ranges = {c.name: f"[{c.low:g}, {c.high:g}]" for c in cls.components}
    width = max((len(c.name) for c in cls.components), default=0)
    span = max((len(r) for r in ranges.values()), default=0)
    for c in cls.components:
        lines.append(f"    {c.name:<{width}}  {c.kind:<9}  {c.weight:>5g}  "
                     f"{ranges[c.name]:<{span}}  {c.doc}")
    return lines


def list_main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser(prog="mtrl env list", description=__doc__.splitlines()[0]) \
        .parse_args(argv)
    blocks = []
    for name in available():
        try:
            cls = environment_class(name)
        except Exception as exc:  # a broken plug-in must not hide the others
            blocks.append([f"{name}: unavailable: {exc}"])
            continue
        blocks.append(describe(name, cls))
    print("\n\n".join("\n".join(block) for block in blocks))
    return 0


def catalog_main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="mtrl env catalog", description="Write the environment catalog the operator and "
        f"the trainer read ({CATALOG_PATH.relative_to(CATALOG_PATH.parents[2])}).")
    parser.add_argument("--check", action="store_true", help="exit 1 if it is stale")
    args = parser.parse_args(argv)
    fresh = CATALOG_PATH.exists() and CATALOG_PATH.read_text() == render()
    if args.check:
        if not fresh:
            print(f"stale: {CATALOG_PATH} (run `mtrl env catalog`)", file=sys.stderr)
        return 0 if fresh else 1
    if not fresh:
        CATALOG_PATH.write_text(render())
        print(f"wrote {CATALOG_PATH}")
    return 0
