"""Preflight: what the operator can check before it creates anything, so that a run that cannot
work fails before queues, workers and GPUs start, with one sentence naming what and where.

Pure: `s3_lookups` says what to look up in S3, and each `*_problem` turns what a look-up found
into (reason, message) or None. The look-ups themselves are `controllers/preflight.py`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from mtrl_api.run import MultiTurnRLRunSpec

INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
GPU = "nvidia.com/gpu"
EFA = "vpc.amazonaws.com/efa"


class Found(StrEnum):
    """What one S3 look-up (ListObjectsV2 with a prefix, one key) found."""

    PRESENT = "present"
    NO_BUCKET = "no-bucket"
    NOTHING = "nothing"  # the bucket exists; no object at that key or under that prefix
    DENIED = "denied"  # the operator may not list the bucket: not checked


@dataclass(frozen=True)
class S3Lookup:
    field: str  # the spec field that names it
    uri: str
    bucket: str
    key: str
    whole_key: bool  # an object (the key itself) rather than a folder (anything under it)

    @property
    def prefix(self) -> str:
        """The prefix to list: the key itself for an object, the key as a folder otherwise."""
        if self.whole_key or not self.key:
            return self.key
        return self.key.rstrip("/") + "/"


def _lookup(field: str, uri: str, whole_key: bool) -> S3Lookup:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    return S3Lookup(field, uri, bucket, key, whole_key)


def s3_lookups(spec: MultiTurnRLRunSpec) -> list[S3Lookup]:
    """Every S3 location the run reads or writes: the output bucket, the datasets, a model or
    checkpoint to start from."""
    # The output folder is the run's own and need not exist yet: only its bucket must.
    out = [replace(_lookup("spec.output.s3Uri", spec.output.s3_uri, whole_key=False), key="")]
    if spec.dataset.s3 is not None:
        out.append(_lookup("spec.dataset.s3.trainUri", spec.dataset.s3.train_uri, True))
        if spec.dataset.s3.validation_uri:
            out.append(_lookup("spec.dataset.s3.validationUri", spec.dataset.s3.validation_uri,
                               True))
    if spec.model.name.startswith("s3://"):
        out.append(_lookup("spec.model.name", spec.model.name, whole_key=False))
    if spec.output.resume_from:
        out.append(_lookup("spec.output.resumeFrom", spec.output.resume_from, whole_key=False))
    return out


def s3_problem(lookup: S3Lookup, found: Found) -> tuple[str, str] | None:
    if found == Found.NO_BUCKET:
        return ("BucketNotFound", f"{lookup.field}: S3 bucket {lookup.bucket!r} does not exist "
                                  f"({lookup.uri})")
    if found != Found.NOTHING or not lookup.key:  # a bucket alone may be empty
        return None
    if lookup.whole_key:
        return ("ObjectNotFound", f"{lookup.field}: no S3 object {lookup.uri}")
    return ("NothingAtPrefix", f"{lookup.field}: nothing under {lookup.uri.rstrip('/')}/ in S3")


# A committed checkpoint, as the trainer writes it (trainer/mtrl_trainer/checkpoint.py): its
# folder's COMPLETE marker, written last.
COMMITTED_CHECKPOINT = re.compile(r"(?:^|/)checkpoints/step-(\d{6,})/COMPLETE$")


def resume_problem(spec: MultiTurnRLRunSpec, keys: list[str]) -> tuple[str, str] | None:
    """A spec.output.resumeFrom whose newest committed checkpoint (the one the trainer resumes
    from: the highest step under it) is at or past grpo.maxSteps: the run would play no step,
    train nothing and write no adapter of its own."""
    steps = [int(m.group(1)) for key in keys if (m := COMMITTED_CHECKPOINT.search(key))]
    if not steps or max(steps) < spec.grpo.max_steps:
        return None
    return ("ResumePastMaxSteps",
            f"spec.output.resumeFrom: its newest checkpoint is at step {max(steps)}, at or past "
            f"spec.grpo.maxSteps {spec.grpo.max_steps}: this run would train nothing; raise "
            "maxSteps or resume from an earlier checkpoint")


def ecs_cluster_problem(cluster: str, region: str, described: dict[str, Any]) -> tuple[str, str] | None:
    """DescribeClusters' answer for one cluster: missing (a failure with reason MISSING) or not
    ACTIVE (INACTIVE: deleted; PROVISIONING/DEPROVISIONING...) cannot run tasks."""
    found = next((c for c in described.get("clusters") or []
                  if cluster in (c.get("clusterName"), c.get("clusterArn"))), None)
    status = (found or {}).get("status", "")
    if found is None or status == "INACTIVE":
        return ("ClusterNotFoundException",
                f"ECS cluster {cluster!r} was not found in {region} (DescribeClusters): set "
                "spec.workers.ecs.cluster or the operator's MTRL_ECS_CLUSTER")
    if status != "ACTIVE":
        return ("ClusterNotActive", f"ECS cluster {cluster!r} in {region} is {status}, not "
                                    "ACTIVE (DescribeClusters)")
    return None


def _quantity(node: dict[str, Any], resource: str) -> int:
    raw = ((node.get("status") or {}).get("allocatable") or {}).get(resource, "0")
    try:
        return int(raw)
    except ValueError:  # extended resources are integers; anything else counts as none
        return 0


def _most(nodes: list[dict[str, Any]], resource: str) -> dict[str, Any]:
    return max(nodes, key=lambda n: _quantity(n, resource))


def _name(node: dict[str, Any]) -> str:
    return str(node["metadata"]["name"])


def nodes_problem(spec: MultiTurnRLRunSpec, nodes: list[dict[str, Any]]) -> tuple[str, str] | None:
    """Whether the cluster has nodes the trainer can ever land on: of its instance type, with
    the GPUs and EFA devices it asks for per node, as many as it asks for. For clusters with a
    fixed set of nodes (HyperPod instance groups); one that adds nodes on demand turns this
    check off (MTRL_PREFLIGHT_NODES=false)."""
    trainer = spec.trainer
    wanted = trainer.instance_type
    typed = [n for n in nodes if (n["metadata"].get("labels") or {}).get(INSTANCE_TYPE_LABEL) == wanted]
    if not typed:
        present = sorted({t for n in nodes
                          if (t := (n["metadata"].get("labels") or {}).get(INSTANCE_TYPE_LABEL))})
        return ("NoNodeOfInstanceType",
                f"spec.trainer.instanceType: no node has {INSTANCE_TYPE_LABEL}={wanted} (the "
                f"cluster has {', '.join(present) or 'no typed nodes'})")
    for resource, asked, field in ((GPU, trainer.gpus_per_node, "gpusPerNode"),
                                   (EFA, trainer.efa_per_node, "efaPerNode")):
        most = _most(typed, resource)
        if asked > _quantity(most, resource):
            return ("InsufficientResources",
                    f"spec.trainer.{field} asks for {asked} {resource} per node; nodes of "
                    f"{wanted} have at most {_quantity(most, resource)} (node {_name(most)})")
    fitting = [n for n in typed if _quantity(n, GPU) >= trainer.gpus_per_node
               and _quantity(n, EFA) >= trainer.efa_per_node]
    if len(fitting) < trainer.nodes:
        return ("NotEnoughNodes", f"spec.trainer.nodes asks for {trainer.nodes} nodes of "
                                  f"{wanted}; the cluster has {len(fitting)}")
    return None


def verdict(problems: list[tuple[str, str]]) -> tuple[str, str] | None:
    """What preflight found, as the run's (reason, message): the first problem's reason, its
    sentence, and every other problem after it, so that one apply tells the user all there
    is to fix (the message leads with the first and counts the rest)."""
    if not problems:
        return None
    (reason, first), rest = problems[0], [message for _, message in problems[1:]]
    if not rest:
        return reason, first
    return reason, f"{first} (and {len(rest)} more: {'; '.join(rest)})"
