"""The GPU trainer: its configuration, progress channel, and the pods of its workload with
HyperPod placement. The workload itself (Job, PyTorchJob or HyperPodPyTorchJob) is its
launcher's (`mtrl_operator.launchers`)."""

from __future__ import annotations

import json
from typing import Any

from mtrl_api import PROGRESS_KEY, TERMINATION_MESSAGE_PATH
from mtrl_api.run import LauncherKind, MultiTurnRLRunSpec
from mtrl_operator.builders import security
from mtrl_operator.builders.env import CONFIG_DIR, CONFIG_FILE, as_k8s
from mtrl_operator.naming import (
    COMPONENT_TRAINER_LOG,
    LABEL_ATTEMPT,
    TRAINER_LOG_KEY,
    RunNames,
)

RENDEZVOUS_PORT = 29500
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
HEALTH_LABEL = "sagemaker.amazonaws.com/node-health-status"
DEEP_HEALTH_LABEL = "sagemaker.amazonaws.com/deep-health-check-status"
INSTANCE_GROUP_TYPE_LABEL = "sagemaker.amazonaws.com/instance-group-type"
RESTRICTED_TOLERATION = {"key": "sagemaker.amazonaws.com/RestrictedNode", "operator": "Equal",
                         "value": "Worker", "effect": "NoSchedule"}
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY = "kueue.x-k8s.io/priority-class"
KUEUE_REQUIRED_TOPOLOGY = "kueue.x-k8s.io/podset-required-topology"
KUEUE_PREFERRED_TOPOLOGY = "kueue.x-k8s.io/podset-preferred-topology"
# Kubeflow's PyTorchJob controller takes MASTER_PORT from the container port of this name in
# the container named "pytorch" (training-operator pkg/controller.v1/pytorch/envvar.go).
PYTORCHJOB_PORT_NAME = "pytorchjob-port"
# HyperPodPyTorchJob pods run the HyperPod elastic agent (PyPI hyperpod-elastic-agent), which
# serves the HyperPod training operator on this port: rendezvous (/start with rank, nnodes and
# master address), stop and status all come through it (AWS docs' example job: "the port that
# HyperPodElasticAgent listens to"; the agent's --server-port default).
ELASTIC_AGENT_PORT = 8080
ELASTIC_AGENT_LOG_DIR = "/tmp/hyperpod"  # workers' logs, which the agent's log monitoring reads
# The HyperPod CLI's model defaults ttlSecondsAfterFinished to 0: a finished job would be
# deleted at once, possibly before this operator read its outcome. The operator deletes the job
# itself as the first step of a run's teardown; this is the margin it has to do so.
HYPERPOD_TTL_SECONDS = 3600
RESTART_EVAL_PERIOD_SECONDS = 86400  # HyperPod counts restarts within this window
# The line a trainer logs after every optimizer step, on every rank ("step N/M ...", both
# engines: trainer/mtrl_trainer/loop.py, trl_engine.py; docs/trainer-contract.md): HyperPod's
# log monitoring calls a job that prints none for a while hung.
STEP_LOG_PATTERN = r".*\bstep (\d+)/\d+\b.*"


def config_map(names: RunNames, spec: MultiTurnRLRunSpec, owner: dict[str, Any]) -> dict[str, Any]:
    """The run's spec, mounted into trainer pods at /etc/mtrl/run.json."""
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": names.config_map, "namespace": names.namespace,
                     "labels": names.labels("config"), "ownerReferences": [owner]},
        "data": {CONFIG_FILE: json.dumps(spec.wire(), indent=2, sort_keys=True)},
    }


KEPT_LOG_BYTES = 64 * 1024  # of a failed attempt's log tail, kept in a ConfigMap


def kept_log(names: RunNames, attempt: int, pod: str, container: str, text: str,
             owner: dict[str, Any]) -> dict[str, Any]:
    """A failed attempt's log tail, kept as long as the run (its owner) is: the workload and
    its pods go at once, the GPUs with them, and the cause must stay readable."""
    tail = text.encode()[-KEPT_LOG_BYTES:].decode(errors="ignore")
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": names.trainer_log(attempt), "namespace": names.namespace,
                     "labels": {**names.labels(COMPONENT_TRAINER_LOG),
                                LABEL_ATTEMPT: str(attempt)},
                     "ownerReferences": [owner]},
        "data": {TRAINER_LOG_KEY: tail, "pod": pod, "container": container},
    }


