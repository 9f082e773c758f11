"""Runs finish, keep a complete status and leave nothing behind through Kubernetes faults.

Three faults, each with an operator of its own in a namespace of its own:

- the API server is restarted while runs train and again while one is torn down;
- the operator's connections, watch streams included, are severed through a proxy
  (`kubeproxy.KubeProxy`), and watches are kept from coming back while the trainer finishes or
  while a run's children are deleted;
- half of the operator's writes to a run's status are answered 409 Conflict by the proxy, while
  another writer relabels the runs and writes a condition of its own.

After each: every run reached its right phase with a complete status, exactly one trainer
workload per attempt and one worker Deployment existed, ECS started exactly maxReplicas tasks,
and once deleted nothing is left in the cluster or in moto. The test itself talks to the API
server and moto directly, never through the faults.
"""

from __future__ import annotations

import datetime as dt
import json
import re
import textwrap
import threading
import time
import urllib.request
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from lightkube import Client, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.batch_v1 import Job
from lightkube.types import PatchType

from mtrl_operator.adapters.kube import MultiTurnRLRun
from mtrl_operator.naming import LABEL_ATTEMPT, LABEL_MANAGED_BY, LABEL_RUN_UID, MANAGED_BY, RunNames
from mtrl_testbed.chart_identity import ChartIdentity
from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.operator import OperatorProcess
from mtrl_testbed.ports import wait_until
from tests.operator.runs import (
    FAIL,
    HANG,
    apply,
    aws_leftovers,
    get,
    k8s_leftovers,
    names_of,
    run_manifest,
    wait_for,
)
from tests.robustness.kubeproxy import KubeProxy, watches_of

pytestmark = [pytest.mark.cluster, pytest.mark.aws, pytest.mark.slow]

RUN_TIMEOUT_S = 120  # generous: another test run may share the CPUs
# Once a fault ends, runs move on within this. The operator's own watch timeouts are 240-300 s:
# a run that only recovers when a silent watch times out fails here.
RECOVERY_S = 30
STEPS = 3
# A trainer that reports STEPS steps of progress to the run's ConfigMap, STEP_SECONDS apart.
# With a GATE file it waits until the test creates that file: a trainer that could finish on
# its own might end before the slowest run is Running, and "every run Running" never come.
# A report the API server cannot take (restarting) is retried, never skipped, so the final
# status must show every step; the last one carries the outcome and this launch's number, as
# the real trainer's does (the operator's evidence that the run trained).
REPORTING = ["python", "-c", textwrap.dedent(f"""\
    import os, time
    from mtrl_trainer.progress import ConfigMapSink
    sink = ConfigMapSink(os.environ["MTRL_PROGRESS_CONFIGMAP"], os.environ["MTRL_NAMESPACE"])
    while not os.path.exists(os.environ.get("GATE", "/")):
        time.sleep(0.2)
    for step in range(1, {STEPS + 1}):
        time.sleep(float(os.environ["STEP_SECONDS"]))
        deadline = time.monotonic() + 120
        while True:
            try:
                last = {{"outcome": "Succeeded"}} if step == {STEPS} else {{}}
                sink.report({{"step": step, "totalSteps": {STEPS}, "rewardMean": step / 10,
                             "trainedSteps": step, "launch": int(os.environ["MTRL_LAUNCH"]),
                             **last}})
                break
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    """)]
CONFLICT_RATE = 0.5
SEED = 20240611
ECS = {"backend": "ecs-fargate", "cpu": 256, "memory": 512, "minReplicas": 1, "maxReplicas": 3}


def _trainer(command: list[str], step_seconds: float = 2,
             gate: Path | None = None) -> dict[str, Any]:
    env = [{"name": "STEP_SECONDS", "value": str(step_seconds)}]
    return {"command": command, "env": env + ([{"name": "GATE", "value": str(gate)}] if gate else [])}


# --------------------------------------------------------------------------- observers


