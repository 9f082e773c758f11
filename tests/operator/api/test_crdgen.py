"""The generated CRD: fresh, structural, and documented."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mtrl_operator.api import crdgen
from mtrl_operator.api.run import MultiTurnRLRunSpec

REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("folder", crdgen.DESTINATIONS, ids=lambda p: str(p.relative_to(REPO)))
def test_crds_are_fresh(folder: Path) -> None:
    assert crdgen.stale(folder) == [], f"{folder} is stale: run `make crds`"


def test_stale_check_notices_a_changed_schema(tmp_path: Path) -> None:
    crdgen.write(tmp_path)
    (path,) = tmp_path.iterdir()
    path.write_text(path.read_text().replace("Default 32.", "Default 16."))
    assert crdgen.stale(tmp_path) == [path.name]


def _walk(schema: dict, path: str = "") -> list[tuple[str, dict]]:
    out = [(path, schema)]
    for key, prop in schema.get("properties", {}).items():
        out += _walk(prop, f"{path}.{key}")
    if "items" in schema:
        out += _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        out += _walk(schema["additionalProperties"], f"{path}{{}}")
    return out


@pytest.fixture(scope="module")
def schema() -> dict:
    return crdgen.run_crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def test_every_property_is_described_and_typed(schema: dict) -> None:
    for path, node in _walk(schema):
        assert node.get("type"), f"{path or '<root>'} has no type"
        if path and not path.endswith(("[]", "}")):
            assert node.get("description"), f"{path} has no description"


def test_schema_is_structural(schema: dict) -> None:
    forbidden = {"$ref", "anyOf", "allOf", "oneOf", "title", "const", "$defs"}
    for path, node in _walk(schema):
        assert not forbidden & node.keys(), f"{path}: {forbidden & node.keys()}"


def test_defaults_bounds_and_enums_come_from_the_models(schema: dict) -> None:
    grpo = schema["properties"]["spec"]["properties"]["grpo"]
    assert grpo["properties"]["groupSize"] == {**grpo["properties"]["groupSize"],
                                               "default": 8, "minimum": 2, "maximum": 256}
    assert grpo["properties"]["lossType"]["enum"] == ["grpo", "bnpo", "dr_grpo", "dapo"]
    assert grpo["properties"]["learningRate"]["exclusiveMinimum"] is True
    # A nested object defaults to its model's defaults, which satisfy its own CEL rules.
    assert grpo["default"]["epsilonHigh"] >= grpo["default"]["epsilon"]
    trainer = schema["properties"]["spec"]["properties"]["trainer"]["properties"]
    assert trainer["instanceType"]["default"] == "ml.p5.48xlarge"
    assert trainer["launcher"]["enum"] == ["Job", "PyTorchJob", "HyperPodPyTorchJob"]


def test_spec_immutability_rules_use_old_self(schema: dict) -> None:
    rules = schema["x-kubernetes-validations"]
    guarded = {r["fieldPath"] for r in rules}
    assert {".spec.grpo", ".spec.model", ".spec.dataset"} <= guarded
    assert ".spec.lifecycle" not in guarded  # suspend must stay editable
    assert all("oldSelf" in r["rule"] for r in rules)


@pytest.mark.parametrize("path", sorted((REPO / "manifests" / "examples").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_examples_parse_with_the_models(path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc.get("kind") == "MultiTurnRLRun":
            MultiTurnRLRunSpec.model_validate(doc["spec"])
