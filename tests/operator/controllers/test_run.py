"""The run controller's in-memory bookkeeping and its children's caches, without servers."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

from mtrl_api.run import MultiTurnRLRunStatus, Phase
from mtrl_operator import metrics
from mtrl_operator.controllers.run import Controller
from mtrl_operator.errors import NotPermitted
from mtrl_operator.naming import LABEL_ATTEMPT, LABEL_COMPONENT, LABEL_RUN_UID
from mtrl_operator.reconcile.run import Act, Decision
from mtrl_operator.settings import Settings
from mtrl_rollout.queues import TAG_CLUSTER_ID, TAG_OPERATOR_ID, TAG_RUN_UID, resource_tags


def _body(phase: str) -> dict[str, Any]:
    return {"metadata": {"namespace": "ns", "name": "run", "uid": "u-1"},
            "status": {"phase": phase}}


def _gauge(phase: str) -> float:
    return metrics.RUNS_BY_PHASE.labels(phase=phase)._value.get()


def test_runs_by_phase_gauge_follows_watch_events_in_constant_time() -> None:
    controller = Controller(Settings(), kube=None, aws=None)  # type: ignore[arg-type]
    running, done = _gauge("Running"), _gauge("Succeeded")
    controller.on_run("ADDED", _body("Running"))
    controller.on_run("MODIFIED", _body("Running"))
    assert _gauge("Running") == running + 1
    controller.on_run("MODIFIED", _body("Succeeded"))
    assert (_gauge("Running"), _gauge("Succeeded")) == (running, done + 1)
    controller.on_run("DELETED", _body("Succeeded"))
    assert _gauge("Succeeded") == done


def _child(namespace: str, name: str, run_uid: str) -> dict[str, Any]:
    return {"metadata": {"namespace": namespace, "name": name,
                         "labels": {"mtrl.dev/run-uid": run_uid}}}


def test_a_relist_forgets_children_deleted_while_no_watch_was_open() -> None:
    controller = Controller(Settings(), kube=None, aws=None)  # type: ignore[arg-type]
    for kind, name in (("Job", "a-trainer-1"), ("Deployment", "a-workers")):
        controller.children.on_event(kind, "ADDED", _child("ns", name, "u-a"))
    controller.children.on_event("Job", "ADDED", _child("ns", "b-trainer-1", "u-b"))
    controller.children.on_event("Job", "ADDED", _child("other", "c-trainer-1", "u-c"))

    # The watch of Jobs in "ns" was cut while a's trainer was deleted; the new list lacks it.
    controller.children.on_listed("Job", "ns", [_child("ns", "b-trainer-1", "u-b")])
    assert "u-a" not in controller.children.trainers
    assert set(controller.children.trainers["u-b"]) == {("Job", "b-trainer-1")}
    assert set(controller.children.trainers["u-c"]) == {("Job", "c-trainer-1")}  # another namespace
    assert "u-a" in controller.children.deployments  # another kind

    controller.children.on_listed("Deployment", "*", [])
    assert controller.children.deployments == {}


class _RecordingQueue:
    def __init__(self) -> None:
        self.added: list[Any] = []

    def add(self, key: Any, after: float = 0.0) -> None:
        self.added.append(key)

    def forget(self, key: Any) -> None:
        pass


def test_the_echo_of_our_own_status_write_costs_no_reconcile() -> None:
    controller = Controller(Settings(), kube=None, aws=None)  # type: ignore[arg-type]
    queue = _RecordingQueue()
    controller.queue = queue  # type: ignore[assignment]
    body = {**_body("Provisioning"), "spec": {"a": 1}}
    body["metadata"]["resourceVersion"] = "1"
    controller.on_run("ADDED", body)
    assert len(queue.added) == 1

    # The reconcile wrote status and updated its cached copy; the watch echoes the write.
    controller.runs[("ns", "run")]["status"] = {"phase": "Running"}
    echo = {**_body("Running"), "spec": {"a": 1}}
    echo["metadata"]["resourceVersion"] = "2"
    controller.on_run("MODIFIED", echo)
    assert len(queue.added) == 1
    assert controller.runs[("ns", "run")]["metadata"]["resourceVersion"] == "2"  # still cached

    for change in ({"status": {"phase": "Failed"}}, {"spec": {"a": 2}},
                   {"metadata": {**echo["metadata"], "annotations": {"mtrl.dev/x": "y"}}},
                   {"metadata": {**echo["metadata"], "deletionTimestamp": "2026-01-01T00:00:00Z"}}):
        controller.on_run("MODIFIED", {**echo, **change})
    assert len(queue.added) == 5


class _StatusWriter:
    """Kube's status write as the API server answers it: the write's new resourceVersion
    (3, then 4, ...)."""

    def __init__(self) -> None:
        self.writes: list[dict[str, Any]] = []

    async def apply_status(self, namespace: str, name: str, status: dict[str, Any],
                           own: frozenset[str]) -> str:
        self.writes.append(status)
        return str(2 + len(self.writes))


async def test_an_event_from_before_our_status_write_does_not_undo_it() -> None:
    writer = _StatusWriter()
    controller = Controller(Settings(), kube=writer, aws=None)  # type: ignore[arg-type]
    queue = _RecordingQueue()
    controller.queue = queue  # type: ignore[assignment]
    body = {**_body("Provisioning"), "spec": {"a": 1}}
    body["metadata"]["resourceVersion"] = "1"
    controller.on_run("ADDED", body)
    cached = controller.runs[("ns", "run")]
    await controller._publish(cached, Decision([], MultiTurnRLRunStatus(phase=Phase.RUNNING)))
    assert len(writer.writes) == 1

    # Another writer relabelled the run (resourceVersion 2) before our write (3); the watch
    # delivers that change now, with the status from before ours.
    stale = {**_body("Provisioning"), "spec": {"a": 1}}
    stale["metadata"] = {**stale["metadata"], "resourceVersion": "2", "labels": {"x": "y"}}
    controller.on_run("MODIFIED", stale)
    cached = controller.runs[("ns", "run")]
    assert cached["status"]["phase"] == "Running" and cached["metadata"]["labels"] == {"x": "y"}
    assert len(queue.added) == 1, "nothing a reconcile reads changed"
    assert _gauge("Running") >= 1 and controller.phases[("ns", "run")] == "Running"

    # Our write's echo ends the expectation; from then on the watch has the last word.
    echo = {**_body("Running"), "spec": {"a": 1}}
    echo["metadata"]["resourceVersion"] = "3"
    controller.on_run("MODIFIED", echo)
    assert ("ns", "run") not in controller.expected
    later = {**_body("Failed"), "spec": {"a": 1}}
    later["metadata"]["resourceVersion"] = "4"
    controller.on_run("MODIFIED", later)
    assert controller.runs[("ns", "run")]["status"]["phase"] == "Failed"


async def test_a_second_write_in_one_reconcile_outranks_the_first_ones_echo() -> None:
    """A reconcile that writes twice (Provisioning, then Failed when an action finds the spec
    cannot run): the first write's echo may replace the cached copy between the two. The
    second write must still be what the cache holds until its own echo, or the next
    reconcile provisions the failed run again."""
    writer = _StatusWriter()
    controller = Controller(Settings(), kube=writer, aws=None)  # type: ignore[arg-type]
    controller.queue = _RecordingQueue()  # type: ignore[assignment]
    body = {**_body("Pending"), "spec": {"a": 1}}
    body["metadata"]["resourceVersion"] = "1"
    controller.on_run("ADDED", body)
    working = controller.runs[("ns", "run")]
    await controller._publish(working, Decision([], MultiTurnRLRunStatus(phase=Phase.PROVISIONING)))
    echo = {**_body("Provisioning"), "spec": {"a": 1}}
    echo["metadata"]["resourceVersion"] = "3"
    controller.on_run("MODIFIED", echo)  # the first write's echo, while the actions run
    await controller._publish(working, Decision([], MultiTurnRLRunStatus(phase=Phase.FAILED)))
    assert controller.runs[("ns", "run")]["status"]["phase"] == "Failed"
    late = {**_body("Provisioning"), "spec": {"a": 1}}
    late["metadata"]["resourceVersion"] = "3"  # delivered again, or another copy of it
    controller.on_run("MODIFIED", late)
    assert controller.runs[("ns", "run")]["status"]["phase"] == "Failed"


def test_polls_that_find_nothing_changed_back_off_to_the_resync_period() -> None:
    controller = Controller(Settings(resync_seconds=30), kube=None, aws=None)  # type: ignore[arg-type]
    waiting = Decision([Act.ENSURE_WORKERS], MultiTurnRLRunStatus(phase=Phase.PROVISIONING),
                       requeue_after=2.0)
    delays = [controller._backoff(("ns", "run"), waiting) for _ in range(6)]
    assert delays == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0]

    progressed = Decision([Act.ENSURE_TRAINER], MultiTurnRLRunStatus(phase=Phase.PROVISIONING),
                          requeue_after=2.0)
    assert controller._backoff(("ns", "run"), progressed) == 2.0  # a change starts over
    assert controller._backoff(("ns", "other"), waiting) == 2.0  # per run


def test_a_deleted_run_leaves_nothing_behind_even_when_child_events_come_late() -> None:
    controller = Controller(Settings(), kube=None, aws=None)  # type: ignore[arg-type]
    controller.queue = _RecordingQueue()  # type: ignore[assignment]
    controller.on_run("ADDED", _body("Succeeded"))
    controller.children.on_event("Job", "ADDED", _child("ns", "run-t1", "u-1"))
    controller.children.on_event("ConfigMap", "ADDED", _child("ns", "run-progress", "u-1"))
    controller.on_run("DELETED", _body("Succeeded"))
    # The garbage collector removes the run's children after the run is gone.
    controller.children.on_event("Job", "DELETED", _child("ns", "run-t1", "u-1"))
    controller.children.on_event("ConfigMap", "DELETED", _child("ns", "run-progress", "u-1"))
    controller.children.on_event("Pod", "DELETED", _child("ns", "run-t1-0", "u-1"))
    children = controller.children
    assert (controller.runs, controller.keys_by_uid, children.trainers, children.deployments,
            children.progress, children.pods, controller.phases,
            controller.polls) == ({}, {}, {}, {}, {}, {}, {}, {})


def _pod(name: str, run_uid: str, component: str, **labels: str) -> dict[str, Any]:
    pod = _child("ns", name, run_uid)
    pod["metadata"]["labels"] |= {LABEL_COMPONENT: component, **labels}
    pod["metadata"]["managedFields"] = [{"manager": "kubelet"}]
    return pod


def test_pods_are_cached_by_run_and_read_by_label_without_waking_the_run() -> None:
    controller = Controller(Settings(), kube=None, aws=None)  # type: ignore[arg-type]
    queue = _RecordingQueue()
    controller.queue = queue  # type: ignore[assignment]
    controller.on_run("ADDED", {"metadata": {"namespace": "ns", "name": "run", "uid": "u-1"}})
    queue.added.clear()
    children = controller.children
    for pod in (_pod("run-t2-0", "u-1", "trainer", **{LABEL_ATTEMPT: "2"}),
                _pod("run-t1-0", "u-1", "trainer", **{LABEL_ATTEMPT: "1"}),
                _pod("run-workers-x", "u-1", "worker"), _pod("other-workers-y", "u-2", "worker")):
        children.on_event("Pod", "ADDED", pod)
    assert queue.added == []  # a run is woken by its workloads; its pods are read when it asks
    trainers = children.pods_of("u-1", {LABEL_COMPONENT: "trainer"})
    assert [p["metadata"]["name"] for p in trainers] == ["run-t1-0", "run-t2-0"]
    assert [p["metadata"]["name"] for p in children.pods_of(
        "u-1", {LABEL_COMPONENT: "trainer", LABEL_ATTEMPT: "2"})] == ["run-t2-0"]
    assert "managedFields" not in trainers[0]["metadata"]

    children.on_listed("Pod", "ns", [_pod("run-workers-x", "u-1", "worker")])
    assert set(children.pods) == {"u-1"}  # a relist forgets pods deleted meanwhile
    assert [p["metadata"]["name"] for p in children.pods_of("u-1", {})] == ["run-workers-x"]
    children.forget("u-1")
    assert children.pods_of("u-1", {}) == []


def _node(name: str, instance_type: str, gpus: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": "1",
                         "labels": {"node.kubernetes.io/instance-type": instance_type}},
            "status": {"allocatable": {"nvidia.com/gpu": gpus},
                       "images": [{"names": ["x" * 200], "sizeBytes": 1}] * 50}}


def test_nodes_are_cached_with_only_what_preflight_reads() -> None:
    children = Controller(Settings(), kube=None, aws=None).children  # type: ignore[arg-type]
    assert children.nodes == {}  # watched (MTRL_PREFLIGHT_NODES defaults to true), none yet
    children.on_listed("Node", "", [_node("a", "ml.p5.48xlarge", "8"),
                                     _node("b", "ml.m5.large", "0")])
    assert children.nodes["a"] == {
        "metadata": {"name": "a", "labels": {"node.kubernetes.io/instance-type": "ml.p5.48xlarge"},
                     "resourceVersion": "1"},
        "status": {"allocatable": {"nvidia.com/gpu": "8"}}}
    children.on_event("Node", "DELETED", _node("a", "ml.p5.48xlarge", "8"))
    children.on_listed("Node", "", [_node("c", "ml.p5.48xlarge", "8")])
    assert set(children.nodes) == {"c"}


def test_nodes_are_not_watched_when_preflight_does_not_check_them() -> None:
    children = Controller(Settings(preflight_nodes=False), kube=None,  # type: ignore[arg-type]
                          aws=None).children
    assert children.nodes is None
    children.on_event("Node", "ADDED", _node("a", "ml.p5.48xlarge", "8"))
    assert children.nodes is None


class _RefusedThenListed:
    """list_and_watch as an API server answers right after a restart: 403 (its authorizer has
    not read the RBAC objects yet), then the list, then a watch that stays open."""

    def __init__(self, objs: list[dict[str, Any]]) -> None:
        self.objs, self.calls = objs, 0

    async def list_and_watch(self, kind: str, labels: dict[str, str],
                             namespace: str) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
        self.calls += 1
        if self.calls == 1:
            raise NotPermitted(f"{kind} is forbidden")
        yield "LISTED", self.objs
        await asyncio.Event().wait()


async def _until(check: Any, what: str) -> None:
    deadline = time.monotonic() + 30
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_a_refused_watch_is_tried_again_until_the_api_server_permits_it() -> None:
    node = _node("a", "ml.p5.48xlarge", "8")
    job = {"metadata": {"name": "run-t1", "namespace": "ns", "resourceVersion": "1",
                        "labels": {LABEL_COMPONENT: "trainer", LABEL_RUN_UID: "u-1"}}}
    kubes = {"Node": _RefusedThenListed([node]), "Job": _RefusedThenListed([job])}
    controllers = {kind: Controller(Settings(), kube=kube, aws=None)  # type: ignore[arg-type]
                   for kind, kube in kubes.items()}
    watches = [asyncio.create_task(controllers[kind].children._watch(kind, None, ns))
               for kind, ns in (("Node", ""), ("Job", "ns"))]
    try:
        nodes = controllers["Node"].children
        await _until(lambda: kubes["Node"].calls == 1 and nodes.nodes is None,
                     "preflight to stop checking nodes while they are refused")
        await _until(lambda: nodes.nodes is not None and set(nodes.nodes) == {"a"},
                     "the nodes once the API server permits the list")
        jobs = controllers["Job"].children
        await _until(lambda: ("Job", "run-t1") in jobs.trainers.get("u-1", {}),
                     "the run's Job once the API server permits the list")
        assert kubes["Job"].calls == 2
    finally:
        for watch in watches:
            watch.cancel()


def test_a_relist_wakes_only_the_runs_whose_children_changed() -> None:
    controller = Controller(Settings(), kube=None, aws=None)  # type: ignore[arg-type]
    queue = _RecordingQueue()
    controller.queue = queue  # type: ignore[assignment]
    for uid in ("u-a", "u-b"):
        controller.on_run("ADDED", {"metadata": {"namespace": "ns", "name": uid, "uid": uid}})
    jobs = [_child("ns", f"{uid}-t1", uid) for uid in ("u-a", "u-b")]
    for job in jobs:
        job["metadata"]["resourceVersion"] = "1"
        controller.children.on_event("Job", "ADDED", job)
    queue.added.clear()

    changed = _child("ns", "u-b-t1", "u-b")
    changed["metadata"]["resourceVersion"] = "2"
    controller.children.on_listed("Job", "ns", [jobs[0], changed])
    assert queue.added == [("ns", "u-b")]


CLUSTER = "c0ffee00-0000-4000-8000-000000000001"  # this cluster's kube-system UID
OURS = Settings(cluster_id=CLUSTER, sweep_min_age_seconds=0)


def _tags(uid: str, namespace: str = "ns", operator_id: str = "default",
          cluster_id: str | None = CLUSTER) -> dict[str, str]:
    return resource_tags(uid, namespace, "run", "queue", operator_id, cluster_id or "")


class _World:
    """Runs and their tagged resources in a shared AWS account, where a run is created
    between any two reads. `tagged` answers as the tagging API does to the filters the
    sweeper sends: an operator id alone (as it once did), or the owner's id and cluster."""

    def __init__(self, resources: dict[str, dict[str, str]] | None = None,
                 runs: set[str] | None = None) -> None:
        self.runs = {"u-old"} if runs is None else runs
        self.resources = {"arn:old": _tags("u-old"), "arn:gone": _tags("u-gone")} \
            if resources is None else resources
        self.deleted: list[str] = []
        self.reads = 0

    def _between_reads(self) -> None:
        self.reads += 1
        if self.reads == 1:  # a run created, and its first queue, after the first read
            self.runs.add("u-new")
            self.resources["arn:new"] = _tags("u-new")

    async def uids(self, kind: str, scopes: list[str]) -> set[str]:
        known = set(self.runs)
        self._between_reads()
        return known

    async def tagged(self, owner: Any) -> Any:
        if isinstance(owner, str):  # the operator id alone: run UID -> ARNs
            found: Any = {}
            for arn, tags in self.resources.items():
                if tags.get(TAG_OPERATOR_ID) == owner:
                    found.setdefault(tags[TAG_RUN_UID], []).append(arn)
        else:
            found = [(arn, dict(tags)) for arn, tags in self.resources.items()
                     if tags.get(TAG_OPERATOR_ID) == owner.operator_id
                     and tags.get(TAG_CLUSTER_ID) == owner.cluster_id]
        self._between_reads()
        return found

    async def delete_by_arn(self, arn: str, cluster: str) -> bool:
        self.deleted.append(arn)
        return True


