"""PyTorchJob and HyperPodPyTorchJob launchers against the real API server.

PyTorchJobs meet Kubeflow's real training operator (v1.9.3, `LocalCluster(...,
training_operator=True)`): its webhook admits or refuses them, it creates their pods and
Services, and it writes their conditions; the node agent runs the pods. HyperPodPyTorchJob's
operator is closed source: its CRD is reconstructed (tests/fixtures) and the test plays its
status transitions, or `StandInTrainingOperators` does."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.operator import OperatorProcess
from tests.operator.runs import (
    apply,
    condition,
    get,
    names_of,
    report_outcome,
    run_manifest,
    wait_clean,
    wait_for,
    wait_phase,
)
from tests.operator.training_operators import StandInTrainingOperators

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "thirdparty-crds"
pytestmark = [pytest.mark.cluster, pytest.mark.aws, pytest.mark.slow]
STANDIN_TRAINER = ["python", "-m", "mtrl_testbed.standin_trainer", "--step-seconds", "0.2"]


@pytest.fixture(scope="module")
def launcher_crds(cluster: LocalCluster) -> None:
    """HyperPod's CRD; the cluster's training operator installed PyTorchJob's own."""
    cluster.install_crds(FIXTURES / "sagemaker.amazonaws.com_hyperpodpytorchjobs.yaml")


def _set_conditions(cluster: LocalCluster, resource: str, namespace: str, name: str,
                    *types: str, check: bool = True) -> None:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    conditions = [{"type": t, "status": "True", "reason": t, "message": f"job {t.lower()}",
                   "lastTransitionTime": now, "lastUpdateTime": now} for t in types]
    cluster.kubectl("patch", resource, name, "-n", namespace, "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": {"conditions": conditions}}),
                    check=check)


def _set_history(cluster: LocalCluster, resource: str, namespace: str, name: str,
                 history: list[tuple[str, int]]) -> None:
    """True conditions with lastTransitionTimes `seconds` after a minute ago."""
    start = datetime.now(UTC) - timedelta(minutes=1)
    conditions = [{"type": t, "status": "True", "reason": t, "message": f"job {t.lower()}",
                   "lastTransitionTime": (start + timedelta(seconds=sec)).strftime(
                       "%Y-%m-%dT%H:%M:%SZ")} for t, sec in history]
    cluster.kubectl("patch", resource, name, "-n", namespace, "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": {"conditions": conditions}}))


def _workload(cluster: LocalCluster, resource: str, namespace: str) -> dict:
    def found() -> dict | None:
        items = json.loads(cluster.kubectl("get", resource, "-n", namespace, "-o",
                                           "json").stdout)["items"]
        return items[0] if items else None

    return wait_for(found, 60, f"a {resource} to be created")


def test_the_pytorchjob_the_operator_renders_passes_the_real_webhook(
        cluster: LocalCluster, operator: OperatorProcess, namespace: str) -> None:
    """Two nodes of eight GPUs: a Master and a Worker, admitted by the training operator's
    validating webhook (which refuses a job without a container named `pytorch`, or with a
    name that is not a DNS-1035 label), with one restartPolicy, on the replica."""
    resource = "pytorchjobs.kubeflow.org"
    job = _gpu_run(cluster, namespace, "PyTorchJob", resource)
    meta = job["metadata"]
    # A t-* namespace is not one HyperPod auto-resume acts in: the operator retries, so
    # nothing else may (docs/hyperpod.md, "Who retries").
    assert "sagemaker.amazonaws.com/enable-job-auto-resume" not in (meta.get("annotations") or {})
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1 and specs["Worker"]["replicas"] == 1
    assert specs["Master"]["restartPolicy"] == specs["Worker"]["restartPolicy"] == "Never"
    policy = job["spec"]["runPolicy"]  # the controller adds its defaults (suspend: false)
    assert policy["cleanPodPolicy"] == "Running" and "backoffLimit" not in policy, policy
    pod = specs["Master"]["template"]["spec"]
    assert "restartPolicy" not in pod
    assert "--master-addr=$(MASTER_ADDR)" in pod["containers"][0]["command"]
    _assert_gpu_pod(pod)
    # The real controller took it: its Created condition, and no warning about the template.
    wait_for(lambda: "Created" in _condition_types(cluster, resource, namespace, meta["name"]),
             60, "the training operator's Created condition")
    warnings = _event_reasons(cluster, namespace, meta["name"], "Warning")
    assert "SetPodTemplateRestartPolicy" not in warnings, warnings
    names = names_of(get(cluster, namespace, "gpu"))
    cluster.kubectl("delete", "mtrlrun", "gpu", "-n", namespace, "--timeout=60s")
    wait_clean(cluster, names)


