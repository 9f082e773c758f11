"""The generated CRD: fresh, structural, and documented."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mtrl_api import crdgen
from mtrl_api.run import MultiTurnRLRunSpec
from mtrl_api.trigger import MultiTurnRLTriggerSpec
from mtrl_cli.main import CRD_FOLDERS

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("folder", [REPO / f for f in CRD_FOLDERS], ids=lambda p: str(p.relative_to(REPO)))
def test_crds_are_fresh(folder: Path) -> None:
    assert crdgen.stale(folder) == [], f"{folder} is stale: run `make crds`"


@pytest.mark.parametrize(("name", "text", "changed"), [
    ("mtrl.dev_multiturnrlruns.yaml", "Default 32.", "Default 16."),
    ("mtrl.dev_multiturnrltriggers.yaml", "- mtrltrigger\n", "- mtrltrig\n"),
])
def test_stale_check_notices_a_changed_schema(tmp_path: Path, name: str, text: str,
                                              changed: str) -> None:
    crdgen.write(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(crdgen.all_crds())
    path = tmp_path / name
    assert text in path.read_text()
    path.write_text(path.read_text().replace(text, changed))
    assert crdgen.stale(tmp_path) == [name]


def _walk(schema: dict, path: str = "") -> list[tuple[str, dict]]:
    out = [(path, schema)]
    for key, prop in schema.get("properties", {}).items():
        out += _walk(prop, f"{path}.{key}")
    if "items" in schema:
        out += _walk(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        out += _walk(schema["additionalProperties"], f"{path}{{}}")
    return out


def _schema(crd: dict) -> dict:
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


@pytest.fixture(scope="module")
def schema() -> dict:
    return _schema(crdgen.run_crd())


@pytest.fixture(scope="module")
def trigger_schema() -> dict:
    return _schema(crdgen.trigger_crd())


@pytest.fixture(scope="module", params=sorted(crdgen.all_crds()))
def any_schema(request: pytest.FixtureRequest) -> dict:
    return _schema(crdgen.all_crds()[request.param])


def test_every_property_is_described_and_typed(any_schema: dict) -> None:
    for path, node in _walk(any_schema):
        assert node.get("type"), f"{path or '<root>'} has no type"
        if path and not path.endswith(("[]", "}")):
            assert node.get("description"), f"{path} has no description"


def test_schema_is_structural(any_schema: dict) -> None:
    forbidden = {"$ref", "anyOf", "allOf", "oneOf", "title", "const", "$defs"}
    for path, node in _walk(any_schema):
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


def test_status_has_no_defaults(any_schema: dict) -> None:
    # Defaults there make another writer's merge patch an owner of fields it never wrote, and
    # server-side apply then leaves a list the operator empties as null (refused by the schema).
    defaulted = [path for path, node in _walk(any_schema["properties"]["status"])
                 if "default" in node]
    assert not defaulted


def test_spec_immutability_rules_use_old_self(schema: dict) -> None:
    rules = schema["x-kubernetes-validations"]
    guarded = {r["fieldPath"] for r in rules}
    assert {".spec.grpo", ".spec.model", ".spec.dataset"} <= guarded
    assert ".spec.lifecycle" not in guarded  # suspend must stay editable
    assert all("oldSelf" in r["rule"] for r in rules)


@pytest.mark.parametrize("path", sorted((REPO / "manifests" / "examples").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_examples_parse_with_the_models(path: Path) -> None:
    models = {"MultiTurnRLRun": MultiTurnRLRunSpec, "MultiTurnRLTrigger": MultiTurnRLTriggerSpec}
    docs = [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert docs, f"{path.name} holds no object"
    for doc in docs:  # an object of another kind is unchecked here: it must not pass quietly
        assert doc.get("kind") in models, f"{path.name}: no model checks a {doc.get('kind')}"
        models[doc["kind"]].model_validate(doc["spec"])


def test_trigger_template_is_the_run_spec_without_a_required_dataset(schema: dict,
                                                                      trigger_schema: dict) -> None:
    run_spec = schema["properties"]["spec"]
    template = trigger_schema["properties"]["spec"]["properties"]["runTemplate"]["properties"]["spec"]
    assert set(template["properties"]) == set(run_spec["properties"])
    for section in ("model", "grpo", "trainer", "workers", "output"):
        assert template["properties"][section] == run_spec["properties"][section], section
    assert "dataset" in run_spec["required"] and "dataset" not in template["required"]
    dataset = template["properties"]["dataset"]
    assert "x-kubernetes-validations" not in dataset  # no "exactly one source" rule
    assert set(dataset["properties"]["s3"]["properties"]) == {"validationUri"}


def test_trigger_queue_and_bucket_are_immutable(trigger_schema: dict) -> None:
    guarded = {r["fieldPath"] for r in trigger_schema["x-kubernetes-validations"]}
    assert guarded == {".spec.source.s3.bucket", ".spec.queue"}
    queue = trigger_schema["properties"]["spec"]["properties"]["queue"]
    assert queue["default"] == {"create": True} and queue["x-kubernetes-validations"]
