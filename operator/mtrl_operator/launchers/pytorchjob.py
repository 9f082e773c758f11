"""launcher PyTorchJob (Kubeflow's training operator, `kubeflow.org/v1`): Master and Worker
replicas with Kubeflow's static rendezvous. HyperPod auto-resume owns its retries in its
namespaces on HyperPod's nodes, the operator everywhere else. Pure."""

from __future__ import annotations

from typing import Any

from mtrl_api.run import LauncherKind, MultiTurnRLRunSpec, TrainerSpec
from mtrl_operator.builders.trainer import pod_template, workload_meta
from mtrl_operator.launchers.conditions import training_job_state
from mtrl_operator.naming import RunNames
from mtrl_operator.reconcile.draft import TrainerObserved
from mtrl_operator.reconcile.retries import RetryOwner, auto_resume_applies

AUTO_RESUME = "sagemaker.amazonaws.com/enable-job-auto-resume"
AUTO_RESUME_RETRIES = "sagemaker.amazonaws.com/job-max-retry-count"


class PyTorchJobLauncher:
    kind = LauncherKind.PYTORCH_JOB

    def build(self, names: RunNames, spec: MultiTurnRLRunSpec, env: dict[str, str],
              attempt: int, owner: dict[str, Any]) -> list[dict[str, Any]]:
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
        resumed = self.retry_owner(spec.trainer, names.namespace) == \
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
        return [{
            "apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": workload_meta(names, spec, attempt, owner,
                                  annotations if resumed else None),
            "spec": {"pytorchReplicaSpecs": replicas,
                     "nprocPerNode": str(max(spec.trainer.gpus_per_node, 1)),
                     "runPolicy": run_policy},
        }]

    def state(self, obj: dict[str, Any], attempt: int) -> TrainerObserved:
        """Its newest condition (Kubeflow's `Succeeded` and `Failed` are terminal)."""
        return training_job_state(self.kind.value, obj, attempt)

    def suspended(self, obj: dict[str, Any]) -> bool:
        """Kueue creates a queued PyTorchJob suspended (`spec.runPolicy.suspend`)."""
        return bool(((obj.get("spec") or {}).get("runPolicy") or {}).get("suspend"))

    def retry_owner(self, trainer: TrainerSpec, namespace: str) -> RetryOwner:
        """HyperPod auto-resume in namespace kubeflow or hyperpod* on HyperPod's ml.* nodes
        (`reconcile/retries.py`), the operator elsewhere."""
        return (RetryOwner.HYPERPOD_AUTO_RESUME
                if auto_resume_applies(namespace, trainer.instance_type)
                else RetryOwner.OPERATOR)