def test_a_pytorchjob_trains_through_the_real_training_operator(
        cluster: LocalCluster, operator: OperatorProcess, namespace: str) -> None:
    """The controller makes the Master pod and its Service (its Events outlive the job); the
    run ends Succeeded after one attempt on its trainer's report of the outcome, which comes
    as the trainer exits, and the operator deletes the job at once, maybe before Kubeflow's
    controller marks it Succeeded: the GPUs go as soon as the work is proven done."""
    resource = "pytorchjobs.kubeflow.org"
    apply(cluster, namespace, run_manifest("real", trainer={
        "launcher": "PyTorchJob", "command": STANDIN_TRAINER}, grpo={"maxSteps": 3}))
    job = _workload(cluster, resource, namespace)["metadata"]["name"]
    run = wait_phase(cluster, namespace, "real", "Succeeded", timeout=120)
    assert run["status"]["attempts"] == 1 and run["status"]["progress"]["step"] == 3, \
        run["status"]
    assert condition(run, "Complete")["reason"] == "TrainingComplete"
    reasons = _event_reasons(cluster, namespace, job)
    assert {"SuccessfulCreatePod", "SuccessfulCreateService"} <= set(reasons), reasons
    wait_clean(cluster, names_of(run))


# Per launcher: the workload's resource, and (pod name before its random suffix, container)
# for rank 0's node and rank 1's, as the Job controller and Kubeflow's controller name them.
TWO_NODES = {
    "PyTorchJob": ("pytorchjobs.kubeflow.org", "{job}-master-0", "{job}-worker-0", "pytorch"),
    "Job": ("jobs.batch", "{job}-0-", "{job}-1-", "trainer"),
}


@pytest.mark.parametrize("launcher", sorted(TWO_NODES))
def test_the_real_trainer_trains_on_two_nodes(cluster: LocalCluster, operator: OperatorProcess,
                                              namespace: str, launcher: str) -> None:
    """The reference trainer on two nodes of one CPU process each (gloo), as the operator
    renders it. PyTorchJob: the Worker's init container (Kubeflow's own) waits until the
    Master's Service resolves, and torchrun meets at the controller's MASTER_ADDR:MASTER_PORT.
    Job: torchrun's c10d rendezvous at `<job>-0.<job>`, the pod host name of index 0 (which
    knows itself by that name and hosts the store). Rank 0 shares generation with rank 1 at
    its rendezvous address; the run succeeds in one attempt."""
    resource, rank0, rank1, container = TWO_NODES[launcher]
    manifest = run_manifest("two-node", trainer={"launcher": launcher, "nodes": 2},
                            # Enough completion tokens a step (8 x 2 x 32) that the random
                            # policy samples the target and some group's rewards differ: a run
                            # that trains nothing fails (`nothing trained:`). At 4 x 2 x 4 both
                            # launchers' runs trained nothing in a clean-clone CI run, and at
                            # 8 x 2 x 12 the Job's run once did (2026-12-07).
                            grpo={"maxSteps": 2, "groupSize": 8, "promptsPerStep": 2,
                                  "maxNewTokens": 32},
                            model={"name": "random:tiny-qwen2", "dtype": "float32",
                                   "maxSequenceLength": 128},
                            dataset={"inline": {"train": [{"target_token_id": "16"}]}})
    del manifest["spec"]["trainer"]["command"]  # what the operator renders: torchrun
    apply(cluster, namespace, manifest)
    job = _workload(cluster, resource, namespace)["metadata"]["name"]
    run = wait_phase(cluster, namespace, "two-node", "Succeeded", timeout=300)
    assert run["status"]["attempts"] == 1 and run["status"]["progress"]["step"] == 2, \
        run["status"]
    # The pods are gone with the job; their logs stay in the node agent's folders.
    logs = [_agent_log(cluster, namespace, pod.format(job=job), container)
            for pod in (rank0, rank1)]
    assert "generation sharded over 2 ranks" in logs[0], logs[0][-3000:]
    assert "step 2/2 rank 1" in logs[1], logs[1][-3000:]
    if launcher == "PyTorchJob":
        waited = _agent_log(cluster, namespace, f"{job}-worker-0", "init-pytorch")
        assert f"Name:\t{job}-master-0" in waited, waited
    wait_clean(cluster, names_of(run))


