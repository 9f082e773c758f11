"""Generate the CustomResourceDefinitions in `crds/` from the pydantic models.

pydantic emits JSON Schema 2020-12; Kubernetes wants a *structural* OpenAPI v3 schema: no
`$ref`, no `anyOf` for optionals, booleans for exclusive bounds, and `default: {}` on nested
objects so the API server applies their own defaults. This module does that translation and
adds the CRD's names, printer columns and subresources. `mtrl crds` writes the files and
`tests/operator/api/test_crdgen.py` fails when they are stale.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from mtrl_api import GROUP, VERSION
from mtrl_api.run import MultiTurnRLRun
from mtrl_api.trigger import MultiTurnRLTrigger

# Keywords a structural schema may carry through unchanged.
_KEEP = {
    "type", "description", "default", "enum", "format", "pattern", "minimum", "maximum",
    "minLength", "maxLength", "minItems", "maxItems", "minProperties", "maxProperties",
    "x-kubernetes-validations", "x-kubernetes-list-type", "x-kubernetes-list-map-keys",
    "x-kubernetes-preserve-unknown-fields",
}


def _model_classes(root: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """Every model reachable from `root`, keyed as pydantic names them in `$defs`."""
    found: dict[str, type[BaseModel]] = {}
    stack = [root]
    while stack:
        cls = stack.pop()
        if cls.__name__ in found:
            continue
        found[cls.__name__] = cls
        for field in cls.model_fields.values():
            for arg in _flatten_annotation(field.annotation):
                if isinstance(arg, type) and issubclass(arg, BaseModel):
                    stack.append(arg)
    return found


def _flatten_annotation(annotation: Any) -> list[Any]:
    args = getattr(annotation, "__args__", None)
    out = [annotation]
    for arg in args or ():
        out.extend(_flatten_annotation(arg))
    meta_origin = getattr(annotation, "__origin__", None)
    if meta_origin is not None:
        out.extend(_flatten_annotation(meta_origin))
    return out


class _Translator:
    def __init__(self, root: type[BaseModel]) -> None:
        self.schema = root.model_json_schema(by_alias=True, mode="validation")
        self.defs: dict[str, Any] = self.schema.pop("$defs", {})
        self.classes = _model_classes(root)

    def translate(self) -> dict[str, Any]:
        return self._node(self.schema, owner=type(None).__name__)

    def _node(self, node: dict[str, Any], owner: str) -> dict[str, Any]:
        node = copy.deepcopy(node)
        description = node.get("description")
        # Optional[X] -> X: absence, not null, is how Kubernetes says "unset".
        if "anyOf" in node:
            options = [o for o in node.pop("anyOf") if o.get("type") != "null"]
            if len(options) != 1:
                raise ValueError(f"{owner}: unions other than Optional[X] are not structural")
            node = {**options[0], **node}
        if "$ref" in node:
            name = node.pop("$ref").rsplit("/", 1)[-1]
            node = {**self.defs[name], **node, "_model": name}
        if "allOf" in node:  # older pydantic wraps a described $ref in allOf
            (inner,) = node.pop("allOf")
            return self._node({**inner, **node}, owner)
        if "const" in node:
            node["enum"] = [node.pop("const")]
        if description is not None:
            node["description"] = description
        if "description" in node:  # docstrings wrap; kubectl explain re-flows text itself
            node["description"] = " ".join(node["description"].split())
        if "exclusiveMinimum" in node:
            node["minimum"], node["exclusiveMinimum"] = node["exclusiveMinimum"], True
        if "exclusiveMaximum" in node:
            node["maximum"], node["exclusiveMaximum"] = node["exclusiveMaximum"], True

        out = {k: v for k, v in node.items() if k in _KEEP or k.startswith("exclusive")}
        model_name = node.get("_model")
        if node.get("type") == "object" or "properties" in node:
            out["type"] = "object"
            if "properties" in node:
                out["properties"] = {
                    key: self._node(value, owner=f"{model_name or owner}.{key}")
                    for key, value in node["properties"].items()
                }
                if node.get("required"):
                    out["required"] = list(node["required"])
                if model_name:
                    self._nested_defaults(model_name, out["properties"])
            elif isinstance(node.get("additionalProperties"), dict):
                out["additionalProperties"] = self._node(node["additionalProperties"], owner)
        if node.get("type") == "array":
            out["items"] = self._node(node["items"], owner)
        if "type" not in out and "enum" not in out:
            raise ValueError(f"{owner}: no type in {node}")
        if "enum" in out and "type" not in out:
            out["type"] = "string"
        return out

    def _nested_defaults(self, model_name: str, properties: dict[str, Any]) -> None:
        """A nested object whose model builds itself from defaults gets that whole object as
        its default. (`default: {}` is not enough: the API server checks a default against the
        CEL rules before filling in the nested defaults.)"""
        cls = self.classes[model_name]
        for name, field in cls.model_fields.items():
            alias = field.alias or name
            factory = field.default_factory
            if alias not in properties or factory is None:
                continue
            value = factory()  # type: ignore[call-arg]
            if isinstance(value, BaseModel):
                properties[alias]["default"] = value.model_dump(
                    by_alias=True, exclude_none=True, mode="json")
            elif value:  # e.g. LoRA's target modules; empty lists and maps stay absent
                properties[alias]["default"] = value


def _assert_described(schema: dict[str, Any], path: str) -> None:
    for key, prop in schema.get("properties", {}).items():
        if not prop.get("description"):
            raise ValueError(f"{path}.{key} has no description (write a docstring under it)")
        _assert_described(prop, f"{path}.{key}")
        if "items" in prop:
            _assert_described(prop["items"], f"{path}.{key}[]")


def _without_defaults(node: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in node.items() if k != "default"}
    if "properties" in node:
        out["properties"] = {k: _without_defaults(v) for k, v in node["properties"].items()}
    if "items" in node:
        out["items"] = _without_defaults(node["items"])
    return out


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = _Translator(model).translate()
    _assert_described(schema, model.__name__)
    # No defaults in status. The API server would fill them in on another writer's update
    # (a merge patch of one condition), and server-side apply then counts that writer as an
    # owner of fields it never wrote (`resources.queues`, `workers`): when the operator empties
    # such a list, the API server keeps it as null and refuses every later status write.
    # The operator writes every status field it owns; readers get the defaults from the models.
    if "status" in schema.get("properties", {}):
        schema["properties"]["status"] = _without_defaults(schema["properties"]["status"])
    return schema


def _crd(model: type[BaseModel], kind: str, plural: str, short_names: list[str],
         columns: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short_names,
                "categories": ["mtrl", "ml"],
            },
            "versions": [{
                "name": VERSION,
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "additionalPrinterColumns": columns,
                "schema": {"openAPIV3Schema": openapi_schema(model)},
            }],
        },
    }


_AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}


def run_crd() -> dict[str, Any]:
    return _crd(MultiTurnRLRun, "MultiTurnRLRun", "multiturnrlruns", ["mtrlrun", "mtrlruns"], [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase",
         "description": "Lifecycle phase of the run"},
        {"name": "Step", "type": "string", "jsonPath": ".status.progress.display",
         "description": "Optimizer steps done/total"},
        {"name": "Reward", "type": "string", "jsonPath": ".status.progress.rewardDisplay",
         "description": "Mean aggregate reward of the latest step, to three decimals"},
        {"name": "Workers", "type": "string", "jsonPath": ".status.workers.display",
         "description": "Reward workers ready/desired"},
        {"name": "Attempts", "type": "integer", "jsonPath": ".status.attempts",
         "description": "Trainer attempts started"},
        {"name": "Cost", "type": "string", "jsonPath": ".status.cost.display",
         "description": "Estimated trainer cost so far"},
        {"name": "Start", "type": "date", "jsonPath": ".status.startTime",
         "description": "When provisioning began"},
        {"name": "End", "type": "date", "jsonPath": ".status.completionTime",
         "description": "When the run reached Succeeded or Failed"},
        {"name": "Environment", "type": "string", "priority": 1,
         "jsonPath": ".spec.rollout.environment",
         "description": "Environment plug-in"},
        {"name": "Message", "type": "string", "priority": 1,
         "jsonPath": ".status.message", "description": "Current state"},
        _AGE,
    ])


def trigger_crd() -> dict[str, Any]:
    return _crd(MultiTurnRLTrigger, "MultiTurnRLTrigger", "multiturnrltriggers",
                ["mtrltrigger", "mtrltriggers"], [
        {"name": "Bucket", "type": "string", "jsonPath": ".spec.source.s3.bucket",
         "description": "S3 bucket watched"},
        {"name": "Prefix", "type": "string", "jsonPath": ".spec.source.s3.prefix",
         "description": "Key prefix watched"},
        {"name": "Policy", "type": "string", "jsonPath": ".spec.concurrencyPolicy",
         "description": "Concurrency policy: Allow, Forbid or Replace"},
        {"name": "Active", "type": "integer", "jsonPath": ".status.activeCount",
         "description": "Runs of this trigger not yet Succeeded or Failed"},
        {"name": "Last Trigger", "type": "date", "jsonPath": ".status.lastTriggerTime",
         "description": "When the latest run was created"},
        {"name": "Suspended", "type": "boolean", "jsonPath": ".spec.suspend",
         "description": "Whether notifications wait in the queue"},
        {"name": "Ready", "type": "string", "priority": 1,
         "jsonPath": ".status.conditions[?(@.type==\"Ready\")].reason",
         "description": "Why the trigger is or is not consuming"},
        _AGE,
    ])


def all_crds() -> dict[str, dict[str, Any]]:
    """File name in `crds/` -> CRD object."""
    return {"mtrl.dev_multiturnrlruns.yaml": run_crd(),
            "mtrl.dev_multiturnrltriggers.yaml": trigger_crd()}


def render(crd: dict[str, Any]) -> str:
    header = "# Generated by `mtrl crds` from mtrl_api; do not edit by hand.\n"
    return header + yaml.safe_dump(crd, sort_keys=False, width=100)


def write(directory: Path) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, crd in all_crds().items():
        path = directory / filename
        path.write_text(render(crd))
        written.append(path)
    return written


def stale(directory: Path) -> list[str]:
    """Files in `directory` that differ from what the models generate."""
    return [name for name, crd in all_crds().items()
            if not (directory / name).exists() or (directory / name).read_text() != render(crd)]
