"""A trigger's decisions, as pure functions: what to do with one object, which finished runs to
prune, and what the status says. Nothing here talks to a server.

Identity is `object_hash(key, ETag)`: the run name carries it, and the status keeps the latest
hashes, so neither a redelivered message, a repeated upload of the same bytes, nor a
notification for an object whose run was pruned long ago ever makes a second run.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from mtrl_api.run import Phase
from mtrl_api.trigger import (
    ACTIVE_MAX,
    PROCESSED_OBJECTS_MAX,
    RECENT_OBJECTS_MAX,
    ConcurrencyPolicy,
    MultiTurnRLTriggerSpec,
    MultiTurnRLTriggerStatus,
    ObjectOutcome,
    ObjectRecord,
    S3Source,
)
from mtrl_operator.naming import TriggerNames, object_hash
from mtrl_operator.reconcile.draft import set_condition
from mtrl_operator.reconcile.notifications import ObjectEvent

CONDITION_TYPES = frozenset({"Ready"})  # the trigger's conditions this operator writes


def _time(value: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


@dataclass(frozen=True)
class RunView:
    """What a trigger needs to know about one of its runs."""

    name: str
    phase: Phase
    created: dt.datetime
    completed: dt.datetime | None = None
    deleting: bool = False

    @property
    def active(self) -> bool:
        return not self.phase.finished and not self.deleting

    @classmethod
    def of(cls, run: dict[str, Any]) -> RunView:
        meta, status = run["metadata"], run.get("status") or {}
        try:
            phase = Phase(status.get("phase") or Phase.PENDING)
        except ValueError:
            phase = Phase.PENDING
        return cls(name=meta["name"], phase=phase,
                   created=_time(meta.get("creationTimestamp")) or dt.datetime.now(dt.UTC),
                   completed=_time(status.get("completionTime")),
                   deleting=bool(meta.get("deletionTimestamp")))


@dataclass(frozen=True)
class Admission:
    """The decision for one object."""

    outcome: ObjectOutcome
    run: str | None = None
    digest: str | None = None
    reason: str = ""
    replace: tuple[str, ...] = ()  # active runs to delete first (Replace)


@dataclass(frozen=True)
class QueueState:
    url: str
    arn: str
    dead_letter_url: str | None


def filter_reason(source: S3Source, obj: ObjectEvent) -> str | None:
    """Why the object starts no run, or None when it does. S3 filters too, but a queue given by
    the user may carry anything."""
    if obj.bucket != source.bucket:
        return f"bucket {obj.bucket} is not the watched bucket {source.bucket}"
    if not obj.created:
        return f"{obj.event_name} is not an object creation"
    if not obj.key.startswith(source.prefix):
        return f"key is outside prefix {source.prefix!r}"
    if not obj.key.endswith(source.suffix):
        return f"key does not end with {source.suffix!r}"
    return None


def admit(spec: MultiTurnRLTriggerSpec, status: MultiTurnRLTriggerStatus, runs: list[RunView],
          obj: ObjectEvent, names: TriggerNames) -> Admission:
    why = filter_reason(spec.source.s3, obj)
    if why:
        return Admission(ObjectOutcome.FILTERED, reason=why)
    digest = object_hash(obj.key, obj.etag)
    run = names.run_name(digest)
    if digest in status.processed_objects or any(r.name == run for r in runs):
        return Admission(ObjectOutcome.DUPLICATE, run, digest,
                         f"this object version was already processed (run {run})")
    active = sorted(r.name for r in runs if r.active)
    if active and spec.concurrency_policy == ConcurrencyPolicy.FORBID:
        return Admission(ObjectOutcome.SKIPPED, run, digest,
                         f"concurrencyPolicy Forbid and run {', '.join(active)} still active")
    replace = tuple(active) if spec.concurrency_policy == ConcurrencyPolicy.REPLACE else ()
    return Admission(ObjectOutcome.CREATED, run, digest, replace=replace)


def record(status: MultiTurnRLTriggerStatus, obj: ObjectEvent, admission: Admission,
           now: dt.datetime) -> MultiTurnRLTriggerStatus:
    """The status with the object's outcome added; both lists are bounded, oldest out first."""
    out = status.model_copy(deep=True)
    out.recent_objects = [*out.recent_objects, ObjectRecord(
        key=obj.key[:1024], etag=obj.etag[:128], version_id=obj.version_id, run=admission.run,
        time=now, outcome=admission.outcome, reason=admission.reason[:1024],
    )][-RECENT_OBJECTS_MAX:]
    if admission.digest and admission.outcome != ObjectOutcome.FILTERED \
            and admission.digest not in out.processed_objects:
        out.processed_objects = [*out.processed_objects, admission.digest][-PROCESSED_OBJECTS_MAX:]
    if admission.outcome == ObjectOutcome.CREATED:
        out.last_trigger_time = now
        out.runs_created += 1
    return out


def prune(spec: MultiTurnRLTriggerSpec, runs: list[RunView]) -> list[str]:
    """Finished runs beyond the history limits, oldest first out (as CronJob does)."""
    out: list[str] = []
    for phase, limit in ((Phase.SUCCEEDED, spec.successful_runs_history_limit),
                         (Phase.FAILED, spec.failed_runs_history_limit)):
        finished = sorted((r for r in runs if r.phase == phase and not r.deleting),
                          key=lambda r: (r.completed or r.created, r.name), reverse=True)
        out += [r.name for r in finished[limit:]]
    return out


def observe(status: MultiTurnRLTriggerStatus, spec: MultiTurnRLTriggerSpec, generation: int,
            runs: list[RunView], queue: QueueState | None, problem: tuple[str, str] | None,
            now: dt.datetime) -> MultiTurnRLTriggerStatus:
    """The status after a reconcile: runs, queue and the Ready condition."""
    out = status.model_copy(deep=True)
    out.observed_generation = generation
    active = sorted(r.name for r in runs if r.active)
    out.active, out.active_count = active[:ACTIVE_MAX], len(active)
    if queue is not None:
        out.queue_url, out.queue_arn = queue.url, queue.arn
        out.dead_letter_queue_url = queue.dead_letter_url
    source = spec.source.s3
    if problem is not None:
        ready, reason, message = False, *problem
    elif queue is None:
        ready, reason, message = False, "Provisioning", "setting up the queue and the bucket's " \
                                                        "notification"
    elif spec.suspend:
        ready, reason, message = False, "Suspended", "notifications wait in the queue until " \
                                                     "spec.suspend is false"
    else:
        ready, reason, message = True, "Watching", f"watching s3://{source.bucket}/" \
                                                   f"{source.prefix}*{source.suffix}"
    out.conditions = set_condition(out.conditions, "Ready", ready, reason, message, now, generation)
    return out


def invalid(status: MultiTurnRLTriggerStatus, generation: int, problem: tuple[str, str],
            now: dt.datetime) -> MultiTurnRLTriggerStatus:
    """The status of a trigger whose spec cannot be read: not Ready, saying why and where."""
    out = status.model_copy(deep=True)
    out.observed_generation = generation
    reason, message = problem
    out.conditions = set_condition(out.conditions, "Ready", False, reason, message, now,
                                   generation)
    return out