class ChildLedger(threading.Thread):
    """Every UID of the trainer Jobs and worker Deployments seen in the namespace, polled twice
    a second: a duplicate, or a child deleted and made again, shows as a second UID."""

    def __init__(self, client: Client, namespace: str) -> None:
        super().__init__(daemon=True, name="child-ledger")
        self.client, self.namespace = client, namespace
        self.uids: dict[tuple[str, str, str], set[str]] = defaultdict(set)  # (run uid, kind, attempt)
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            for resource in (Job, Deployment):
                try:
                    for obj in self.client.list(resource, namespace=self.namespace,
                                                labels={LABEL_MANAGED_BY: MANAGED_BY}):
                        labels = obj.metadata.labels or {}
                        key = (labels.get(LABEL_RUN_UID, ""), resource.__name__,
                               labels.get(LABEL_ATTEMPT, ""))
                        self.uids[key].add(obj.metadata.uid)
                except Exception:  # the API server may be down: look again
                    pass
            self._halt.wait(0.5)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=15)

    def children(self, uid: str) -> dict[str, int]:
        """{"Job@1": number of UIDs seen, "Deployment@": ...} for one run."""
        return {f"{kind}@{attempt}": len(uids)
                for (run, kind, attempt), uids in self.uids.items() if run == uid}


class ForeignWriter(threading.Thread):
    """Another controller writing the runs at the same time, as a well-behaved one does: read,
    change, write back with the resourceVersion it read. It relabels each run and refreshes a
    condition of its own in the status, turn about, every 0.2 s."""

    CONDITION = "ExternalCheck"

    def __init__(self, client: Client, namespace: str, names: list[str]) -> None:
        super().__init__(daemon=True, name="foreign-writer")
        self.client, self.namespace, self.names = client, namespace, names
        self.writes: Counter[str] = Counter()
        self.conflicts = 0
        self.written: set[str] = set()
        self.lost = 0  # times a condition it had written was gone when it looked again
        self._halt = threading.Event()

    def run(self) -> None:
        turn = 0
        while not self._halt.is_set():
            for name in self.names:
                try:
                    self._write(name, turn)
                except ApiError as exc:
                    if exc.status.code == 409:
                        self.conflicts += 1
                    elif exc.status.code != 404:
                        raise
            turn += 1
            self._halt.wait(0.2)

    def _write(self, name: str, turn: int) -> None:
        run = self.client.get(MultiTurnRLRun, name, namespace=self.namespace)
        version = run.metadata.resourceVersion
        if turn % 2 == 0:
            self.client.patch(MultiTurnRLRun, name, {"metadata": {
                "resourceVersion": version, "labels": {"example.com/audited": str(turn)}}},
                namespace=self.namespace, patch_type=PatchType.MERGE)
            self.writes["labels"] += 1
            return
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        ours = [c for c in (run.status or {}).get("conditions", []) if c["type"] == self.CONDITION]
        if name in self.written and not ours:
            self.lost += 1  # someone wrote the status without reading ours first
        conditions = [c for c in (run.status or {}).get("conditions", [])
                      if c["type"] != self.CONDITION]
        conditions.append({"type": self.CONDITION, "status": "True", "reason": "Audited",
                           "message": f"turn {turn}", "lastTransitionTime": now})
        self.client.patch(MultiTurnRLRun.Status, name, {
            "metadata": {"resourceVersion": version}, "status": {"conditions": conditions}},
            namespace=self.namespace, patch_type=PatchType.MERGE)
        self.writes["status"] += 1
        self.written.add(name)

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=15)


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def own_namespace(cluster: LocalCluster) -> Iterator[str]:
    """Not `t-*`: the shared operator must not race this test's operator for the runs."""
    with cluster.namespace(f"robust-kube-{uuid.uuid4().hex[:6]}") as name:
        yield name


@pytest.fixture
def admin(cluster: LocalCluster) -> Client:
    """The test's own client, straight to the API server."""
    return Client(config=KubeConfig.from_file(cluster.kubeconfig), field_manager="kube-faults")


@pytest.fixture
def ledger(admin: Client, own_namespace: str) -> Iterator[ChildLedger]:
    running = ChildLedger(admin, own_namespace)
    running.start()
    yield running
    running.stop()


