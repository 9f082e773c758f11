"""The ECS workers' task definition: sized, tagged, and logging to CloudWatch."""

from __future__ import annotations

from pathlib import Path

import yaml

from mtrl_api.run import MultiTurnRLRunSpec
from mtrl_operator.builders.workers import task_definition
from mtrl_operator.naming import RunNames

REPO = Path(__file__).resolve().parents[3]
EXAMPLE = yaml.safe_load((REPO / "manifests" / "examples" / "wordle-hyperpod.yaml").read_text())
NAMES = RunNames("team-a", "wordle", "0f9e8d7c-1111-2222-3333-444455556666", "default")
ROLE = "arn:aws:iam::123456789012:role/operator-default-execution"


def _definition(**ecs: object) -> dict:
    spec = EXAMPLE["spec"]
    spec = MultiTurnRLRunSpec.model_validate(
        spec | {"workers": spec["workers"] | {"ecs": spec["workers"]["ecs"] | ecs}})
    return task_definition(NAMES, spec, {"A": "1"}, ROLE, "eu-west-1")


def test_workers_log_to_the_runs_own_group_in_the_operators_region() -> None:
    container = _definition()["containerDefinitions"][0]
    assert container["logConfiguration"] == {"logDriver": "awslogs", "options": {
        "awslogs-group": NAMES.log_group, "awslogs-region": "eu-west-1",
        "awslogs-stream-prefix": "worker"}}
    assert NAMES.log_group == f"/mtrl/{NAMES.aws_prefix}"


def test_a_group_named_in_the_spec_is_used_instead() -> None:
    container = _definition(logGroup="/team-a/rl-workers")["containerDefinitions"][0]
    assert container["logConfiguration"]["options"]["awslogs-group"] == "/team-a/rl-workers"


def test_the_spec_execution_role_wins_over_the_operators() -> None:
    body = _definition()
    assert body["executionRoleArn"] == EXAMPLE["spec"]["workers"]["ecs"]["executionRoleArn"]
    assert {"key": "mtrl.dev/run-uid", "value": NAMES.uid} in body["tags"]
