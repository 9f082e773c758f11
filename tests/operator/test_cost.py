"""The cost meter and spec.lifecycle.maxCostUSD against the real API server and node agent:
the shared operator prices ml.p5.48xlarge at a dollar a node-second (tests/conftest.py)."""

from __future__ import annotations

import re

import pytest

from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.operator import OperatorProcess
from tests.operator.runs import HANG, apply, condition, names_of, run_manifest, wait_clean, wait_phase

pytestmark = [pytest.mark.cluster, pytest.mark.aws]


def test_a_run_over_budget_fails_with_its_cost_and_its_gpus_go(
        cluster: LocalCluster, operator: OperatorProcess, namespace: str) -> None:
    apply(cluster, namespace, run_manifest("capped", trainer={"command": HANG},
                                           lifecycle={"maxCostUSD": 3}))
    run = wait_phase(cluster, namespace, "capped", "Failed", timeout=120)
    failed = condition(run, "Failed") or {}
    assert failed.get("reason") == "BudgetExceeded", run["status"]
    # The estimate when the run was looked at: at a dollar a second, any lateness shows.
    said = re.fullmatch(r"the trainer's estimated cost \$([0-9,.]+) reached spec\.lifecycle\."
                        r"maxCostUSD \$3\.00 \(1 x ml\.p5\.48xlarge at \$3,600\.00/h\)",
                        failed["message"])
    assert said and float(said[1].replace(",", "")) >= 3.0, failed["message"]
    wait_clean(cluster, names_of(run))  # the hanging trainer was deleted, and the rest
    cost = (wait_phase(cluster, namespace, "capped", "Failed").get("status") or {})["cost"]
    assert cost["usd"] >= 3.0 and cost["display"].startswith("$"), cost


def test_a_run_without_a_price_for_its_budget_fails_before_it_starts(
        cluster: LocalCluster, operator: OperatorProcess, namespace: str) -> None:
    apply(cluster, namespace, run_manifest("unpriced", trainer={"instanceType": "ml.p4d.24xlarge"},
                                           lifecycle={"maxCostUSD": 100}))
    run = wait_phase(cluster, namespace, "unpriced", "Failed", timeout=60)
    assert run["status"]["message"] == (
        "spec.lifecycle.maxCostUSD needs a price for instance type 'ml.p4d.24xlarge'; the "
        "operator has ml.p5.48xlarge (chart value pricing)"), run["status"]["message"]
    assert run["status"].get("launchedAttempt", 0) == 0