def test_a_deleted_two_process_trainer_pod_is_replaced_without_spending_an_attempt(
        cluster: LocalCluster, operator: OperatorProcess, namespace: str) -> None:
    """`kubectl delete pod` of a Job's trainer of two processes (torchrun, gloo), as the
    operator renders it: the pod gets SIGTERM, rank 0 saves a checkpoint at its step, torchrun
    exits 1 but `mtrl torchrun` 143, which the Job's podFailurePolicy ignores: the Job starts a
    new pod, which resumes, and the run succeeds in its first attempt."""
    manifest = run_manifest("deleted", trainer={"launcher": "Job", "nodes": 1, "gpusPerNode": 2},
                            grpo={"maxSteps": 8, "groupSize": 8, "promptsPerStep": 2,
                                  "maxNewTokens": 12},
                            model={"name": "random:tiny-qwen2", "dtype": "float32",
                                   "maxSequenceLength": 128},
                            dataset={"inline": {"train": [{"target_token_id": "16"}]}},
                            output={"s3Uri": "s3://mtrl-test-outputs/runs",
                                    "checkpointIntervalSteps": 100})
    del manifest["spec"]["trainer"]["command"]  # what the operator renders: mtrl torchrun
    apply(cluster, namespace, manifest)
    running = wait_for(lambda: (r := get(cluster, namespace, "deleted")) and ((r.get(
        "status") or {}).get("progress") or {}).get("step", 0) >= 2 and r, 300, "step 2")
    selector = f"mtrl.dev/run-uid={running['metadata']['uid']},mtrl.dev/component=trainer"

    def pods() -> list[dict]:
        out = cluster.kubectl("get", "pods", "-n", namespace, "-l", selector, "-o", "json")
        return list(json.loads(out.stdout)["items"])

    [first] = pods()
    first_name = first["metadata"]["name"]
    assert first["spec"]["containers"][0]["command"][:2] == ["mtrl", "torchrun"]
    cluster.kubectl("delete", "pod", "-n", namespace, first_name, "--wait=false")
    second = wait_for(lambda: [p["metadata"]["name"] for p in pods()
                               if p["metadata"]["name"] != first_name], 120,
                      "a second trainer pod")[0]
    run = wait_phase(cluster, namespace, "deleted", "Succeeded", timeout=300)
    assert run["status"]["attempts"] == 1, run["status"]
    assert run["status"].get("failedAttempts", 0) == 0, run["status"]
    stopped = _agent_log(cluster, namespace, first_name, "trainer")
    assert "terminated by SIGTERM at step" in stopped, stopped[-3000:]
    assert "SignalException" in stopped  # torchrun's own exit: 1
    assert "resumed from checkpoint at step" in _agent_log(cluster, namespace, second,
                                                           "trainer")
    wait_clean(cluster, names_of(run))


def _agent_log(cluster: LocalCluster, namespace: str, pod: str, container: str) -> str:
    """The container's log in the node agent's folder of pod `pod` (or of the pod whose name
    begins with `pod`, ending in '-')."""
    pattern = f"{namespace}_{pod}{'*' if pod.endswith('-') else ''}_*/{container}.log"
    found = sorted((cluster.root / "pods").glob(pattern))
    assert found, f"no log of {namespace}/{pod}[{container}] in the node agent's folders"
    return found[-1].read_text(errors="replace")


