"""launcher Job: an indexed Job (one pod per node, torchrun's c10d rendezvous at pod 0) and the
headless Service that names its pods. The operator owns its retries. Pure."""

from __future__ import annotations

from typing import Any

from mtrl_api.run import LauncherKind, MultiTurnRLRunSpec, TrainerSpec
from mtrl_operator.builders.trainer import RENDEZVOUS_PORT, pod_template, workload_meta
from mtrl_operator.naming import RunNames
from mtrl_operator.reconcile.draft import TrainerObserved, TrainerState
from mtrl_operator.reconcile.retries import RetryOwner


def _true_conditions(obj: dict[str, Any]) -> list[str]:
    return [c.get("type", "") for c in (obj.get("status") or {}).get("conditions") or []
            if c.get("status") == "True"]


def _message(obj: dict[str, Any], type_: str) -> str:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c.get("type") == type_:
            return c.get("message") or c.get("reason") or ""
    return ""


SIGTERM_EXIT = 143  # the trainer's exit once SIGTERM stopped it (128 + 15), checkpoint saved


class JobLauncher:
    kind = LauncherKind.JOB

    def build(self, names: RunNames, spec: MultiTurnRLRunSpec, env: dict[str, str],
              attempt: int, owner: dict[str, Any]) -> list[dict[str, Any]]:
        name = names.trainer(attempt)
        rendezvous = f"{name}-0.{name}:{RENDEZVOUS_PORT}"
        template = pod_template(names, spec, env, attempt, rendezvous)
        template["spec"]["subdomain"] = name  # pod DNS <job>-<index>.<service>
        return [
            {"apiVersion": "v1", "kind": "Service",
             "metadata": {**workload_meta(names, spec, attempt, owner)},
             "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                      "selector": {"batch.kubernetes.io/job-name": name},
                      "ports": [{"name": "rendezvous", "port": RENDEZVOUS_PORT}]}},
            {"apiVersion": "batch/v1", "kind": "Job",
             "metadata": workload_meta(names, spec, attempt, owner),
             "spec": {
                 "completionMode": "Indexed",
                 "completions": spec.trainer.nodes,
                 "parallelism": spec.trainer.nodes,
                 "backoffLimit": 0,  # a failed attempt is retried by the operator, from a checkpoint
                 # A pod evicted, preempted or on a drained node (the API server marks it
                 # DisruptionTarget) is replaced by the Job without counting a failure: its
                 # trainer saved a checkpoint on SIGTERM and the next pod resumes from it
                 # (kubernetes.io/docs/concepts/workloads/controllers/job/#pod-failure-policy).
                 # So is a pod deleted outright (`kubectl delete pod`, which marks nothing):
                 # its trainer ends with 143 only after SIGTERM and the checkpoint it saved
                 # (docs/kubelet.md). torchrun exits 1 after SIGTERM whatever its children
                 # do; several processes run under `mtrl torchrun`, which exits 143 once
                 # torchrun stopped after the SIGTERM it passed on (builders/trainer.py,
                 # docs/trainer.md).
                 "podFailurePolicy": {"rules": [
                     {"action": "Ignore", "onPodConditions": [
                         {"type": "DisruptionTarget", "status": "True"}]},
                     {"action": "Ignore", "onExitCodes": {
                         "containerName": "trainer", "operator": "In",
                         "values": [SIGTERM_EXIT]}}]},
                 "suspend": bool(spec.scheduling.queue_name),  # Kueue admits it
                 "template": template,
             }},
        ]

    def state(self, obj: dict[str, Any], attempt: int) -> TrainerObserved:
        """The Job controller's conditions (Complete or SuccessCriteriaMet, Failed or
        FailureTarget), else running once a pod is ready."""
        true = _true_conditions(obj)
        if "Complete" in true or "SuccessCriteriaMet" in true:
            return TrainerObserved(attempt, TrainerState.SUCCEEDED, "the trainer Job completed")
        if "Failed" in true or "FailureTarget" in true:
            return TrainerObserved(attempt, TrainerState.FAILED, _message(obj, "Failed")
                                   or _message(obj, "FailureTarget") or "the trainer Job failed")
        if ((obj.get("status") or {}).get("ready") or 0) > 0:
            return TrainerObserved(attempt, TrainerState.RUNNING, "")
        return TrainerObserved(attempt, TrainerState.PENDING, "waiting for trainer pods")

    def suspended(self, obj: dict[str, Any]) -> bool:
        """Kueue creates a queued Job suspended (`spec.suspend`), unsuspends it on admission
        and suspends it again when it evicts or preempts it; the Job controller then deletes
        its pods."""
        return bool((obj.get("spec") or {}).get("suspend"))

    def retry_owner(self, trainer: TrainerSpec, namespace: str) -> RetryOwner:
        return RetryOwner.OPERATOR
