"""Preflight look-ups: S3 locations and the ECS cluster, each looked up once before a run
creates anything, and the cluster's nodes, read from the watched cache. What they mean is
`reconcile/preflight.py`."""

from __future__ import annotations

from typing import Any

from mtrl_api.run import MultiTurnRLRunSpec, MultiTurnRLRunStatus, WorkerBackend
from mtrl_operator.adapters.aws import Aws
from mtrl_operator.reconcile.preflight import (
    Found,
    ecs_cluster_problem,
    nodes_problem,
    resume_problem,
    s3_lookups,
    s3_problem,
    verdict,
)

PREFLIGHT = "Preflight"  # the run's condition: True once the checks passed
RESUME_FROM = "spec.output.resumeFrom"
MAX_RESUME_KEYS = 10_000  # keys listed under resumeFrom (ten ListObjectsV2 pages) at most


def due(status: MultiTurnRLRunStatus, deleting: bool) -> bool:
    """Before the first trainer attempt is launched, until the checks have passed once: a run
    already training is never failed by a check it did not have when it started."""
    return (not deleting and not status.phase.finished and status.launched_attempt == 0
            and not any(c.type == PREFLIGHT and c.status == "True" for c in status.conditions))


async def preflight(spec: MultiTurnRLRunSpec, aws: Aws, ecs_cluster: str,
                    nodes: list[dict[str, Any]] | None
                    ) -> tuple[tuple[str, str] | None, str]:
    """(reason, message) naming every check that failed, the first leading, or None and what
    was checked. `nodes`: the cluster's, or None when they are not checked."""
    problems: list[tuple[str, str]] = []
    checked, notes = ["S3 locations"], []
    for lookup in s3_lookups(spec):
        found = await aws.s3_find(lookup.bucket, lookup.prefix, lookup.whole_key)
        if (problem := s3_problem(lookup, found)) is not None:
            problems.append(problem)
        elif found == Found.DENIED:
            notes.append(f"{lookup.field} not checked (the operator may not list bucket "
                         f"{lookup.bucket!r})")
        elif lookup.field == RESUME_FROM and found == Found.PRESENT:
            keys = await aws.s3_keys(lookup.bucket, lookup.prefix, MAX_RESUME_KEYS)
            if (problem := resume_problem(spec, keys)) is not None:
                problems.append(problem)
    if spec.workers.backend == WorkerBackend.ECS_FARGATE:
        described = await aws.describe_cluster(ecs_cluster)
        if (problem := ecs_cluster_problem(ecs_cluster, aws.region, described)) is not None:
            problems.append(problem)
        checked.append(f"ECS cluster {ecs_cluster!r}")
    if nodes is None:
        notes.append("nodes not checked (turned off, or the operator may not list nodes)")
    elif (problem := nodes_problem(spec, nodes)) is not None:
        problems.append(problem)
    else:
        checked.append(f"nodes of {spec.trainer.instance_type}")
    if problems:
        return verdict(problems), ""
    return None, "; ".join([f"checked {', '.join(checked)}", *notes])