def test_a_failed_pytorchjobs_words_survive_the_controllers_clean_up(
        cluster: LocalCluster, operator: OperatorProcess, namespace: str) -> None:
    """Kubeflow's controller cleans up a failed job's pods; the operator still reads the
    trainer's own words from them: a crash is retried in a new attempt (that succeeds here),
    and a configuration error (exit code 2) ends the run at once, in the trainer's words."""
    flaky = ["python", "-c", "import os, sys; print('trainer: boom', flush=True); "
             "from mtrl_testbed.standin_trainer import main; "
             "sys.exit(main(['--step-seconds', '0.1']) if os.environ['MTRL_ATTEMPT'] == '2' "
             "else 1)"]
    misconfigured = ["python", "-c", "import os, sys; open(os.environ["
                     "'MTRL_TERMINATION_MESSAGE_PATH'], 'w').write('configuration error: "
                     "spec.model.name: no model nope/nope'); sys.exit(2)"]
    apply(cluster, namespace, run_manifest("flaky", trainer={
        "launcher": "PyTorchJob", "command": flaky}, lifecycle={"backoffLimit": 2}))
    apply(cluster, namespace, run_manifest("misconfigured", trainer={
        "launcher": "PyTorchJob", "command": misconfigured}, lifecycle={"backoffLimit": 2}))
    run = wait_phase(cluster, namespace, "misconfigured", "Failed", timeout=120)
    assert run["status"]["attempts"] == 1, run["status"]
    assert condition(run, "Failed")["reason"] == "TrainerConfigError", run["status"]
    assert "not retried: configuration error: spec.model.name: no model nope/nope (exit code 2)" \
        in run["status"]["message"], run["status"]["message"]
    run = wait_phase(cluster, namespace, "flaky", "Succeeded", timeout=120)
    assert run["status"]["attempts"] == 2 and run["status"]["nextAttemptTime"], run["status"]
    names = names_of(run)
    kept = json.loads(cluster.kubectl("get", "configmap", names.trainer_log(1), "-n", namespace,
                                      "-o", "json").stdout)
    assert "trainer: boom" in kept["data"]["log"], kept["data"]
    for name in ("misconfigured", "flaky"):
        wait_clean(cluster, names_of(get(cluster, namespace, name)))