async def test_the_sweeper_never_deletes_a_run_made_between_its_two_reads() -> None:
    """Tags first, runs second: a run made in between is in the second read, and its fresh
    resources were not in the first. (Runs first swept the new run's queue.)"""
    world = _World()
    controller = Controller(OURS, kube=world, aws=world)  # type: ignore[arg-type]
    assert await controller.sweep_once() == 1
    assert world.deleted == ["arn:gone"]


async def test_the_sweeper_touches_only_what_this_cluster_and_install_made() -> None:
    """One AWS account, several installs, every one with the chart's default operator id: a
    prod cluster, an install of this cluster watching other namespaces, an older operator
    that wrote no cluster tag. Each had its resources deleted by this sweeper at every pass
    (their runs are not in this cluster, or not in its namespaces)."""
    world = _World({
        "arn:ours-gone": _tags("u-gone", namespace="team-a"),
        "arn:other-cluster": _tags("u-prod", namespace="team-a",
                                   cluster_id="0ddba11-0000-4000-8000-000000000002"),
        "arn:other-namespace": _tags("u-b", namespace="team-b"),
        "arn:older-operator": _tags("u-old-version", namespace="team-a", cluster_id=None),
    }, runs=set())
    settings = Settings(cluster_id=CLUSTER, sweep_min_age_seconds=0, namespaces=["team-a"])
    controller = Controller(settings, kube=world, aws=world)  # type: ignore[arg-type]
    await controller.sweep_once()
    assert world.deleted == ["arn:ours-gone"]


async def test_the_sweeper_waits_the_minimum_age_from_its_first_sighting() -> None:
    """An orphan is deleted only once seen as one for sweepMinAgeSeconds: nothing younger is
    swept, whoever made it. (Every orphan went at its first sighting.)"""
    world = _World({"arn:gone": _tags("u-gone")}, runs=set())
    controller = Controller(Settings(cluster_id=CLUSTER, sweep_min_age_seconds=600),
                            kube=world, aws=world)  # type: ignore[arg-type]
    assert await controller.sweep_once() == 0 and world.deleted == []
    controller.orphans_seen = {arn: t - 601 for arn, t in controller.orphans_seen.items()}
    assert await controller.sweep_once() == 1 and world.deleted == ["arn:gone"]
