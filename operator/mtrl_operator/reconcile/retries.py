"""Who retries a failed trainer: exactly one owner per launcher, so retry counts never multiply.

Kubernetes, Kubeflow and HyperPod each have a retry knob (pod restartPolicy, Job and
PyTorchJob backoffLimit, HyperPod auto-resume's job-max-retry-count, HyperPodPyTorchJob's
jobMaxRetryCount and restartPolicy). Left to their defaults they nest: an operator retry of a
job that HyperPod already retried three times is a fourth, fifth... start. The builders turn
every knob but the owner's to "no retry", and `reconcile.decide` starts a new attempt only when
the operator is the owner. docs/hyperpod.md ("Who retries") has the table and the sources.
"""

from __future__ import annotations

from enum import StrEnum

from mtrl_api.run import LauncherKind


class RetryOwner(StrEnum):
    OPERATOR = "operator"  # a new attempt, from the latest checkpoint, up to lifecycle.backoffLimit
    HYPERPOD_AUTO_RESUME = "hyperpod-auto-resume"  # PyTorchJob annotations
    HYPERPOD_TRAINING_OPERATOR = "hyperpod-training-operator"  # HyperPodPyTorchJob runPolicy


def auto_resume_applies(namespace: str) -> bool:
    """HyperPod auto-resume acts on PyTorchJobs in namespace kubeflow or one prefixed hyperpod
    (AWS docs, "Running jobs using the SageMaker HyperPod CLI", Enabling job auto-resume)."""
    return namespace == "kubeflow" or namespace.startswith("hyperpod")


def retry_owner(launcher: LauncherKind, namespace: str) -> RetryOwner:
    if launcher == LauncherKind.HYPERPOD_PYTORCH_JOB:
        return RetryOwner.HYPERPOD_TRAINING_OPERATOR
    if launcher == LauncherKind.PYTORCH_JOB and auto_resume_applies(namespace):
        return RetryOwner.HYPERPOD_AUTO_RESUME
    return RetryOwner.OPERATOR
