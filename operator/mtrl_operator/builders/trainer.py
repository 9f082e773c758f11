"""The GPU trainer: its configuration, progress channel and workload (Job, PyTorchJob or
HyperPodPyTorchJob) with HyperPod placement."""

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
from mtrl_operator.reconcile.retries import RetryOwner, retry_owner

RENDEZVOUS_PORT = 29500
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
HEALTH_LABEL = "sagemaker.amazonaws.com/node-health-status"
DEEP_HEALTH_LABEL = "sagemaker.amazonaws.com/deep-health-check-status"
INSTANCE_GROUP_TYPE_LABEL = "sagemaker.amazonaws.com/instance-group-type"
RESTRICTED_TOLERATION = {"key": "sagemaker.amazonaws.com/RestrictedNode", "operator": "Equal",
                         "value": "Worker", "effect": "NoSchedule"}
AUTO_RESUME = "sagemaker.amazonaws.com/enable-job-auto-resume"
AUTO_RESUME_RETRIES = "sagemaker.amazonaws.com/job-max-retry-count"
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
        return ["torchrun", "--standalone", f"--nproc-per-node={procs}", "-m", "mtrl_trainer"]
    cmd = ["torchrun", f"--nnodes={trainer.nodes}", f"--nproc-per-node={procs}"]
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


def _topology(spec: MultiTurnRLRunSpec) -> dict[str, str]:
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
    if topology := _topology(spec):
        metadata["annotations"] = topology
    return {"metadata": metadata, "spec": pod_spec}


def _workload_meta(names: RunNames, spec: MultiTurnRLRunSpec, attempt: int,
                   owner: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    labels = {**names.labels("trainer"), LABEL_ATTEMPT: str(attempt), **_kueue_labels(spec)}
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
                 # A pod evicted, preempted or on a drained node (the API server marks it
                 # DisruptionTarget) is replaced by the Job without counting a failure: its
                 # trainer saved a checkpoint on SIGTERM and the next pod resumes from it
                 # (kubernetes.io/docs/concepts/workloads/controllers/job/#pod-failure-policy).
                 "podFailurePolicy": {"rules": [{"action": "Ignore", "onPodConditions": [
                     {"type": "DisruptionTarget", "status": "True"}]}]},
                 "suspend": bool(spec.scheduling.queue_name),  # Kueue admits it
                 "template": template,
             }},
        ]
    if kind == LauncherKind.PYTORCH_JOB:
        return [_pytorch_job(names, spec, env, attempt, owner)]
    retries, hang = spec.trainer.auto_resume_max_retries, spec.trainer.hang_timeout_seconds
    # restartPolicy Never: a pod whose agent exited is the HyperPod operator's to replace; the
    # kubelet restarting a finished trainer would train again.
    template = pod_template(names, spec, env, attempt)
    return [{
        "apiVersion": "sagemaker.amazonaws.com/v1", "kind": "HyperPodPyTorchJob",
        "metadata": _workload_meta(names, spec, attempt, owner, _topology(spec)),
        "spec": {
            "nprocPerNode": str(max(spec.trainer.gpus_per_node, 1)),
            "runPolicy": {
                "cleanPodPolicy": "All",
                "ttlSecondsAfterFinished": HYPERPOD_TTL_SECONDS,
                # HyperPod owns retries for this launcher (mtrl_operator.reconcile.retries): process
                # restarts, then full job restarts, all within the one budget.
                "jobMaxRetryCount": retries,
                "restartPolicy": {"numRestartBeforeFullJobRestart": retries,
                                  "maxFullJobRestarts": retries,
                                  "evalPeriodSeconds": RESTART_EVAL_PERIOD_SECONDS},
                "logMonitoringConfiguration": [{
                    "name": "TrainerStep", "logPattern": STEP_LOG_PATTERN,
                    "expectedStartCutOffInSeconds": hang,
                    "expectedRecurringFrequencyInSeconds": hang}],
            },
            "replicaSpecs": [{"name": "trainer", "replicas": spec.trainer.nodes,
                              "template": template}],
        },
    }]


def _pytorch_job(names: RunNames, spec: MultiTurnRLRunSpec, env: dict[str, str], attempt: int,
                 owner: dict[str, Any]) -> dict[str, Any]:
    """Under HyperPod auto-resume (namespace kubeflow or hyperpod*), HyperPod owns retries: AWS
    requires restartPolicy OnFailure for it, and backoffLimit 0 makes the first container
    restart a job failure for auto-resume to handle, not a retry of its own. Elsewhere the
    operator owns them: no container restarts, no auto-resume annotations, and no backoffLimit.

    What Kubeflow's training operator (v1.9.3, pkg/controller.v1/common/job.go) does with a
    failed job decides whether its words survive: with a backoffLimit, the first failed pod
    "exceeds" it and every pod is deleted before the job is marked Failed, whatever
    cleanPodPolicy says; without one, a replica that fails under restartPolicy Never fails the
    job, and the clean-up that follows honours cleanPodPolicy. `Running` deletes the pods that
    still run (a multi-node job's surviving workers hold GPUs) and keeps the finished ones, with
    their exit codes and termination messages, until the operator deletes the job.

    restartPolicy is set on each replica, which the controller copies into its pods; setting it
    in the template too earns a `SetPodTemplateRestartPolicy` warning on every job."""
    resumed = retry_owner(spec.trainer, names.namespace) == \
        RetryOwner.HYPERPOD_AUTO_RESUME
    policy = "OnFailure" if resumed else "Never"
    template = pod_template(names, spec, env, attempt, container_name="pytorch",
                            restart_policy=None)
    replicas: dict[str, Any] = {"Master": {"replicas": 1, "restartPolicy": policy,
                                           "template": template}}
    if spec.trainer.nodes > 1:
        replicas["Worker"] = {"replicas": spec.trainer.nodes - 1, "restartPolicy": policy,
                              "template": template}
    annotations = {AUTO_RESUME: "true",
                   AUTO_RESUME_RETRIES: str(spec.trainer.auto_resume_max_retries)}
    run_policy: dict[str, Any] = ({"cleanPodPolicy": "All", "backoffLimit": 0} if resumed
                                  else {"cleanPodPolicy": "Running"})
    return {
        "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
        "metadata": _workload_meta(names, spec, attempt, owner, annotations if resumed else None),
        "spec": {"pytorchReplicaSpecs": replicas,
                 "nprocPerNode": str(max(spec.trainer.gpus_per_node, 1)),
                 "runPolicy": run_policy},
    }