@pytest.fixture
def start_operator(operator_factory: Callable[..., OperatorProcess],
                   own_namespace: str) -> Iterator[Callable[..., OperatorProcess]]:
    """Start this test's operator and wait until it serves; stop it when the test ends, so it
    does not spin against a closed proxy for the rest of the session."""
    started: list[OperatorProcess] = []

    def start(operator_id: str, kubeconfig: Path | None = None, **env: str) -> OperatorProcess:
        proc = operator_factory(kubeconfig=kubeconfig, MTRL_OPERATOR_ID=operator_id,
                                MTRL_NAMESPACES=own_namespace, **env)
        started.append(proc)
        wait_until(lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{proc.health_port}/healthz", timeout=2).status == 200,
            60, f"operator {operator_id}'s liveness endpoint")
        return proc

    yield start
    for proc in started:
        proc.stop()


# --------------------------------------------------------------------------- helpers


def _phase(cluster: LocalCluster, namespace: str, name: str) -> str | None:
    return ((get(cluster, namespace, name) or {}).get("status") or {}).get("phase")


def _wait_phases(cluster: LocalCluster, namespace: str, wanted: dict[str, set[str]],
                 timeout: float, what: str, between: Callable[[], None] | None = None) -> float:
    """Wait until each run's phase is one of its wanted ones; no run may end in another
    terminal phase. `between` runs after each look that found a run not there yet (default:
    sleep half a second). Returns the seconds it took."""
    began = time.monotonic()
    while True:
        phases = {name: _phase(cluster, namespace, name) for name in wanted}
        for name, phase in phases.items():
            assert phase not in {"Succeeded", "Failed"} - wanted[name], \
                f"{name} ended {phase}, not {wanted[name]}: {phases}"
        if all(phases[name] in ok for name, ok in wanted.items()):
            return time.monotonic() - began
        assert time.monotonic() - began < timeout, \
            f"timed out after {timeout}s waiting for {what}; phases: {phases}"
        if between is None:
            time.sleep(0.5)
        else:
            between()


def _finished(cluster: LocalCluster, namespace: str, name: str, phase: str,
              steps: int | None) -> Callable[[], dict[str, Any] | None]:
    """The run in its terminal phase with every progress step copied into its status."""
    def check() -> dict[str, Any] | None:
        run = get(cluster, namespace, name)
        status = (run or {}).get("status") or {}
        if status.get("phase") != phase:
            return None
        if steps is not None and (status.get("progress") or {}).get("step") != steps:
            return None
        return run
    return check


def _assert_complete(run: dict[str, Any], phase: str = "Succeeded", attempts: int = 1,
                     steps: int | None = STEPS) -> None:
    """Nothing of the run's story lost: phase, times, attempts, generation and conditions."""
    status, name = run["status"], run["metadata"]["name"]
    assert status["phase"] == phase, (name, status)
    assert status.get("startTime") and status.get("completionTime"), (name, status)
    assert status["completionTime"] >= status["startTime"], (name, status)
    assert status["attempts"] == attempts, (name, status)
    assert status["observedGeneration"] == run["metadata"]["generation"], (name, status)
    conditions = {c["type"]: c["status"] for c in status["conditions"]}
    succeeded = phase == "Succeeded"
    expected = {"QueuesReady": "True", "WorkersReady": "True", "Progressing": "False",
                "Complete": str(succeeded), "Failed": str(not succeeded)}
    assert {k: conditions.get(k) for k in expected} == expected, (name, conditions)
    if steps is not None:
        assert status["progress"]["step"] == steps, (name, status["progress"])
        assert status["progress"]["display"] == f"{steps}/{STEPS}", (name, status["progress"])


def _phase_events(cluster: LocalCluster, namespace: str, name: str) -> Counter[str]:
    """The run's Events that announce a phase, by reason."""
    out = cluster.kubectl("get", "events", "-n", namespace, "--field-selector",
                          f"involvedObject.name={name}", "-o", "json")
    phases = {"Provisioning", "Running", "Succeeded", "Failed", "Terminating"}
    return Counter(e["reason"] for e in json.loads(out.stdout)["items"] if e["reason"] in phases)


def _job_succeeded(client: Client, namespace: str, uid: str) -> bool:
    jobs = client.list(Job, namespace=namespace, labels={LABEL_RUN_UID: uid})
    return any(((job.status and job.status.succeeded) or 0) >= 1 for job in jobs)


def _jobs(client: Client, namespace: str, uid: str) -> int:
    return len(list(client.list(Job, namespace=namespace, labels={LABEL_RUN_UID: uid})))


