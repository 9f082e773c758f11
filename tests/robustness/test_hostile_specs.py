"""Hostile `MultiTurnRLRun` specs: the API server refuses what is malformed, naming the field,
and the operator drives everything it accepts to an end without falling over or leaking.

Hypothesis generates manifests (`specs.run_manifests`), valid and invalid, full of injection
strings, unicode, huge and negative numbers. Each is first sent as a server-side dry run; one
that is accepted is created for real in its own namespace (names repeat across examples), where
an operator started for this test picks it up. Accepted runs then run concurrently; at the end
each must have reached Succeeded or Failed (or be steadily Running), the operator must still be
alive, and once deleted no run may leave anything in AWS or the cluster.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from mtrl_operator.naming import RunNames
from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.moto import REGION
from mtrl_testbed.operator import OperatorProcess
from tests.operator.runs import (
    aws_leftovers,
    condition,
    get,
    k8s_leftovers,
    run_manifest,
    wait_for,
)
from tests.robustness.specs import run_manifests

pytestmark = [pytest.mark.cluster, pytest.mark.aws, pytest.mark.slow]

OPERATOR_ID = "hostile"
EXAMPLES = 40
SETTLE_TIMEOUT_S = 150  # for all accepted runs together; another test run may share the CPUs
TERMINAL = {"Succeeded", "Failed"}
FIELD_MARKERS = ("spec.", "metadata.name")


@dataclass(frozen=True)
class Accepted:
    manifest: dict[str, Any]
    names: RunNames


@dataclass
class Tally:
    generated: int = 0
    rejected: int = 0
    accepted: list[Accepted] = field(default_factory=list)


def _create(cluster: LocalCluster, namespace: str, manifest: dict[str, Any],
            dry_run: bool) -> tuple[int, str]:
    args = ["create", "-n", namespace, "-o", "json", "-f", "-"]
    out = cluster.kubectl(*args, *(["--dry-run=server"] if dry_run else []),
                          input=json.dumps(manifest), check=False)
    return out.returncode, out.stdout if out.returncode == 0 else out.stderr


def _submit(cluster: LocalCluster, prefix: str, tally: Tally, manifest: dict[str, Any]) -> None:
    """Dry-run, then create an accepted manifest for real in a namespace of its own."""
    tally.generated += 1
    code, text = _create(cluster, f"{prefix}-probe", manifest, dry_run=True)
    if code != 0:
        tally.rejected += 1
        assert any(m in text for m in FIELD_MARKERS), f"rejected without naming a field: {text}"
        return
    namespace = f"{prefix}-{len(tally.accepted)}"
    cluster.kubectl("create", "namespace", namespace)
    code, text = _create(cluster, namespace, manifest, dry_run=False)
    assert code == 0, f"accepted by the dry run, refused for real: {text}"
    meta = json.loads(text)["metadata"]
    tally.accepted.append(Accepted(manifest, RunNames(namespace, meta["name"], meta["uid"],
                                                      OPERATOR_ID)))


def _phase(cluster: LocalCluster, run: RunNames) -> str | None:
    body = get(cluster, run.namespace, run.name)
    return ((body or {}).get("status") or {}).get("phase")


def _failure_reasons(cluster: LocalCluster, runs: list[Accepted]) -> Counter[str]:
    reasons: Counter[str] = Counter()
    for run in runs:
        body = get(cluster, run.names.namespace, run.names.name) or {}
        failed = condition(body, "Failed")
        if failed and failed["status"] == "True":
            reasons[failed["reason"]] += 1
    return reasons


def _settle(cluster: LocalCluster, runs: list[Accepted]) -> dict[str, str | None]:
    """Wait, polling, until every run has finished or trains (Running: its spec was a valid
    one); a run in any other phase when the bound runs out is stuck."""
    def phases() -> dict[str, str | None]:
        return {f"{a.names.namespace}/{a.names.name}": _phase(cluster, a.names) for a in runs}

    settled = TERMINAL | {"Running"}
    with contextlib.suppress(AssertionError):
        wait_for(lambda: set(phases().values()) <= settled, SETTLE_TIMEOUT_S,
                 "every hostile run to finish or train", interval=2)
    return {key: phase if phase in settled else f"stuck in {phase}"
            for key, phase in phases().items()}


def _teardown(cluster: LocalCluster, runs: list[Accepted]) -> None:
    for run in runs:
        cluster.kubectl("delete", "mtrlrun", "--all", "-n", run.names.namespace, "--wait=false")
    for run in runs:
        wait_for(lambda r=run.names: get(cluster, r.namespace, r.name) is None and
                 not aws_leftovers(r) and not k8s_leftovers(cluster, r.namespace, r.uid),
                 90, f"nothing left of {run.names.namespace}/{run.names.name}", interval=1)


def test_hostile_specs_are_refused_or_run_to_an_end(
        cluster: LocalCluster, operator_factory: Callable[..., OperatorProcess]) -> None:
    prefix = f"rh-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", f"{prefix}-probe")
    operator = operator_factory(MTRL_OPERATOR_ID=OPERATOR_ID, MTRL_NAMESPACES=f"{prefix}-*")
    tally = Tally()

    @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                     HealthCheck.data_too_large])
    @given(manifest=run_manifests())
    def submit(manifest: dict[str, Any]) -> None:
        _submit(cluster, prefix, tally, manifest)

    try:
        submit()
        phases = _settle(cluster, tally.accepted)
        print(f"\nhostile specs: {tally.generated} generated, {tally.rejected} rejected by the "
              f"API server, {len(tally.accepted)} accepted; final phases of the accepted: "
              f"{dict(Counter(phases.values()))}, reasons of the failed: "
              f"{dict(_failure_reasons(cluster, tally.accepted))}")
        unsettled = {k: v for k, v in phases.items() if v not in TERMINAL and v != "Running"}
        bad = [a.manifest for a in tally.accepted
               if f"{a.names.namespace}/{a.names.name}" in unsettled]
        assert not unsettled, f"runs that did not reach an end: {unsettled}\n{json.dumps(bad)[:4000]}"
        assert operator.alive, "the operator died"
        assert tally.accepted and tally.rejected, "the strategies must produce both kinds"
        _teardown(cluster, tally.accepted)
        assert operator.alive, "the operator died during teardown"
    finally:
        for i in range(len(tally.accepted)):
            cluster.kubectl("delete", "namespace", f"{prefix}-{i}", "--wait=false", check=False)
        cluster.kubectl("delete", "namespace", f"{prefix}-probe", "--wait=false", check=False)


# Free text that would be an invalid label value, node selector, ServiceAccount name or
# resource name in the objects the operator builds: the schema refuses it, naming the field.
UNUSABLE = {
    "priority-class": ({"scheduling": {"priorityClass": "$(id)"}}, "spec.scheduling.priorityClass"),
    "trainer-node-selector": ({"trainer": {"nodeSelector": {"pool": "'; rm -rf /"}}},
                              "spec.trainer.nodeSelector"),
    "trainer-service-account": ({"trainer": {"serviceAccountName": "{{.Values}}"}},
                                "spec.trainer.serviceAccountName"),
    "trainer-resource-name": ({"trainer": {"resources": {"requests": {"$(id)": "1"}}}},
                              "spec.trainer.resources.requests"),
    "worker-node-selector": ({"workers": {"kubernetes": {"nodeSelector": {"$(id)": "a"}}}},
                             "spec.workers.kubernetes.nodeSelector"),
}


@pytest.mark.parametrize("case", sorted(UNUSABLE))
def test_values_unusable_in_child_objects_are_refused_by_the_schema(
        cluster: LocalCluster, namespace: str, case: str) -> None:
    overrides, field = UNUSABLE[case]
    code, text = _create(cluster, namespace, run_manifest(case, **overrides), dry_run=True)
    assert code != 0 and field in text, text


def test_a_child_object_kubernetes_refuses_fails_the_run(
        cluster: LocalCluster, operator_factory: Callable[..., OperatorProcess]) -> None:
    """The backstop for what the schema cannot see: an extended resource requested without a
    limit passes the CRD, but Kubernetes refuses the trainer Job (422: extended resources are
    not overcommitted). The run fails with that reason and leaks nothing."""
    namespace = f"ru-child-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    operator_factory(MTRL_OPERATOR_ID="refused-child", MTRL_NAMESPACES=namespace)
    resources = {"requests": {"example.com/dongle": "1"}}
    code, text = _create(cluster, namespace, run_manifest("refused", trainer={
        "resources": resources}), dry_run=False)
    assert code == 0, text
    run = RunNames(namespace, "refused", json.loads(text)["metadata"]["uid"], "refused-child")
    try:
        wait_for(lambda: _phase(cluster, run) == "Failed", 60, "the run to fail")
        body = get(cluster, namespace, "refused")
        failed = next(c for c in body["status"]["conditions"] if c["type"] == "Failed")
        assert failed["reason"] == "InvalidChildObject", failed
        assert "Job" in body["status"]["message"], body["status"]["message"]
    finally:
        _teardown(cluster, [Accepted({}, run)])
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


# ECS references the schema cannot check: the run names a cluster or subnet that does not exist.
MISSING_ECS = {"no-cluster": {"cluster": "does-not-exist"},
               "no-subnet": {"subnets": ["subnet-0000000000000dead"]}}
MISSING_WAIT_S = 90  # a bound on waits that end as soon as the runs have moved on


def _force_release(cluster: LocalCluster, run: RunNames) -> None:
    """The documented escape hatch: the operator drops its finalizer without cleanup, and the
    orphan sweeper collects what is left in AWS."""
    cluster.kubectl("annotate", "mtrlrun", run.name, "-n", run.namespace, "--overwrite",
                    "mtrl.dev/force-release=true", check=False)


def test_missing_ecs_resources_fail_the_run_and_deletion_completes(
        cluster: LocalCluster, operator_factory: Callable[..., OperatorProcess]) -> None:
    namespace = f"ru-ecs-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", namespace)
    operator_factory(MTRL_OPERATOR_ID="missing-ecs", MTRL_NAMESPACES=namespace)
    runs: list[RunNames] = []
    for case, ecs in MISSING_ECS.items():
        workers = {"backend": "ecs-fargate", "cpu": 256, "memory": 512, "minReplicas": 1,
                   "maxReplicas": 1, "ecs": ecs}
        code, text = _create(cluster, namespace, run_manifest(case, workers=workers), dry_run=False)
        assert code == 0, text
        runs.append(RunNames(namespace, case, json.loads(text)["metadata"]["uid"], "missing-ecs"))
    try:
        began = time.monotonic()
        with contextlib.suppress(AssertionError):
            wait_for(lambda: all(_phase(cluster, r) == "Failed" for r in runs), MISSING_WAIT_S,
                     "every run with a missing ECS resource to fail")
        failed_after = time.monotonic() - began
        phases = {r.name: _phase(cluster, r) for r in runs}
        said = {r.name: ((get(cluster, namespace, r.name) or {}).get("status") or {})
                .get("message", "") for r in runs}
        cluster.kubectl("delete", "mtrlrun", "--all", "-n", namespace, "--wait=false")
        began = time.monotonic()
        with contextlib.suppress(AssertionError):
            wait_for(lambda: all(get(cluster, namespace, r.name) is None for r in runs),
                     MISSING_WAIT_S, "every such run to be deleted")
        left = [r.name for r in runs if get(cluster, namespace, r.name) is not None]
        print(f"\nmissing ECS resources: phases after {failed_after:.1f}s: {phases}; "
              f"gone {time.monotonic() - began:.1f}s after deletion but for: {left}")
    finally:
        for r in runs:
            _force_release(cluster, r)
        _teardown(cluster, [Accepted({}, r) for r in runs])
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
    assert all(p == "Failed" for p in phases.values()) and not left, (phases, left)
    # Each says what is missing, and where.
    assert said["no-cluster"].startswith("ECS cluster 'does-not-exist' was not found in "
                                         f"{REGION} (DescribeClusters)"), said
    assert "subnet-0000000000000dead" in said["no-subnet"] and REGION in said["no-subnet"], said
