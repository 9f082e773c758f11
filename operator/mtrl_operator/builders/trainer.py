"""The GPU trainer: its configuration, progress channel and workload (Job, PyTorchJob or
HyperPodPyTorchJob) with HyperPod placement."""

from __future__ import annotations

import json
from typing import Any

from mtrl_operator.api.run import LauncherKind, MultiTurnRLRunSpec
from mtrl_operator.builders.env import CONFIG_DIR, CONFIG_FILE, as_k8s
from mtrl_operator.naming import PROGRESS_KEY, RunNames

RENDEZVOUS_PORT = 29500
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
HEALTH_LABEL = "sagemaker.amazonaws.com/node-health-status"
INSTANCE_GROUP_TYPE_LABEL = "sagemaker.amazonaws.com/instance-group-type"
RESTRICTED_TOLERATION = {"key": "sagemaker.amazonaws.com/RestrictedNode", "operator": "Equal",
                         "value": "Worker", "effect": "NoSchedule"}
AUTO_RESUME = "sagemaker.amazonaws.com/enable-job-auto-resume"
AUTO_RESUME_RETRIES = "sagemaker.amazonaws.com/job-max-retry-count"
KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
KUEUE_PRIORITY = "kueue.x-k8s.io/priority-class"


def config_map(names: RunNames, spec: MultiTurnRLRunSpec, owner: dict[str, Any]) -> dict[str, Any]:
    """The run's spec, mounted into trainer pods at /etc/mtrl/run.json."""
    return {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": names.config_map, "namespace": names.namespace,
                     "labels": names.labels("config"), "ownerReferences": [owner]},
        "data": {CONFIG_FILE: json.dumps(spec.wire(), indent=2, sort_keys=True)},
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


def _command(spec: MultiTurnRLRunSpec, rendezvous: str | None) -> list[str]:
    trainer = spec.trainer
    if trainer.command:
        return list(trainer.command)
    procs = max(trainer.gpus_per_node, 1)
    if trainer.nodes == 1 and procs == 1:
        return ["mtrl", "trainer"]
    if trainer.nodes == 1:
        return ["torchrun", "--standalone", f"--nproc-per-node={procs}", "-m", "mtrl_trainer"]
    cmd = ["torchrun", f"--nnodes={trainer.nodes}", f"--nproc-per-node={procs}"]
    if rendezvous:
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
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": terms}]}}}


def pod_template(names: RunNames, spec: MultiTurnRLRunSpec, env: dict[str, str], attempt: int,
                 rendezvous: str | None = None, container_name: str = "trainer") -> dict[str, Any]:
    trainer = spec.trainer
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
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 60,  # SIGTERM writes a last checkpoint
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
                        "fieldPath": "metadata.namespace"}}}],
            "resources": {"limits": limits, "requests": requests},
            "volumeMounts": [{"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
                             {"name": "dshm", "mountPath": "/dev/shm"}],
            "ports": [{"name": "rendezvous", "containerPort": RENDEZVOUS_PORT}],
        }],
        "volumes": [
            {"name": "config", "configMap": {"name": names.config_map}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": trainer.shm_size}},
        ],
    }
    if trainer.service_account_name:
        pod_spec["serviceAccountName"] = trainer.service_account_name
    labels = {**names.labels("trainer"), "mtrl.dev/attempt": str(attempt)}
    return {"metadata": {"labels": labels}, "spec": pod_spec}


def _workload_meta(names: RunNames, spec: MultiTurnRLRunSpec, attempt: int,
                   owner: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    labels = {**names.labels("trainer"), "mtrl.dev/attempt": str(attempt)}
    if spec.scheduling.queue_name:
        labels[KUEUE_QUEUE] = spec.scheduling.queue_name
    if spec.scheduling.priority_class:
        labels[KUEUE_PRIORITY] = spec.scheduling.priority_class
    meta: dict[str, Any] = {"name": names.trainer(attempt), "namespace": names.namespace,
                            "labels": labels, "ownerReferences": [owner]}
    if annotations:
        meta["annotations"] = annotations
    return meta


def workload(names: RunNames, spec: MultiTurnRLRunSpec, env: dict[str, str], attempt: int,
             owner: dict[str, Any]) -> list[dict[str, Any]]:
    """The trainer objects of one attempt, in creation order."""
    name = names.trainer(attempt)
    kind = spec.trainer.launcher
    if kind == LauncherKind.JOB:
        rendezvous = f"{name}-0.{name}:{RENDEZVOUS_PORT}"
        template = pod_template(names, spec, env, attempt, rendezvous)
        template["spec"]["subdomain"] = name  # pod DNS <job>-<index>.<service>
        return [
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {**_workload_meta(names, spec, attempt, owner)},
             "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                      "selector": {"batch.kubernetes.io/job-name": name},
                      "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT}]}},
            {"apiVersion": "batch/v1", "kind": "Job",
             "metadata": _workload_meta(names, spec, attempt, owner),
             "spec": {
                 "completionMode": "Indexed",
                 "completions": spec.trainer.nodes,
                 "parallelism": spec.trainer.nodes,
                 "backoffLimit": 0,  # a failed attempt is retried by the operator, from a checkpoint
                 "suspend": bool(spec.scheduling.queue_name),  # Kueue admits it
                 "template": template,
             }},
        ]
    auto_resume = {AUTO_RESUME: "true",
                   AUTO_RESUME_RETRIES: str(spec.trainer.auto_resume_max_retries)}
    if kind == LauncherKind.PYTORCH_JOB:
        replicas: dict[str, Any] = {"Master": {
            "replicas": 1, "restartPolicy": "OnFailure",
            "template": pod_template(names, spec, env, attempt, container_name="pytorch")}}
        if spec.trainer.nodes > 1:
            replicas["Worker"] = {
                "replicas": spec.trainer.nodes - 1, "restartPolicy": "OnFailure",
                "template": pod_template(names, spec, env, attempt, container_name="pytorch")}
        return [{
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": _workload_meta(names, spec, attempt, owner, auto_resume),
            "spec": {"pytorchReplicaSpecs": replicas,
                     "nprocPerNode": str(max(spec.trainer.gpus_per_node, 1)),
                     "runPolicy": {"cleanPodPolicy": "All", "backoffLimit": 0}},
        }]
    return [{
        "apiVersion": "sagemaker.amazonaws.com/v1", "kind": "HyperPodPyTorchJob",
        "metadata": _workload_meta(names, spec, attempt, owner),
        "spec": {
            "nprocPerNode": str(max(spec.trainer.gpus_per_node, 1)),
            "runPolicy": {"jobMaxRetryCount": spec.trainer.auto_resume_max_retries,
                          "cleanPodPolicy": "All"},
            "replicaSpecs": [{"name": "trainer", "replicas": spec.trainer.nodes,
                              "template": pod_template(names, spec, env, attempt)}],
        },
    }]