def progress_channel(names: RunNames, spec: MultiTurnRLRunSpec,
                     owner: dict[str, Any]) -> list[dict[str, Any]]:
    """A ConfigMap the trainer writes its progress into, and the least privilege to do so: a
    Role allowing get/patch of that one ConfigMap, bound to the trainer's ServiceAccount."""
    sa = spec.trainer.service_account_name or "default"
    meta = {"namespace": names.namespace, "labels": names.labels("progress"),
            "ownerReferences": [owner]}
    return [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": names.progress_config_map, **meta},
         "data": {PROGRESS_KEY: "{}"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
         "metadata": {"name": names.progress_role, **meta},
         "rules": [{"apiGroups": [""], "resources": ["configmaps"],
                    "resourceNames": [names.progress_config_map], "verbs": ["get", "patch"]}]},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
         "metadata": {"name": names.progress_role, **meta},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                     "name": names.progress_role},
         "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": names.namespace}]},
    ]


# torchrun with its arguments unchanged, under a launcher that passes SIGTERM on and exits 143
# once torchrun stops after it (`mtrl_trainer.launch`): torchrun itself then exits 1 whatever
# its ranks did, and the Job's podFailurePolicy ignores only 143 (launchers/job.py).
TORCHRUN = ["mtrl", "torchrun"]


def _hyperpodrun(spec: MultiTurnRLRunSpec) -> list[str]:
    """The HyperPod elastic agent as PID 1 (exec form, so SIGTERM reaches it, as its README
    requires). It takes torchrun's arguments; rendezvous is the HyperPod training operator's
    (`--rdzv-backend hyperpod`, forced by the agent): no endpoint to pass."""
    trainer = spec.trainer
    return ["hyperpodrun", f"--nnodes={trainer.nodes}",
            f"--nproc-per-node={max(trainer.gpus_per_node, 1)}",
            f"--server-port={ELASTIC_AGENT_PORT}", "--redirects=3", "--tee=3",
            f"--log-dir={ELASTIC_AGENT_LOG_DIR}", "-m", "mtrl_trainer"]


def _command(spec: MultiTurnRLRunSpec, rendezvous: str | None) -> list[str]:
    trainer = spec.trainer
    if trainer.command:
        return list(trainer.command)
    if trainer.launcher == LauncherKind.HYPERPOD_PYTORCH_JOB:
        return _hyperpodrun(spec)
    procs = max(trainer.gpus_per_node, 1)
    if trainer.nodes == 1 and procs == 1:
        return ["mtrl", "trainer"]
    if trainer.nodes == 1:
        return [*TORCHRUN, "--standalone", f"--nproc-per-node={procs}", "-m", "mtrl_trainer"]
    cmd = [*TORCHRUN, f"--nnodes={trainer.nodes}", f"--nproc-per-node={procs}"]
    if trainer.launcher == LauncherKind.PYTORCH_JOB:
        # Static rendezvous at the master pod, from the variables Kubeflow's controller sets in
        # every replica (envvar.go: MASTER_ADDR, MASTER_PORT, PET_NODE_RANK); the kubelet
        # expands $(VAR) from the container's environment.
        cmd += ["--node-rank=$(PET_NODE_RANK)", "--master-addr=$(MASTER_ADDR)",
                "--master-port=$(MASTER_PORT)"]
    elif rendezvous:
        cmd += ["--rdzv-backend=c10d", f"--rdzv-endpoint={rendezvous}"]
    return [*cmd, "-m", "mtrl_trainer"]


def _affinity(spec: MultiTurnRLRunSpec) -> dict[str, Any]:
    terms = [
        {"key": INSTANCE_TYPE_LABEL, "operator": "In", "values": [spec.trainer.instance_type]},
        {"key": HEALTH_LABEL, "operator": "In", "values": ["Schedulable"]},
    ]
    if spec.trainer.restricted_instance_group:
        terms.append({"key": INSTANCE_GROUP_TYPE_LABEL, "operator": "In",
                      "values": ["Restricted"]})
    # As the HyperPod CLI's default affinity: nodes whose deep health check passed first.
    preferred = [{"weight": 100, "preference": {"matchExpressions": [
        {"key": DEEP_HEALTH_LABEL, "operator": "In", "values": ["Passed"]}]}}]
    return {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": terms}]},
        "preferredDuringSchedulingIgnoredDuringExecution": preferred}}


def _ports(launcher: LauncherKind) -> list[dict[str, Any]]:
    if launcher == LauncherKind.HYPERPOD_PYTORCH_JOB:
        return [{"name": "elastic-agent", "containerPort": ELASTIC_AGENT_PORT}]
    if launcher == LauncherKind.PYTORCH_JOB:
        return [{"name": PYTORCHJOB_PORT_NAME, "containerPort": RENDEZVOUS_PORT}]
    return [{"name": "rendezvous", "containerPort": RENDEZVOUS_PORT}]


