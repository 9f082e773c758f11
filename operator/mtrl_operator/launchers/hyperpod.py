"""launcher HyperPodPyTorchJob (`sagemaker.amazonaws.com/v1`): pods run the HyperPod elastic
agent, and the HyperPod training operator owns retries (process restarts, then full job
restarts, within one budget) and watches the step lines for hangs. docs/hyperpod.md has the
sources. Pure."""

from __future__ import annotations

from typing import Any

from mtrl_api.run import LauncherKind, MultiTurnRLRunSpec, TrainerSpec
from mtrl_operator.builders.trainer import (
    HYPERPOD_TTL_SECONDS,
    RESTART_EVAL_PERIOD_SECONDS,
    STEP_LOG_PATTERN,
    pod_template,
    topology,
    workload_meta,
)
from mtrl_operator.launchers.conditions import training_job_state
from mtrl_operator.naming import RunNames
from mtrl_operator.reconcile.draft import TrainerObserved
from mtrl_operator.reconcile.retries import RetryOwner


class HyperPodLauncher:
    kind = LauncherKind.HYPERPOD_PYTORCH_JOB

    def build(self, names: RunNames, spec: MultiTurnRLRunSpec, env: dict[str, str],
              attempt: int, owner: dict[str, Any]) -> list[dict[str, Any]]:
        retries, hang = spec.trainer.auto_resume_max_retries, spec.trainer.hang_timeout_seconds
        # restartPolicy Never: a pod whose agent exited is the HyperPod operator's to replace; the
        # kubelet restarting a finished trainer would train again.
        template = pod_template(names, spec, env, attempt)
        return [{
            "apiVersion": "sagemaker.amazonaws.com/v1", "kind": "HyperPodPyTorchJob",
            "metadata": workload_meta(names, spec, attempt, owner, topology(spec)),
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



    def state(self, obj: dict[str, Any], attempt: int) -> TrainerObserved:
        """Its newest condition (`Completed` and `Failed` are terminal)."""
        return training_job_state(self.kind.value, obj, attempt)

    def suspended(self, obj: dict[str, Any]) -> bool:
        return False  # Kueue holds its pods (labels on the pod template), not the job

    def retry_owner(self, trainer: TrainerSpec, namespace: str) -> RetryOwner:
        return RetryOwner.HYPERPOD_TRAINING_OPERATOR
