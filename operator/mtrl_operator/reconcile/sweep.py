"""What the orphan sweepers may delete, decided from tags alone.

An AWS account is shared: a dev and a prod cluster, two installs watching different
namespaces, an older operator version. A sweeper that deleted whatever carried its operator id
and named no run it could see deleted the others' queues, tasks and task definitions every
sweep. So a resource is an orphan of this operator only when all of these hold:

- it carries `mtrl.dev/managed-by`, this operator's `mtrl.dev/operator-id` and this
  cluster's `mtrl.dev/cluster-id` (the UID of its kube-system namespace, unless set);
- its `mtrl.dev/namespace` is one this operator watches: an install watching `team-a` never
  takes a run in `team-b` for gone, whichever install made it;
- the run (or trigger) its UID tag names does not exist;
- this sweeper has seen it as such for at least the minimum age. AWS's tagging API gives no
  creation time; counting from the first sighting by this process is never older than the
  resource, so nothing younger than the minimum is ever swept, whoever made it.

Resources without the cluster tag (made by an operator before it had one) are never swept;
a run of ours still tears down what its deterministic names find, tagged or not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from mtrl_rollout.queues import (
    MANAGED_BY,
    TAG_CLUSTER_ID,
    TAG_MANAGED_BY,
    TAG_NAMESPACE,
    TAG_OPERATOR_ID,
)

Tagged = tuple[str, Mapping[str, str]]  # (ARN, tags)


@dataclass(frozen=True)
class Owner:
    """The identity an operator writes into its tags and sweeps by."""

    operator_id: str
    cluster_id: str

    def made(self, tags: Mapping[str, str]) -> bool:
        """Whether these tags say this operator, in this cluster, made the resource."""
        return bool(self.cluster_id) and tags.get(TAG_MANAGED_BY) == MANAGED_BY and \
            tags.get(TAG_OPERATOR_ID) == self.operator_id and \
            tags.get(TAG_CLUSTER_ID) == self.cluster_id


@dataclass(frozen=True)
class SweepPlan:
    delete: list[Tagged]  # orphans old enough, in the order listed
    first_seen: dict[str, float]  # ARN -> first sighting, of every orphan seen this time


def plan_sweep(tagged: Iterable[Tagged], *, owner: Owner, uid_tag: str, known: set[str],
               watches: Callable[[str], bool], first_seen: Mapping[str, float], now: float,
               min_age: float) -> SweepPlan:
    """The orphans to delete now, and the sightings to remember until the next sweep (an ARN
    that is no orphan any more, or no longer listed, is forgotten)."""
    delete: list[Tagged] = []
    seen: dict[str, float] = {}
    for arn, tags in tagged:
        uid = tags.get(uid_tag)
        if uid is None or uid in known or not owner.made(tags) or \
                not watches(tags.get(TAG_NAMESPACE, "")):
            continue
        seen[arn] = since = first_seen.get(arn, now)
        if now - since >= min_age:
            delete.append((arn, tags))
    return SweepPlan(delete, seen)