def _kueue_labels(spec: MultiTurnRLRunSpec) -> dict[str, str]:
    labels = {}
    if spec.scheduling.queue_name:
        labels[KUEUE_QUEUE] = spec.scheduling.queue_name
    if spec.scheduling.priority_class:
        labels[KUEUE_PRIORITY] = spec.scheduling.priority_class
    return labels


def topology(spec: MultiTurnRLRunSpec) -> dict[str, str]:
    """Kueue topology-aware scheduling reads these from the pod template; the HyperPod CLI
    writes them on the job as well."""
    out = {}
    if spec.scheduling.required_topology:
        out[KUEUE_REQUIRED_TOPOLOGY] = spec.scheduling.required_topology
    if spec.scheduling.preferred_topology:
        out[KUEUE_PREFERRED_TOPOLOGY] = spec.scheduling.preferred_topology
    return out


def pod_template(names: RunNames, spec: MultiTurnRLRunSpec, env: dict[str, str], attempt: int,
                 rendezvous: str | None = None, container_name: str = "trainer",
                 restart_policy: str | None = "Never") -> dict[str, Any]:
    """One trainer pod. `restart_policy=None` leaves it out, for a controller that sets it from
    its own replica spec (Kubeflow's PyTorchJob)."""
    trainer = spec.trainer
    if trainer.launcher == LauncherKind.HYPERPOD_PYTORCH_JOB:
        # The elastic agent's rendezvous backend reads the node count from NNODES at start.
        env = {**env, "NNODES": str(trainer.nodes)}
    limits: dict[str, Any] = dict(trainer.resources.limits)
    requests: dict[str, Any] = dict(trainer.resources.requests)
    if trainer.gpus_per_node:
        limits["nvidia.com/gpu"] = requests["nvidia.com/gpu"] = trainer.gpus_per_node
    if trainer.efa_per_node:
        limits["vpc.amazonaws.com/efa"] = requests["vpc.amazonaws.com/efa"] = trainer.efa_per_node
    tolerations = [t.wire() for t in trainer.tolerations]
    if trainer.gpus_per_node:
        tolerations.append({"key": "nvidia.com/gpu", "operator": "Exists",
                            "effect": "NoSchedule"})
    if trainer.restricted_instance_group:
        tolerations.append(RESTRICTED_TOLERATION)
    pod_spec: dict[str, Any] = {
        # SIGTERM: the trainer saves a checkpoint at the step it is on, then exits.
        "terminationGracePeriodSeconds": trainer.termination_grace_period_seconds,
        "affinity": _affinity(spec),
        "tolerations": tolerations,
        "nodeSelector": dict(trainer.node_selector),
        "containers": [{
            "name": container_name,
            "image": trainer.image,
            "command": _command(spec, rendezvous),
            "env": [*as_k8s(env),
                    {"name": "MTRL_POD_NAME", "valueFrom": {"fieldRef": {
                        "fieldPath": "metadata.name"}}},
                    {"name": "MTRL_POD_NAMESPACE", "valueFrom": {"fieldRef": {
                        "fieldPath": "metadata.namespace"}}},
                    {"name": "MTRL_TERMINATION_MESSAGE_PATH", "value": TERMINATION_MESSAGE_PATH}],
            # The trainer writes its cause of failure there; a trainer killed before it could
            # (OOM, a crash in native code) leaves its last log lines instead.
            "terminationMessagePath": TERMINATION_MESSAGE_PATH,
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "resources": {"limits": limits, "requests": requests},
            "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
                             {"name": "dshm", "mountPath": "/dev/shm"}],
            "ports": _ports(trainer.launcher),
            "securityContext": security.container_security_context(),
        }],
        "securityContext": security.pod_security_context(),
        "volumes": [
            {"name": "config", "configMap": {"name": names.config_map}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": trainer.shm_size}},
        ],
    }
    if restart_policy:
        pod_spec["restartPolicy"] = restart_policy
    if trainer.service_account_name:
        pod_spec["serviceAccountName"] = trainer.service_account_name
    labels = {**names.labels("trainer"), LABEL_ATTEMPT: str(attempt)}
    if trainer.launcher == LauncherKind.HYPERPOD_PYTORCH_JOB:
        labels |= _kueue_labels(spec)  # as the HyperPod CLI's template does
    metadata: dict[str, Any] = {"labels": labels}
    if annotations := topology(spec):
        metadata["annotations"] = annotations
    return {"metadata": metadata, "spec": pod_spec}


def workload_meta(names: RunNames, spec: MultiTurnRLRunSpec, attempt: int,
                   owner: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    labels = {**names.labels("trainer"), LABEL_ATTEMPT: str(attempt), **_kueue_labels(spec)}
    meta: dict[str, Any] = {"name": names.trainer(attempt), "namespace": names.namespace,
                            "labels": labels, "ownerReferences": [owner]}
    if annotations:
        meta["annotations"] = annotations
    return meta
