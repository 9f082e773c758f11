"""The data plane's environment: what the operator sets, and what a run's own env may add."""

from __future__ import annotations

from pathlib import Path

import yaml

from mtrl_api.run import OPERATOR_ENV, MultiTurnRLRunSpec
from mtrl_operator.builders.env import trainer_env, worker_env
from mtrl_operator.naming import RunNames

REPO = Path(__file__).resolve().parents[3]
SPEC = yaml.safe_load((REPO / "manifests" / "examples" / "tiny-cpu.yaml").read_text())["spec"]
NAMES = RunNames("ns", "run", "0f9e8d7c-1111-2222-3333-444455556666", "default")
QUEUES = {role: f"https://sqs/{role}" for role in ("rollout", "result", "generate", "dlq")}


def _spec(**env: str) -> MultiTurnRLRunSpec:
    pairs = [{"name": k, "value": v} for k, v in env.items()]
    return MultiTurnRLRunSpec.model_validate(
        SPEC | {"trainer": SPEC["trainer"] | {"env": pairs},
                "workers": SPEC["workers"] | {"env": pairs}})


def test_reserved_names_are_exactly_those_the_operator_sets() -> None:
    spec = _spec()
    set_by_operator = set(worker_env(NAMES, spec, QUEUES, "us-west-2")) | set(
        trainer_env(NAMES, spec, QUEUES, "us-west-2", attempt=1))
    assert set_by_operator == set(OPERATOR_ENV)


def test_a_runs_env_adds_knobs_but_cannot_replace_the_operators() -> None:
    # A run stored before the API server refused such names still gets the operator's values.
    spec = _spec(MTRL_LEASE_S="90", MTRL_RUN_ID="someone-else", MTRL_ROLLOUT_QUEUE_URL="x")
    for env in (worker_env(NAMES, spec, QUEUES, "us-west-2"),
                trainer_env(NAMES, spec, QUEUES, "us-west-2", attempt=1)):
        assert env["MTRL_LEASE_S"] == "90"
        assert env["MTRL_RUN_ID"] == NAMES.uid
        assert env["MTRL_ROLLOUT_QUEUE_URL"] == QUEUES["rollout"]
