"""The Kubernetes adapter against the real API server: status by server-side apply, and the
operator's own errors in place of the client's."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from lightkube import AsyncClient, KubeConfig

from mtrl_operator.adapters.kube import Kube
from mtrl_operator.errors import NotServed, StaleCopy
from mtrl_operator.reconcile.run import CONDITION_TYPES
from mtrl_testbed.cluster import LocalCluster
from tests.operator.runs import apply, get, run_manifest
from tests.operator.triggers import trigger_manifest

pytestmark = [pytest.mark.cluster]


@pytest.fixture
def quiet_namespace(cluster: LocalCluster) -> Iterator[str]:
    """A namespace no operator watches: only this test writes its runs."""
    with cluster.namespace(f"adapter-{uuid.uuid4().hex[:8]}") as name:
        yield name


@pytest.fixture
def kube(cluster: LocalCluster) -> Kube:
    return Kube(AsyncClient(KubeConfig.from_file(str(cluster.kubeconfig)),
                            field_manager="mtrl-operator"))


def _condition(type_: str, reason: str) -> dict[str, str]:
    return {"type": type_, "status": "True", "reason": reason, "message": "",
            "lastTransitionTime": "2026-11-30T12:00:00Z"}


async def test_status_apply_keeps_other_writers_conditions_and_drops_what_went_away(
        cluster: LocalCluster, quiet_namespace: str, kube: Kube) -> None:
    ns = quiet_namespace
    apply(cluster, ns, run_manifest("applied"))
    version = await kube.apply_status(ns, "applied", {
        "phase": "Running", "conditions": [_condition("TrainerReady", "Running")],
        "resources": {"trainerName": "applied-t1", "queues": []}}, CONDITION_TYPES)
    # The write's own resourceVersion: the controller waits for the watch to echo it.
    assert version == (get(cluster, ns, "applied") or {})["metadata"]["resourceVersion"]
    assert await kube.apply_status(ns, "never-was", {"phase": "Running"},
                                   CONDITION_TYPES) is None
    # Another controller adds a condition of its own, as a well-behaved one does.
    cluster.kubectl("patch", "mtrlrun", "applied", "-n", ns, "--subresource=status",
                    "--type=json", "-p", json.dumps([{
                        "op": "add", "path": "/status/conditions/-",
                        "value": _condition("ExternalCheck", "Audited")}]))
    # Our status as decided from what we read: the other writer's condition is in it, with an
    # older value; it is not ours to write.
    await kube.apply_status(ns, "applied", {
        "phase": "Succeeded", "conditions": [_condition("TrainerReady", "TrainerSucceeded"),
                                             _condition("ExternalCheck", "Stale")],
        "resources": {"queues": []}}, CONDITION_TYPES)
    status = (get(cluster, ns, "applied") or {})["status"]
    assert status["phase"] == "Succeeded"
    assert {c["type"]: c["reason"] for c in status["conditions"]} == {
        "TrainerReady": "TrainerSucceeded", "ExternalCheck": "Audited"}
    assert "trainerName" not in status.get("resources", {}), \
        "a field we no longer send is gone"


async def test_a_stale_finalizer_write_is_a_stale_copy_and_a_gone_object_is_none(
        cluster: LocalCluster, quiet_namespace: str, kube: Kube) -> None:
    ns = quiet_namespace
    run = apply(cluster, ns, run_manifest("finalized"))
    with pytest.raises(StaleCopy):
        await kube.set_finalizers(ns, "finalized", ["mtrl.dev/x"], "1")
    meta = await kube.set_finalizers(ns, "finalized", ["mtrl.dev/x"],
                                     run["metadata"]["resourceVersion"])
    assert meta is not None and meta["finalizers"] == ["mtrl.dev/x"]
    assert await kube.set_finalizers(ns, "never-was", [], "1") is None


async def test_a_kind_that_is_not_served_says_so(kube: Kube, quiet_namespace: str) -> None:
    from mtrl_operator.adapters import kube as kube_module

    kube_module.KINDS["Unserved"] = kube_module.create_namespaced_resource(
        "example.com", "v1", "Unserved", "unserveds")
    try:
        with pytest.raises(NotServed):
            async for _ in kube.list_and_watch("Unserved", {}, quiet_namespace):
                pass
    finally:
        del kube_module.KINDS["Unserved"]


@pytest.mark.parametrize("kind", ["MultiTurnRLRun", "MultiTurnRLTrigger"])
async def test_a_finalizer_goes_only_from_the_list_as_it_was_seen_whatever_the_version(
        cluster: LocalCluster, quiet_namespace: str, kube: Kube, kind: str) -> None:
    """Runs and triggers alike: the removal is conditioned on the finalizer list, not on the
    resourceVersion, which the operator's own status writes move on."""
    ns = quiet_namespace
    manifest = run_manifest("held") if kind == "MultiTurnRLRun" else \
        trigger_manifest("held", "some-bucket")
    cluster.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(manifest))
    meta = await kube.set_finalizers(ns, "held", ["mtrl.dev/a", "mtrl.dev/b"],
                                     _version(cluster, ns, kind), kind=kind)
    assert meta is not None
    # Our own status write moves the resourceVersion on; the removal does not mind.
    before = _version(cluster, ns, kind)
    await kube.apply_status(ns, "held", {"phase": "Running"} if kind == "MultiTurnRLRun"
                            else {"runsCreated": 3}, CONDITION_TYPES, kind=kind)
    assert _version(cluster, ns, kind) != before
    with pytest.raises(StaleCopy):  # someone else changed the list meanwhile
        await kube.remove_finalizer(ns, "held", ["mtrl.dev/a"], "mtrl.dev/a", kind=kind)
    meta = await kube.remove_finalizer(ns, "held", ["mtrl.dev/a", "mtrl.dev/b"], "mtrl.dev/a",
                                       kind=kind)
    assert meta is not None and meta["finalizers"] == ["mtrl.dev/b"]
    await kube.remove_finalizer(ns, "held", ["mtrl.dev/b"], "mtrl.dev/b", kind=kind)
    assert await kube.remove_finalizer(ns, "never-was", [], "mtrl.dev/b", kind=kind) is None


def _version(cluster: LocalCluster, namespace: str, kind: str) -> str:
    out = cluster.kubectl("get", kind.lower(), "held", "-n", namespace, "-o",
                          "jsonpath={.metadata.resourceVersion}")
    return out.stdout.strip()
