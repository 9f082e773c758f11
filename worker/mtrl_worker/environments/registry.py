"""Find environments by name: entry points in group `mtrl.environments`, then the built-ins.

Third-party packages register `name = "package.module:EnvironmentClass"` in that group. The
built-in table keeps the shipped environments available before the package's own entry points
are installed (e.g. running from a source checkout).
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from mtrl_worker.environments.base import Environment

GROUP = "mtrl.environments"

BUILTIN = {
    "wordle": "mtrl_worker.environments.wordle:WordleEnvironment",
    "coding": "mtrl_worker.environments.coding:CodingEnvironment",
    "target": "mtrl_worker.environments.target:TargetEnvironment",
    "guess": "mtrl_worker.environments.guess:GuessEnvironment",
}


class UnknownEnvironment(LookupError):
    pass


def available() -> list[str]:
    return sorted(set(BUILTIN) | {ep.name for ep in entry_points(group=GROUP)})


def environment_class(name: str) -> type[Environment]:
    found = [ep for ep in entry_points(group=GROUP) if ep.name == name]
    if found:
        cls = found[0].load()
    elif name in BUILTIN:
        module, _, attr = BUILTIN[name].partition(":")
        cls = getattr(importlib.import_module(module), attr)
    else:
        raise UnknownEnvironment(f"unknown environment {name!r}; available: {available()}")
    if not (isinstance(cls, type) and issubclass(cls, Environment)):
        raise TypeError(f"{name!r} resolves to {cls!r}, not an Environment subclass")
    return cls


def load_environment(name: str, args: dict[str, Any] | None = None) -> Environment:
    return environment_class(name)(**(args or {}))
