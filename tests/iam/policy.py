"""A small IAM policy evaluator for the subset the project's policies use.

Supported: Allow and Deny statements; Action and Resource as a string or list, with `*` and `?`
wildcards (actions case-insensitive, resources case-sensitive, as in IAM); Condition with
StringEquals, StringLike, ArnEquals and ArnLike, where a key missing from the request makes the
condition false. Anything else (NotAction, NotResource, other operators, Principal) raises, so
a policy never passes this check by using grammar the checker silently ignores.
"""

from __future__ import annotations

import functools
import importlib.util
import re
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

from tests.iam.calls import Permission

IAM_DIR = Path(__file__).resolve().parents[2] / "manifests" / "iam"
POLICY_FILES = ("operator-policy.json", "worker-policy.json", "trainer-policy.json")
STATEMENT_KEYS = {"Sid", "Effect", "Action", "Resource", "Condition"}
_EXACT = {"StringEquals", "ArnEquals"}
_LIKE = {"StringLike", "ArnLike"}


class UnsupportedGrammar(ValueError):
    pass


def renderer() -> ModuleType:
    """manifests/iam/render.py, the renderer users run (not a package, so loaded by path)."""
    spec = importlib.util.spec_from_file_location("mtrl_iam_render", IAM_DIR / "render.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rendered(file: str, values: dict[str, str]) -> dict[str, Any]:
    return renderer().render((IAM_DIR / file).read_text(), values)


@functools.lru_cache(maxsize=1024)
def _glob(pattern: str, ignore_case: bool) -> re.Pattern[str]:
    body = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.compile(body, re.DOTALL | (re.IGNORECASE if ignore_case else 0))


def _listed(value: str | list[str]) -> list[str]:
    return [value] if isinstance(value, str) else list(value)


def _any_match(patterns: Iterable[str], value: str, ignore_case: bool = False) -> bool:
    return any(_glob(p, ignore_case).fullmatch(value) for p in patterns)


def _condition_holds(condition: dict[str, dict[str, Any]], context: dict[str, str]) -> bool:
    for operator, keys in condition.items():
        if operator not in _EXACT | _LIKE:
            raise UnsupportedGrammar(f"condition operator {operator}")
        for key, expected in keys.items():
            actual = context.get(key.lower())
            if actual is None:
                return False
            wanted = _listed(expected)
            if operator in _EXACT and actual not in wanted:
                return False
            if operator in _LIKE and not _any_match(wanted, actual):
                return False
    return True


def _applies(statement: dict[str, Any], permission: Permission) -> bool:
    unsupported = set(statement) - STATEMENT_KEYS
    if unsupported:
        raise UnsupportedGrammar(f"statement keys {sorted(unsupported)}")
    context = {k.lower(): v for k, v in permission.context}
    return (_any_match(_listed(statement["Action"]), permission.action, ignore_case=True)
            and _any_match(_listed(statement["Resource"]), permission.resource)
            and _condition_holds(statement.get("Condition", {}), context))


def allows(policy: dict[str, Any], permission: Permission) -> bool:
    """IAM's rule for one identity policy: an explicit Deny wins, then any Allow, else deny."""
    matching = [s["Effect"] for s in policy["Statement"] if _applies(s, permission)]
    return "Allow" in matching and "Deny" not in matching


def denied(policy: dict[str, Any], permissions: Iterable[Permission]) -> list[Permission]:
    """The distinct permissions the policy does not grant, in first-seen order."""
    return [p for p in dict.fromkeys(permissions) if not allows(policy, p)]


def without_action(policy: dict[str, Any], action: str) -> dict[str, Any]:
    """A copy of the policy with `action` removed from every statement (and statements left
    with no action dropped)."""
    statements = []
    for statement in policy["Statement"]:
        actions = [a for a in _listed(statement["Action"]) if a.lower() != action.lower()]
        if actions:
            statements.append({**statement, "Action": actions})
    return {**policy, "Statement": statements}
