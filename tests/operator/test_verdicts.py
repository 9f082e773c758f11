"""Verdicts by evidence through the real API server, scheduler, Job controller and node agent
(issue 40; the pure cases are tests/operator/reconcile/test_evidence.py): a trainer that exits
0 without its report, a resumed trainer whose create is refused while its predecessor's report
is still there, and a trainer pod that sits on its node without ever starting. The shared
operator prices ml.p5.48xlarge at a dollar a node-second (tests/conftest.py)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import pytest

from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.operator import OperatorProcess
from tests.operator.runs import (
    EXITS_0_SILENTLY,
    HANG,
    apply,
    condition,
    get,
    names_of,
    run_manifest,
    wait_clean,
    wait_for,
    wait_phase,
)

pytestmark = [pytest.mark.cluster, pytest.mark.aws]


def _status(cluster: LocalCluster, namespace: str, name: str) -> dict:
    return (get(cluster, namespace, name) or {}).get("status") or {}


def test_a_trainer_that_exits_0_without_reporting_an_outcome_fails(
        cluster: LocalCluster, operator: OperatorProcess, namespace: str) -> None:
    """Its Job completes, and used to end the run Succeeded: "trained 0 steps"."""
    apply(cluster, namespace, run_manifest("silent", trainer={"command": EXITS_0_SILENTLY},
                                           lifecycle={"backoffLimit": 0}))
    run = wait_phase(cluster, namespace, "silent", "Failed", timeout=120)
    assert condition(run, "Failed")["reason"] == "BackoffLimitExceeded", run["status"]
    assert "the trainer exited 0 after 3 of 3 steps without reporting an outcome" in \
        run["status"]["message"], run["status"]["message"]
    wait_clean(cluster, names_of(run))


# Launch 1 reports a step and waits for ever (until the suspension stops it); any later
# launch is the stand-in trainer, which trains and reports its outcome.
FIRST_LAUNCH_WAITS = ["python", "-c", (
    "import os, sys, time\n"
    "if os.environ['MTRL_LAUNCH'] != '1':\n"
    "    from mtrl_testbed.standin_trainer import main\n"
    "    sys.exit(main(['--step-seconds', '0.1']))\n"
    "from mtrl_trainer.progress import ConfigMapSink\n"
    "sink = ConfigMapSink(os.environ['MTRL_PROGRESS_CONFIGMAP'], os.environ['MTRL_NAMESPACE'])\n"
    "sink.report({'step': 1, 'totalSteps': 3, 'attempt': 1, 'launch': 1})\n"
    "time.sleep(600)\n")]

NO_JOBS = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "no-jobs"},
           "spec": {"hard": {"count/jobs.batch": "0"}}}


def test_a_resumed_trainer_whose_create_is_refused_is_not_taken_for_the_stopped_one(
        cluster: LocalCluster, operator: OperatorProcess, namespace: str) -> None:
    """After suspend and resume, the same attempt is launched again while its predecessor's
    report (attempt 1) is still in the progress ConfigMap. A quota refuses the new Job: the
    stale report used to count as proof that the new trainer ran and was gone (a failed
    attempt). Now the launch is created once the quota allows it, and succeeds on its own
    report."""
    apply(cluster, namespace, run_manifest("resumed", trainer={"command": FIRST_LAUNCH_WAITS}))
    wait_for(lambda: _status(cluster, namespace, "resumed").get("progress", {}).get("step") == 1,
             90, "launch 1's report of step 1")
    patch = ["patch", "mtrlrun", "resumed", "-n", namespace, "--type=merge", "-p"]
    cluster.kubectl(*patch, '{"spec":{"lifecycle":{"suspend":true}}}')
    wait_phase(cluster, namespace, "resumed", "Suspended", timeout=90)
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(NO_JOBS))
    cluster.kubectl(*patch, '{"spec":{"lifecycle":{"suspend":false}}}')
    refused = wait_for(lambda: (s := _status(cluster, namespace, "resumed")) and
                       "exceeded quota" in s.get("message", "") and s, 90,
                       "the refused create to show")
    assert refused["trainerLaunch"] == 2 and refused["attempts"] == 1, refused
    assert refused.get("failedAttempts", 0) == 0, refused
    cluster.kubectl("delete", "resourcequota", "no-jobs", "-n", namespace)
    run = wait_phase(cluster, namespace, "resumed", "Succeeded", timeout=120)
    status = run["status"]
    assert (status["attempts"], status.get("failedAttempts", 0), status["trainerLaunch"]) == \
        (1, 0, 2), status
    wait_clean(cluster, names_of(run))


UNPULLABLE = "registry.invalid/mtrl-trainer:0.1.0"  # RFC 2606: never resolves


def test_a_trainer_pod_that_can_never_start_fails_its_attempt_at_the_startup_bound(
        cluster: LocalCluster, operator: OperatorProcess, namespace: str) -> None:
    """Bound to a node with an image that cannot be pulled: it used to wait "for trainer
    pods" for ever at $0.00. Now it says why in the kubelet's words, costs from the moment it
    holds the node, and its attempt ends at lifecycle.startupTimeoutSeconds."""
    apply(cluster, namespace, run_manifest("unpullable", trainer={"image": UNPULLABLE},
                                           lifecycle={"startupTimeoutSeconds": 6,
                                                      "backoffLimit": 0}))
    said = wait_for(lambda: (s := _status(cluster, namespace, "unpullable")) and
                    "ImagePull" in s.get("message", "") and s, 90, "the kubelet's words")
    assert UNPULLABLE in said["message"] and said["phase"] == "Provisioning", said["message"]
    run = wait_phase(cluster, namespace, "unpullable", "Failed", timeout=90)
    status = run["status"]
    assert condition(run, "Failed")["reason"] == "BackoffLimitExceeded", status
    assert "never started (spec.lifecycle.startupTimeoutSeconds)" in status["message"], status
    assert UNPULLABLE in status["message"], status["message"]
    assert status["cost"]["usd"] >= 6, status["cost"]  # at least 6 node-seconds held
    wait_clean(cluster, names_of(run))


def test_max_cost_ends_a_run_whose_trainer_never_starts(
        cluster: LocalCluster, operator: OperatorProcess, namespace: str) -> None:
    apply(cluster, namespace, run_manifest("unstarted", trainer={"image": UNPULLABLE},
                                           lifecycle={"startupTimeoutSeconds": 0,
                                                      "maxCostUSD": 5}))
    run = wait_phase(cluster, namespace, "unstarted", "Failed", timeout=120)
    assert condition(run, "Failed")["reason"] == "BudgetExceeded", run["status"]
    assert run["status"]["cost"]["usd"] >= 5
    wait_clean(cluster, names_of(run))


def test_an_operator_upgrade_that_changes_pricing_leaves_a_running_run_alone(
        cluster: LocalCluster, operator_factory: Callable[..., OperatorProcess]) -> None:
    """A helm upgrade whose `pricing` no longer has the run's instance type used to fail a
    Running run with NoPrice and delete its trainer; now the run keeps the price it started
    with, and the new operator meters it at that price."""
    namespace = f"upgrade-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    common = {"MTRL_OPERATOR_ID": "upgrade", "MTRL_NAMESPACES": namespace,
              "MTRL_COST_REFRESH_SECONDS": "1"}
    before = operator_factory(**common, MTRL_INSTANCE_PRICES="ml.p5.48xlarge=3600")
    apply(cluster, namespace, run_manifest("priced", trainer={"command": HANG},
                                           lifecycle={"maxCostUSD": 100000}))
    run = wait_phase(cluster, namespace, "priced", "Running", timeout=90)
    assert run["status"]["cost"]["price"] == 3600  # a dollar a node-second
    before.stop()
    shown = _status(cluster, namespace, "priced")["cost"]["usd"]
    operator_factory(**common, MTRL_INSTANCE_PRICES="ml.p4d.24xlarge=10")
    # The new operator's own write of the meter: it reconciled the run, at the old price.
    status = wait_for(lambda: (s := _status(cluster, namespace, "priced")) and
                      s["cost"]["usd"] > shown + 3 and s, 60, "the new operator's meter")
    assert status["phase"] == "Running" and status["cost"]["price"] == 3600, status
    cluster.kubectl("delete", "mtrlrun", "priced", "-n", namespace, "--timeout=90s")
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")
