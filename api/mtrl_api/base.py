"""Shared pydantic configuration and CRD schema annotations.

Every API model derives from `ApiModel`: camelCase on the wire, snake_case in Python, unknown
fields ignored on read (the API server has already pruned them against the CRD schema).
`rules()` and `list_map()` attach Kubernetes-only schema keywords that pydantic has no words
for; the CRD generator (`mtrl_api.crdgen`) turns them into
`x-kubernetes-validations` and `x-kubernetes-list-*`.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

RULES_KEY = "x-kubernetes-validations"


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        use_attribute_docstrings=True,
        validate_default=True,
    )

    def wire(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase, unset optionals omitted."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


def rule(expr: str, message: str, field_path: str | None = None, reason: str | None = None,
         transition: bool = False) -> dict[str, Any]:
    """One CEL validation rule.

    `transition=True` marks a rule that uses `oldSelf`; the generator checks that only such
    rules reference it, so a typo cannot silently turn a rule into a no-op on create.
    """
    out: dict[str, Any] = {"rule": expr, "message": message}
    if field_path:
        out["fieldPath"] = field_path
    if reason:
        out["reason"] = reason
    if transition != ("oldSelf" in expr):
        raise ValueError(f"rule {expr!r}: transition={transition} disagrees with its use of oldSelf")
    return out


def rules(*items: dict[str, Any]) -> dict[str, Any]:
    """`json_schema_extra` carrying CEL rules for a model or a field."""
    return {RULES_KEY: list(items)}


def list_map(*keys: str) -> dict[str, Any]:
    """`json_schema_extra` for a list merged by key under server-side apply."""
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(keys)}


def list_set() -> dict[str, Any]:
    return {"x-kubernetes-list-type": "set"}
