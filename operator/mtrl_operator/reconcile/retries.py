"""Who retries a failed trainer: exactly one owner per launcher, so retry counts never multiply.

Kubernetes, Kubeflow and HyperPod each have a retry knob (pod restartPolicy, Job and
PyTorchJob backoffLimit, HyperPod auto-resume's job-max-retry-count, HyperPodPyTorchJob's
jobMaxRetryCount and restartPolicy). Left to their defaults they nest: an operator retry of a
job that HyperPod already retried three times is a fourth, fifth... start. The builders turn
every knob but the owner's to "no retry", and `reconcile.decide` starts a new attempt only when
the operator is the owner. Each launcher names its owner (`mtrl_operator.launchers`).
docs/hyperpod.md ("Who retries") has the table and the sources.
"""

from __future__ import annotations

from enum import StrEnum


class RetryOwner(StrEnum):
    OPERATOR = "operator"  # a new attempt, from the latest checkpoint, up to lifecycle.backoffLimit
    HYPERPOD_AUTO_RESUME = "hyperpod-auto-resume"  # PyTorchJob annotations
    HYPERPOD_TRAINING_OPERATOR = "hyperpod-training-operator"  # HyperPodPyTorchJob runPolicy


HYPERPOD_INSTANCE_PREFIX = "ml."  # HyperPod nodes' node.kubernetes.io/instance-type


def auto_resume_applies(namespace: str, instance_type: str) -> bool:
    """HyperPod auto-resume acts on PyTorchJobs in namespace kubeflow or one prefixed hyperpod
    (AWS docs, "Running jobs using the SageMaker HyperPod CLI", Enabling job auto-resume), on
    HyperPod's own nodes: their instance types are SageMaker's (`ml.p5.48xlarge`). A run placed
    on other nodes (plain EKS `p5.48xlarge`, an on-premises Kubeflow) in namespace kubeflow has
    no HyperPod to retry it, so the operator does."""
    return instance_type.startswith(HYPERPOD_INSTANCE_PREFIX) and (
        namespace == "kubeflow" or namespace.startswith("hyperpod"))
