"""`mtrl env list`: the environments the registry knows, each with its one-line summary, the
parameters it takes (spec.rollout.environmentArgs), its reward components (spec.reward) and
whether it makes its own tasks (spec.dataset.generated)."""

from __future__ import annotations

import argparse
import inspect
import sys
from collections.abc import Sequence

from mtrl_worker.environments.base import Environment
from mtrl_worker.environments.registry import available, environment_class


def summary(cls: type[Environment]) -> str:
    """The first line of the environment's module docstring (its class's when it has none)."""
    doc = sys.modules[cls.__module__].__doc__ or cls.__doc__ or ""
    return doc.strip().splitlines()[0] if doc.strip() else "(no description)"


def parameters(cls: type[Environment]) -> list[str]:
    """`name=default` (or `name`, when it has none) of each keyword the class takes."""
    out = []
    for name, p in inspect.signature(cls).parameters.items():
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
            out.append(name if p.default is p.empty else f"{name}={p.default!r}")
    return out


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