def _tasks_started(names: RunNames) -> int:
    ecs = boto3.client("ecs")
    return sum(len(ecs.list_tasks(cluster="default", startedBy=names.started_by,
                                  desiredStatus=status)["taskArns"])
               for status in ("RUNNING", "STOPPED"))


def _created(operator: OperatorProcess) -> dict[str, int]:
    """What the operator created, by kind, from its own metrics."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{operator.metrics_port}/metrics",
                                  timeout=5).read().decode()
    return {m[1]: int(float(m[2])) for m in re.finditer(
        r'^mtrl_resources_created_total\{kind="([^"]+)"\} (\S+)$', text, re.M)}


def _delete_and_check_clean(cluster: LocalCluster, namespace: str,
                            names: list[RunNames]) -> None:
    cluster.kubectl("delete", "mtrlrun", "--all", "-n", namespace, "--wait=false")
    for run in names:
        wait_for(lambda r=run: get(cluster, namespace, r.name) is None, RUN_TIMEOUT_S,
                 f"{run.name} to be deleted", interval=1)
        wait_for(lambda r=run: not aws_leftovers(r) and not k8s_leftovers(
            cluster, namespace, r.uid), 60, f"nothing left of {run.name}", interval=1)


def _assert_no_duplicates(ledger: ChildLedger, runs: dict[RunNames, dict[str, Any]]) -> None:
    """One trainer Job per attempt, one worker Deployment for Kubernetes workers and, for ECS
    workers, exactly maxReplicas tasks started (real ECS and moto alike: no lost answers here)."""
    for names, spec in runs.items():
        attempts = spec.get("attempts", 1)
        expected = {f"Job@{a}": 1 for a in range(1, attempts + 1)}
        if spec["workers"]["backend"] == "kubernetes":
            expected["Deployment@"] = 1
        assert ledger.children(names.uid) == expected, (names.name, ledger.children(names.uid))
        if spec["workers"]["backend"] == "ecs-fargate":
            assert _tasks_started(names) == spec["workers"]["maxReplicas"], names.name


def _manifests(runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: run_manifest(name, **{k: v for k, v in spec.items() if k != "attempts"})
            for name, spec in runs.items()}


def _apply_all(cluster: LocalCluster, namespace: str,
               runs: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    manifests = _manifests(runs)
    for manifest in manifests.values():
        apply(cluster, namespace, manifest)
    return {name: manifest["spec"] | {"attempts": runs[name].get("attempts", 1)}
            for name, manifest in manifests.items()}


# --------------------------------------------------------------------------- the tests

# These tests are about an operator that rides out API-server outages and cut watches in one
# process. A leader that cannot renew its Lease for the renew deadline exits on purpose (and its
# kubelet restarts it: test_active_standby.py shows it), and a restarted API server refuses a
# ServiceAccount (403) for a while until its RBAC caches fill. So here the Lease outlasts every
# outage the tests make, even on a loaded machine.
OUTLASTS_OUTAGES = {"MTRL_LEASE_DURATION_SECONDS": "90", "MTRL_RENEW_DEADLINE_SECONDS": "75",
                    "MTRL_RETRY_PERIOD_SECONDS": "2"}


def test_runs_survive_api_server_restarts(
        cluster: LocalCluster, own_namespace: str, ledger: ChildLedger, tmp_path: Path,
        start_operator: Callable[..., OperatorProcess]) -> None:
    ns = own_namespace
    gate = tmp_path / "trainers-may-report"
    operator = start_operator("kube-restart", **OUTLASTS_OUTAGES)
    specs = _apply_all(cluster, ns, {
        "restart-kube": {"trainer": _trainer(REPORTING, step_seconds=4, gate=gate)},
        "restart-ecs": {"trainer": _trainer(REPORTING, step_seconds=4, gate=gate),
                        "workers": ECS},
        "restart-hang": {"trainer": _trainer(HANG)},
    })
    # 1. While every run trains (queues, workers and trainer exist; no trainer has finished).
    _wait_phases(cluster, ns, {name: {"Running"} for name in specs}, RUN_TIMEOUT_S,
                 "every run to be Running")
    names = {names_of(get(cluster, ns, name), "kube-restart"): spec for name, spec in specs.items()}
    gate.touch()  # the trainers report their steps through the restart
    downtimes = [cluster.restart_apiserver()]
    recovered = _wait_phases(cluster, ns, {"restart-kube": {"Succeeded"},
                                           "restart-ecs": {"Succeeded"},
                                           "restart-hang": {"Running"}},
                             RECOVERY_S + 3 * 4,  # the trainers may have all 3 steps left
                             "the reporting runs to succeed after the restart")
    for name in ("restart-kube", "restart-ecs"):
        _assert_complete(wait_for(_finished(cluster, ns, name, "Succeeded", STEPS), RECOVERY_S,
                                  f"{name}'s full progress"))
    # 2. While a run is torn down: deleted mid-training, restarted as its teardown begins.
    cluster.kubectl("delete", "mtrlrun", "restart-hang", "-n", ns, "--wait=false")
    downtimes.append(cluster.restart_apiserver())
    teardown = time.monotonic()
    wait_for(lambda: get(cluster, ns, "restart-hang") is None, RECOVERY_S,
             "restart-hang's teardown to finish after the second restart", interval=0.5)
    teardown = time.monotonic() - teardown
    _delete_and_check_clean(cluster, ns, list(names))
    ledger.stop()
    _assert_no_duplicates(ledger, names)
    assert operator.alive
    print(f"\nKubernetes faults, API server restarts: {len(downtimes)} restarts "
          f"(down {', '.join(f'{d:.1f}s' for d in downtimes)}); {len(names)} runs; "
          f"Succeeded {recovered:.1f}s after the first restart; the run deleted just before "
          f"the second was gone {teardown:.1f}s after the API server was back; "
          f"created by the operator: {_created(operator)}")


def test_runs_finish_when_watch_streams_are_cut(
        cluster: LocalCluster, own_namespace: str, admin: Client, ledger: ChildLedger,
        tmp_path: Path, start_operator: Callable[..., OperatorProcess],
        operator_identity: ChartIdentity) -> None:
    ns = own_namespace
    gate = tmp_path / "trainers-may-report"
    with KubeProxy(cluster, tmp_path, token=operator_identity.token) as proxy:
        operator = start_operator("kube-cuts", kubeconfig=proxy.kubeconfig, **OUTLASTS_OUTAGES)
        specs = _apply_all(cluster, ns, {
            "cut-kube": {"trainer": _trainer(REPORTING, gate=gate)},
            "cut-ecs": {"trainer": _trainer(REPORTING, gate=gate), "workers": ECS},
            "cut-hang": {"trainer": _trainer(HANG)},
        })

        # 1. Every connection severed every 1.5 s while the runs provision.
        def cut_and_wait() -> None:
            proxy.cut()
            time.sleep(1.5)

        _wait_phases(cluster, ns, {name: {"Running"} for name in specs}, RUN_TIMEOUT_S,
                     "every run to be Running through cuts", between=cut_and_wait)
        provisioning_cuts = proxy.counts.cuts
        names = {names_of(get(cluster, ns, name), "kube-cuts"): spec
                 for name, spec in specs.items()}
        uid = {n.name: n.uid for n in names}
        # 2. The trainers finish while the operator cannot reach the API server at all: it
        #    must find out from its watches once they come back, not minutes later.
        with proxy.partition():
            gate.touch()
            wait_for(lambda: all(_job_succeeded(admin, ns, uid[name])
                                 for name in ("cut-kube", "cut-ecs")), RUN_TIMEOUT_S,
                     "both trainers to finish during the partition")
        recovered = _wait_phases(cluster, ns, {"cut-kube": {"Succeeded"}, "cut-ecs": {"Succeeded"},
                                               "cut-hang": {"Running"}}, RECOVERY_S,
                                 "both runs to succeed once the partition ends")
        for name in ("cut-kube", "cut-ecs"):
            _assert_complete(wait_for(_finished(cluster, ns, name, "Succeeded", STEPS),
                                      RECOVERY_S, f"{name}'s full progress"))
        # 3. The children's watches are cut and kept away while a run is deleted: the trainer
        #    it deletes is gone before the watch is back, so no DELETED event ever arrives.
        with proxy.partition(watches_of("jobs", "deployments", "configmaps")):
            cluster.kubectl("delete", "mtrlrun", "cut-hang", "-n", ns, "--wait=false")
            wait_for(lambda: _jobs(admin, ns, uid["cut-hang"]) == 0, RECOVERY_S,
                     "the operator to delete cut-hang's trainer during the watch partition")
            time.sleep(1)
        began = time.monotonic()
        wait_for(lambda: get(cluster, ns, "cut-hang") is None, RECOVERY_S,
                 "cut-hang's teardown to finish once its child watches are back", interval=0.5)
        teardown = time.monotonic() - began
        _delete_and_check_clean(cluster, ns, list(names))
        ledger.stop()
        _assert_no_duplicates(ledger, names)
        assert operator.alive
        counts = proxy.counts
        print(f"\nKubernetes faults, cut connections: {counts.cuts} cuts "
              f"({provisioning_cuts} while provisioning, 2 partitions) severed "
              f"{counts.connections_cut} connections; {counts.refused} requests refused during "
              f"partitions; watch requests by resource: {dict(counts.watches)}; "
              f"{len(names)} runs; Succeeded {recovered:.1f}s after the partition; the deleted "
              f"run gone {teardown:.1f}s after its watches came back; "
              f"{counts.requests} requests through the proxy")


def test_runs_finish_with_full_status_through_status_conflicts(
        cluster: LocalCluster, own_namespace: str, admin: Client, ledger: ChildLedger,
        tmp_path: Path, start_operator: Callable[..., OperatorProcess],
        operator_identity: ChartIdentity) -> None:
    ns = own_namespace
    with KubeProxy(cluster, tmp_path, conflict_rate=CONFLICT_RATE, seed=SEED,
                   token=operator_identity.token) as proxy:
        operator = start_operator("kube-conflicts", kubeconfig=proxy.kubeconfig)
        specs = _apply_all(cluster, ns, {
            "conflict-kube": {"trainer": _trainer(REPORTING, step_seconds=1)},
            "conflict-ecs": {"trainer": _trainer(REPORTING, step_seconds=1), "workers": ECS},
            "conflict-fail": {"trainer": _trainer(FAIL), "lifecycle": {"backoffLimit": 1},
                              "attempts": 2},
        })
        writer = ForeignWriter(admin, ns, list(specs))
        writer.start()
        try:
            _wait_phases(cluster, ns, {"conflict-kube": {"Succeeded"},
                                       "conflict-ecs": {"Succeeded"},
                                       "conflict-fail": {"Failed"}}, RUN_TIMEOUT_S,
                         "every run to reach its terminal phase through conflicts")
            runs = {name: wait_for(_finished(cluster, ns, name, phase, steps), RECOVERY_S,
                                   f"{name}'s full status")
                    for name, phase, steps in (("conflict-kube", "Succeeded", STEPS),
                                               ("conflict-ecs", "Succeeded", STEPS),
                                               ("conflict-fail", "Failed", None))}
        finally:
            writer.stop()
        _assert_complete(runs["conflict-kube"])
        _assert_complete(runs["conflict-ecs"])
        _assert_complete(runs["conflict-fail"], phase="Failed", attempts=2, steps=None)
        failed = next(c for c in runs["conflict-fail"]["status"]["conditions"]
                      if c["type"] == "Failed")
        assert failed["reason"] == "BackoffLimitExceeded", failed
        for name in runs:  # a write answered 409 took no effect: its Event comes once, later
            events = _phase_events(cluster, ns, name)
            assert events and set(events.values()) == {1}, (name, events)
        names = {names_of(run, "kube-conflicts"): specs[name] for name, run in runs.items()}
        _delete_and_check_clean(cluster, ns, list(names))
        ledger.stop()
        _assert_no_duplicates(ledger, names)
        assert operator.alive
        counts = proxy.counts
        assert counts.conflicts_injected > 0
        # Status by server-side apply owns only the operator's own conditions.
        assert writer.writes["status"] > 0 and writer.lost == 0, writer.lost
        print(f"\nKubernetes faults, status conflicts: {counts.conflicts_injected} of "
              f"{counts.status_writes} status writes answered 409 by the proxy; 409s the "
              f"API server itself returned (Conflict: another writer got there first): "
              f"{dict(counts.conflicts_from_server)}; the other writer made "
              f"{dict(writer.writes)} writes and lost {writer.conflicts} races; its condition "
              f"was overwritten {writer.lost} times; "
              f"{len(names)} runs")
