"""The environment catalog: what each environment of the default worker image takes, as data.

The worker's environments declare their arguments (`spec.rollout.environmentArgs`), their
task fields, their reward components and whether they make their own tasks; `mtrl crds`
writes those declarations into `environments.json` beside this module (a test fails when it is
stale). The operator and the trainer read that file instead of importing the worker, so an
operator-only install checks the same things, and the worker converts its arguments with the
same `Parameter.convert`: what the operator refuses is exactly what the worker would refuse.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any, Literal

from pydantic import Field

from mtrl_api.base import ApiModel

CATALOG_FILE = "environments.json"

Scalar = int | float | bool | str


def _spoken(value: Scalar) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


class Parameter(ApiModel):
    """One environment argument: a string in the run's spec, converted to its type."""

    name: str
    type: Literal["int", "float", "bool", "str"]
    default: Scalar | None = None
    doc: str = ""
    minimum: float | None = None
    maximum: float | None = None
    choices: list[str] = Field(default_factory=list)
    below_when: dict[str, dict[str, float]] = Field(default_factory=dict)
    """Bounds that hang on another argument: {that argument: {its value: this one must be
    below}} (guess: a turn's consistency reward, for each number of guesses)."""

    def convert(self, raw: Any) -> Scalar:
        """The value the environment gets, or ValueError naming the argument and what it
        takes (spec.rollout.environmentArgs are strings; a value of the type passes too)."""
        text = str(raw).strip()
        value: Scalar
        try:
            if self.type == "int":
                value = int(text)
            elif self.type == "float":
                value = float(text)
            elif self.type == "bool":
                if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(text)
                value = text.lower() in ("true", "1", "yes")
            else:
                value = str(raw)
        except ValueError:
            raise ValueError(f"{self.name} must be {self.expects()}, not {raw!r}") from None
        if self.choices and str(value) not in self.choices:
            raise ValueError(f"{self.name} must be {self.expects()}, not {raw!r}")
        if isinstance(value, int | float) and not isinstance(value, bool) and (
                (self.minimum is not None and value < self.minimum)
                or (self.maximum is not None and value > self.maximum)):
            raise ValueError(f"{self.name} must be {self.expects()}, not {raw!r}")
        return value

    def expects(self) -> str:
        """What the argument takes, in words: "an integer from 1 to 16"."""
        if self.choices:
            return f"one of {', '.join(self.choices)}"
        kind = {"int": "an integer", "float": "a number", "bool": "true or false",
                "str": "a string"}[self.type]
        low, high = self.minimum, self.maximum
        if low is not None and high is not None:
            return f"{kind} from {_spoken(low)} to {_spoken(high)}"
        if low is not None:
            return f"{kind} of at least {_spoken(low)}"
        if high is not None:
            return f"{kind} of at most {_spoken(high)}"
        return kind


def bound_problems(parameters: Sequence[Parameter], values: Mapping[str, Any]) -> list[str]:
    """Why converted `values` (each argument given or defaulted) break a bound that hangs on
    another argument (`Parameter.below_when`)."""
    out = []
    for p in parameters:
        for other, bounds in p.below_when.items():
            if p.name not in values or other not in values:
                continue
            bound = bounds.get(str(values[other]))
            if bound is not None and not values[p.name] < bound:
                out.append(f"{p.name} must be below {bound:.6g} when {other} is "
                           f"{_spoken(values[other])}, not {_spoken(values[p.name])}")
    return out


class TaskField(ApiModel):
    """One field of a task row (a line of the dataset, or an inline task)."""

    name: str
    type: Literal["int", "str"] = "str"
    doc: str = ""
    required: bool = False
    pattern: str | None = None
    """A regular expression the whole value must match (type str)."""
    choices: list[str] = Field(default_factory=list)
    minimum: int | None = None

    def problem(self, value: Any) -> str | None:
        """Why the environment would refuse this value, or None."""
        if self.type == "int":
            try:
                number = int(str(value).strip())
            except ValueError:
                return f"{self.name} must be an integer, not {value!r}"
            if self.minimum is not None and number < self.minimum:
                return f"{self.name} must be at least {self.minimum}, not {value!r}"
            return None
        text = str(value)
        if self.choices and text.strip() not in self.choices:
            return f"{self.name} must be one of {', '.join(self.choices)}, not {value!r}"
        if self.pattern is not None and re.fullmatch(self.pattern, text) is None:
            return f"{self.name} {value!r} does not match {self.pattern}"
        return None


class ComponentInfo(ApiModel):
    name: str
    kind: str
    weight: float
    low: float
    high: float
    doc: str = ""


class EnvironmentInfo(ApiModel):
    name: str
    summary: str = ""
    parameters: list[Parameter] | None = None
    """None: the environment declares no arguments, and any are passed on unchecked."""
    components: list[ComponentInfo] = Field(default_factory=list)
    generates_tasks: bool = False
    task_fields: list[TaskField] | None = None
    """None: the environment declares no task schema, and tasks are not checked."""
    exactly_one_of: list[list[str]] = Field(default_factory=list)
    """Groups of task fields of which a task sets exactly one."""

    def argument_problems(self, args: Mapping[str, Any]) -> list[str]:
        """Why the environment would refuse these arguments: unknown names, values it cannot
        take, alone or beside another. Empty when it declares none (nothing is known to
        check)."""
        if self.parameters is None:
            return []
        declared = {p.name: p for p in self.parameters}
        values = {p.name: p.default for p in self.parameters if p.default is not None}
        out = []
        for name, raw in args.items():
            if name not in declared:
                out.append(f"{name!r} is not an argument of environment {self.name!r} (it "
                           f"takes: {', '.join(declared) or 'none'})")
                continue
            try:
                values[name] = declared[name].convert(raw)
            except ValueError as exc:
                out.append(str(exc))
        return out or bound_problems(self.parameters, values)

    def task_problem(self, task: Mapping[str, Any]) -> str | None:
        """Why the environment would refuse this task row, or None (also when it declares
        no task schema)."""
        if self.task_fields is None:
            return None
        present = {k for k, v in task.items() if v is not None}
        for group in self.exactly_one_of:
            if len(present & set(group)) != 1:
                return f"a {self.name} task sets exactly one of {' and '.join(group)}"
        for f in self.task_fields:
            if f.name not in present:
                if f.required:
                    return f"a {self.name} task needs the field {f.name!r}"
                continue
            if (problem := f.problem(task[f.name])) is not None:
                return problem
        return None


class Catalog(ApiModel):
    environments: list[EnvironmentInfo] = Field(default_factory=list)


@functools.cache
def catalog() -> dict[str, EnvironmentInfo]:
    """The environments the default worker image provides, by name."""
    text = resources.files(__package__).joinpath(CATALOG_FILE).read_text()
    return {e.name: e for e in Catalog.model_validate(json.loads(text)).environments}


def known(name: str) -> EnvironmentInfo | None:
    """A catalogued environment, or None for one only a custom worker image has."""
    return catalog().get(name)