@pytest.mark.parametrize(("running", "done"), [(("Created", "Running"), ("Created", "Completed"))])
def test_hyperpod_launcher_lifecycle(cluster: LocalCluster, operator: OperatorProcess,
                                     namespace: str, launcher_crds: None,
                                     running: tuple[str, ...], done: tuple[str, ...]) -> None:
    resource = "hyperpodpytorchjobs.sagemaker.amazonaws.com"
    job = _gpu_run(cluster, namespace, "HyperPodPyTorchJob", resource)
    meta = job["metadata"]
    policy = job["spec"]["runPolicy"]
    assert policy["jobMaxRetryCount"] == 3 and policy["ttlSecondsAfterFinished"] > 0
    assert job["spec"]["replicaSpecs"][0]["replicas"] == 2
    template = job["spec"]["replicaSpecs"][0]["template"]
    assert template["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == \
        "hyperpod-ns-a-localqueue"
    pod = template["spec"]
    container = pod["containers"][0]
    assert container["command"][:2] == ["hyperpodrun", "--nnodes=2"]
    assert {"name": "elastic-agent", "containerPort": 8080} in \
        [{k: p[k] for k in ("name", "containerPort")} for p in container["ports"]]
    _assert_gpu_pod(pod)

    _set_conditions(cluster, resource, namespace, meta["name"], *running)
    wait_phase(cluster, namespace, "gpu", "Running")
    # A Failed from a fault the job recovered from stays in the list below the newer Running:
    # the newest condition rules (launchers/conditions.py: newest_true_condition).
    _set_history(cluster, resource, namespace, meta["name"],
                 [("Created", 0), ("Failed", 10), ("Running", 20)])
    time.sleep(2)  # nothing to wait for: a run that stays Running
    run = get(cluster, namespace, "gpu")
    assert run["status"]["phase"] == "Running" and run["status"]["attempts"] == 1, run["status"]
    # Its trainer reports the outcome as it finishes, then the job completes: the report is
    # the evidence, and the operator may have deleted the job before it says Completed.
    report_outcome(cluster, namespace, "gpu")
    _set_conditions(cluster, resource, namespace, meta["name"], *done, check=False)
    run = wait_phase(cluster, namespace, "gpu", "Succeeded")
    wait_clean(cluster, names_of(run))
    gone = cluster.kubectl("get", resource, "-n", namespace, "-o", "name").stdout.strip()
    assert gone == ""


def _gpu_run(cluster: LocalCluster, namespace: str, launcher: str, resource: str) -> dict:
    """Two nodes of eight GPUs in a HyperPod restricted instance group, queued in Kueue, with
    the command the operator renders: the workload it created."""
    apply(cluster, namespace, run_manifest("gpu", trainer={
        "launcher": launcher, "gpusPerNode": 8, "efaPerNode": 32, "nodes": 2,
        "restrictedInstanceGroup": True, "command": None},
        scheduling={"queueName": "hyperpod-ns-a-localqueue"}))
    job = _workload(cluster, resource, namespace)
    meta = job["metadata"]
    assert meta["labels"]["kueue.x-k8s.io/queue-name"] == "hyperpod-ns-a-localqueue"
    assert meta["ownerReferences"][0]["kind"] == "MultiTurnRLRun"
    return job


def _assert_gpu_pod(pod: dict) -> None:
    limits = pod["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] in (8, "8") and limits["vpc.amazonaws.com/efa"] in (32, "32")
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"]
    assert {"key": "node.kubernetes.io/instance-type", "operator": "In",
            "values": ["ml.p5.48xlarge"]} in terms
    assert any(t["key"] == "sagemaker.amazonaws.com/instance-group-type" for t in terms)
    assert {"key": "sagemaker.amazonaws.com/RestrictedNode", "operator": "Equal",
            "value": "Worker", "effect": "NoSchedule"} in pod["tolerations"]


def _event_reasons(cluster: LocalCluster, namespace: str, name: str, type_: str = "") -> list[str]:
    selector = f"involvedObject.name={name}" + (f",type={type_}" if type_ else "")
    return cluster.kubectl("get", "events", "-n", namespace, "--field-selector", selector, "-o",
                           "jsonpath={.items[*].reason}").stdout.split()


def _condition_types(cluster: LocalCluster, resource: str, namespace: str, name: str) -> list[str]:
    job = json.loads(cluster.kubectl("get", resource, name, "-n", namespace, "-o",
                                     "json").stdout)
    return [c["type"] for c in (job.get("status") or {}).get("conditions") or []]


@pytest.mark.parametrize("report_finish", [True, False], ids=["completed-then-deleted",
                                                               "deleted-unseen"])
def test_a_hyperpod_job_deleted_at_once_when_finished_runs_once_and_succeeds(
        cluster: LocalCluster, operator: OperatorProcess, namespace: str, launcher_crds: None,
        report_finish: bool) -> None:
    """HyperPod with ttlSecondsAfterFinished 0 (the CLI model's default) deletes a finished
    job at once, maybe before this operator saw `Completed`, or (`deleted-unseen`) with no
    last condition at all. The trainer's own report of its outcome, in the progress ConfigMap,
    outlives the job: the run succeeds, and the job is never created a second time."""
    with StandInTrainingOperators(cluster, namespace, delete_finished=True,
                                  report_finish=report_finish) as hyperpod:
        apply(cluster, namespace, run_manifest("ttl", trainer={
            "launcher": "HyperPodPyTorchJob", "command": STANDIN_TRAINER},
            grpo={"maxSteps": 3}))
        run = wait_phase(cluster, namespace, "ttl", "Succeeded", timeout=120)
        # A re-created job would start again within a reconcile; give it the chance to.
        time.sleep(3)
        run = get(cluster, namespace, "ttl")
    assert not hyperpod.errors, hyperpod.errors
    assert list(hyperpod.seen.values()) == [names_of(run).trainer(1)], hyperpod.seen
    status = run["status"]
    assert status["phase"] == "Succeeded" and status["attempts"] == 1, status
    assert status["launchedAttempt"] == 1 and status["progress"]["step"] == 3, status
    assert condition(run, "Complete")["reason"] == "TrainingComplete"
    wait_clean(cluster, names_of(run))


def test_a_hyperpod_job_that_vanishes_unfinished_fails_the_run_without_a_second_job(
        cluster: LocalCluster, operator: OperatorProcess, namespace: str,
        launcher_crds: None) -> None:
    """Deleted while running, with no success reported: a failed attempt. HyperPod owns the
    retries of this launcher, so the run fails, saying why, and nothing is created again."""
    resource = "hyperpodpytorchjobs.sagemaker.amazonaws.com"
    apply(cluster, namespace, run_manifest("vanish", trainer={
        "launcher": "HyperPodPyTorchJob"}))
    job = _workload(cluster, resource, namespace)["metadata"]["name"]
    _set_conditions(cluster, resource, namespace, job, "Created", "Running")
    wait_phase(cluster, namespace, "vanish", "Running")
    cluster.kubectl("delete", resource, job, "-n", namespace)
    run = wait_phase(cluster, namespace, "vanish", "Failed")
    failed = condition(run, "Failed")
    assert failed["reason"] == "TrainerFailed", failed
    assert "was deleted before the operator saw its outcome" in failed["message"], failed
    assert run["status"]["attempts"] == 1
    time.sleep(2)
    gone = cluster.kubectl("get", resource, "-n", namespace, "-o", "name").stdout.strip()
    assert gone == ""
