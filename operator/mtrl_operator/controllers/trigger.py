"""The trigger controller: one reconcile per trigger (finalizer, queues, bucket notification,
history limits, status) and one consumer task per trigger that long-polls its queue.

Both take the trigger's lock around everything they change, so a batch of notifications and
a reconcile never interleave. The status is written by this controller alone; the copy it
last wrote is the one it builds on (the watch may still show an older one).

Crash consistency: a run's name is a function of the object, a message is deleted only after
its run exists and the status records it, and queues are found by name before being made.
Killed between any two calls, the restarted operator redelivers, finds, and creates nothing
twice.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from mtrl_api import GROUP
from mtrl_api.run import Phase
from mtrl_api.trigger import MultiTurnRLTriggerSpec, MultiTurnRLTriggerStatus, ObjectOutcome
from mtrl_operator import metrics
from mtrl_operator.adapters.kube import Kube
from mtrl_operator.adapters.trigger_aws import NotificationQueue, Received, TriggerAws
from mtrl_operator.builders import triggers as build
from mtrl_operator.errors import CloudError, SpecError, StaleCopy
from mtrl_operator.naming import (
    ANNOTATION_FORCE_RELEASE,
    FINALIZER,
    TAG_SOURCE_BUCKET,
    TAG_TRIGGER_UID,
    TriggerNames,
)
from mtrl_operator.reconcile import trigger as reconcile_trigger
from mtrl_operator.reconcile.notifications import MalformedNotification, ObjectEvent, parse
from mtrl_operator.reconcile.sweep import plan_sweep
from mtrl_operator.reconcile.trigger import QueueState, RunView
from mtrl_operator.settings import Settings
from mtrl_operator.workqueue import WorkQueue, every

log = logging.getLogger("mtrl.trigger")

Key = tuple[str, str]  # (namespace, name)
KIND = "MultiTurnRLTrigger"
POLL_SECONDS = 20  # SQS's longest long poll: the cheapest way to wait
AWS_RECHECK_SECONDS = 300.0  # queues and bucket notification are looked at again this often
AWS_RETRY_SECONDS = 15.0


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _owner_uid(run: dict[str, Any]) -> str | None:
    for ref in run["metadata"].get("ownerReferences") or []:
        if ref.get("kind") == "MultiTurnRLTrigger" and ref.get("controller") \
                and str(ref.get("apiVersion", "")).startswith(f"{GROUP}/"):
            return str(ref["uid"])
    return None


def _spec_problem(body: dict[str, Any]) -> tuple[MultiTurnRLTriggerSpec | None,
                                                 tuple[str, str] | None]:
    """The spec, or why it cannot be read (the API server's schema lets little through, but a
    trigger stored under an older schema can still fail the models)."""
    try:
        return MultiTurnRLTriggerSpec.model_validate(body.get("spec") or {}), None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        return None, ("InvalidSpec", f"spec.{where}: {first['msg']}")


@dataclass
class Batch:
    """One batch of notifications of one trigger, and what handling it has produced so far."""

    body: dict[str, Any]
    names: TriggerNames
    spec: MultiTurnRLTriggerSpec
    status: MultiTurnRLTriggerStatus
    runs: list[RunView]
    queue: QueueState
    sqs: NotificationQueue
    events: list[tuple[str, str, str]] = field(default_factory=list)

    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))


class TriggerController:
    def __init__(self, settings: Settings, kube: Kube, aws: TriggerAws) -> None:
        self.settings = settings
        self.kube = kube
        self.aws = aws
        self.triggers: dict[Key, dict[str, Any]] = {}
        self.keys_by_uid: dict[str, Key] = {}
        self.runs: dict[str, dict[str, dict[str, Any]]] = {}  # trigger uid -> run name -> run
        self.statuses: dict[str, MultiTurnRLTriggerStatus] = {}  # what we last wrote
        self.queue_states: dict[str, QueueState] = {}
        self.aws_checked: dict[str, tuple[int, float]] = {}  # uid -> (generation, monotonic)
        self.consumers: dict[str, asyncio.Task[None]] = {}
        self.changed: dict[str, asyncio.Event] = defaultdict(asyncio.Event)
        self.locks: dict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        self.orphans_seen: dict[str, float] = {}  # queue ARN -> first sighting as an orphan
        self.queue: WorkQueue[Key] | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.queue = WorkQueue(self.reconcile, workers=self.settings.workers)
        if self.settings.sweep_interval_seconds > 0:
            self._tasks.append(asyncio.create_task(every(
                self.settings.sweep_interval_seconds, self.sweep_once, "trigger sweep")))

    async def stop(self) -> None:
        tasks = [*self._tasks, *self.consumers.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.queue:
            await self.queue.stop()

    # ------------------------------------------------------------------ events in

    def on_trigger(self, event_type: str | None, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        key, uid = (meta["namespace"], meta["name"]), meta["uid"]
        if event_type == "DELETED":
            self.triggers.pop(key, None)
            self.keys_by_uid.pop(uid, None)
            for cache in (self.statuses, self.queue_states, self.aws_checked, self.runs,
                          self.changed, self.locks):
                cache.pop(uid, None)
            consumer = self.consumers.pop(uid, None)
            if consumer:
                consumer.cancel()
            if self.queue:
                self.queue.forget(key)
            return
        self.triggers[key] = body
        self.keys_by_uid[uid] = key
        self.changed[uid].set()  # a suspended consumer looks again
        if self.queue:
            self.queue.add(key)

    def on_run(self, event_type: str | None, run: dict[str, Any]) -> None:
        uid = _owner_uid(run)
        if uid is None:
            return
        if event_type == "DELETED":
            # Never a new entry: a run's DELETED after its trigger's own would leak one.
            runs = self.runs.get(uid, {})
            runs.pop(run["metadata"]["name"], None)
            if not runs:
                self.runs.pop(uid, None)
        else:  # a run may arrive before its trigger: kept until it, or the trigger, goes
            self.runs.setdefault(uid, {})[run["metadata"]["name"]] = run
        key = self.keys_by_uid.get(uid)
        if key and self.queue:
            self.queue.add(key)

    # ------------------------------------------------------------------ helpers

    def _names(self, body: dict[str, Any]) -> TriggerNames:
        meta = body["metadata"]
        return TriggerNames(meta["namespace"], meta["name"], meta["uid"],
                            self.settings.operator_id, self.settings.cluster_id)

    def _status(self, body: dict[str, Any]) -> MultiTurnRLTriggerStatus:
        uid = body["metadata"]["uid"]
        if uid in self.statuses:
            return self.statuses[uid]
        try:
            return MultiTurnRLTriggerStatus.model_validate(body.get("status") or {})
        except ValidationError:
            log.warning("unreadable status on trigger %s; starting from an empty one",
                        body["metadata"]["name"])
            return MultiTurnRLTriggerStatus()

    def _run_views(self, uid: str) -> list[RunView]:
        return [RunView.of(run) for run in self.runs.get(uid, {}).values()]

    async def _publish(self, body: dict[str, Any], status: MultiTurnRLTriggerStatus) -> None:
        """Write the status only when it changed; fields that went away are nulled."""
        meta = body["metadata"]
        old, new = self._status(body).wire(), status.wire()
        if old != new:
            await self.kube.apply_status(meta["namespace"], meta["name"], new,
                                         reconcile_trigger.CONDITION_TYPES, kind=KIND)
        self.statuses[meta["uid"]] = status

    def _mark_deleting(self, uid: str, name: str) -> None:
        """Our cache sees our own deletion before the watch echoes it. (A new dict: the run
        controller caches the same watch object.)"""
        run = self.runs.get(uid, {}).get(name)
        if run is not None:
            self.runs[uid][name] = {**run, "metadata": {
                **run["metadata"], "deletionTimestamp": _now().isoformat()}}

    # ------------------------------------------------------------------ reconcile

    async def reconcile(self, key: Key) -> float | None:
        body = self.triggers.get(key)
        if body is None:
            return None
        async with self.locks[body["metadata"]["uid"]]:
            body = self.triggers.get(key)
            if body is None:
                return None
            try:
                return await self._reconcile(body)
            except StaleCopy:  # a stale cached copy; the watch brings a new one
                return 0.5
            except Exception as exc:
                await self._report_error(body, exc)
                raise

    async def _report_error(self, body: dict[str, Any], exc: Exception) -> None:
        """Persistent failures (e.g. a deletion that cannot reach AWS) show on the trigger."""
        metrics.RECONCILE_ERRORS.labels(kind=type(exc).__name__).inc()
        await self.kube.event(body, "Warning", "ReconcileError",
                              f"{type(exc).__name__}: {exc}; retrying with backoff", kind=KIND)

    async def _reconcile(self, body: dict[str, Any]) -> float | None:
        meta = body["metadata"]
        names = self._names(body)
        finalizers = list(meta.get("finalizers") or [])
        if meta.get("deletionTimestamp"):
            await self._stop_consumer(names.uid)
            if FINALIZER in finalizers:
                await self._finalize(body, names, finalizers)
            return None
        if FINALIZER not in finalizers:
            # Before anything exists in AWS: nothing may be made without the finalizer.
            meta.update(await self.kube.set_finalizers(
                names.namespace, names.name, [*finalizers, FINALIZER], meta["resourceVersion"],
                kind=KIND) or {})
            return 0.0

        spec, problem = _spec_problem(body)
        generation = int(meta.get("generation") or 1)
        if spec is None:  # reported, and looked at again when the spec changes
            assert problem is not None
            await self._publish(body, reconcile_trigger.invalid(
                self._status(body), generation, problem, _now()))
            await self._stop_consumer(names.uid)
            return None
        queue = self.queue_states.get(names.uid)
        checked = self.aws_checked.get(names.uid)
        if queue is None or checked is None or checked[0] != generation \
                or time.monotonic() - checked[1] > AWS_RECHECK_SECONDS:
            try:
                queue = await self._ensure_aws(names, spec)
            except CloudError as exc:
                problem = (exc.reason, str(exc))
                log.warning("trigger %s/%s: %s", names.namespace, names.name, problem[1])
            else:
                self.queue_states[names.uid] = queue
                self.aws_checked[names.uid] = (generation, time.monotonic())

        pruned = reconcile_trigger.prune(spec, self._run_views(names.uid))
        for name in pruned:
            await self.kube.delete("MultiTurnRLRun", name, names.namespace)
            self._mark_deleting(names.uid, name)
        if pruned:
            await self.kube.event(body, "Normal", "HistoryPruned",
                                  f"deleted finished run(s) beyond the history limits: "
                                  f"{', '.join(pruned)} (their outputs in S3 stay)", kind=KIND)

        before = self._status(body)
        status = reconcile_trigger.observe(before, spec, generation,
                                           self._run_views(names.uid), queue, problem, _now())
        await self._publish(body, status)
        if problem and not any(c.type == "Ready" and c.reason == problem[0]
                               for c in before.conditions):
            await self.kube.event(body, "Warning", problem[0], problem[1], kind=KIND)
        if queue is not None:
            self._ensure_consumer(names.uid)
        return AWS_RETRY_SECONDS if problem else AWS_RECHECK_SECONDS

    async def _ensure_aws(self, names: TriggerNames, spec: MultiTurnRLTriggerSpec) -> QueueState:
        if spec.queue.url:
            return await self.aws.given_queue(spec.queue.url)
        queue = await self.aws.ensure_queues(names, spec.source.s3.bucket)
        if await self.aws.ensure_notification(names, spec.source.s3, queue.arn):
            log.info("trigger %s/%s: bucket %s now notifies %s", names.namespace, names.name,
                     spec.source.s3.bucket, names.queue)
        return queue

    async def _finalize(self, body: dict[str, Any], names: TriggerNames,
                        finalizers: list[str]) -> None:
        """Remove what the operator made (the bucket's entry first, so S3 stops sending, then
        the queues); runs are the garbage collector's (ownerReferences), outputs nobody's."""
        meta = body["metadata"]
        if (meta.get("annotations") or {}).get(ANNOTATION_FORCE_RELEASE) == "true":
            await self.kube.event(body, "Warning", "ForceReleased",
                                  "released by annotation without cleanup; the sweeper deletes "
                                  "the queues and the bucket's entry", kind=KIND)
        else:
            spec = body.get("spec") or {}
            if not (spec.get("queue") or {}).get("url"):
                bucket = ((spec.get("source") or {}).get("s3") or {}).get("bucket")
                if bucket:
                    await self.aws.remove_notification(bucket, names.notification_id)
                await self.aws.delete_queues(names)
        await self.kube.remove_finalizer(names.namespace, names.name, finalizers, FINALIZER,
                                         kind=KIND)

    # ------------------------------------------------------------------ consuming

    def _ensure_consumer(self, uid: str) -> None:
        task = self.consumers.get(uid)
        if task is None or task.done():
            self.consumers[uid] = asyncio.create_task(self._consume(uid))
        self.changed[uid].set()

    async def _stop_consumer(self, uid: str) -> None:
        task = self.consumers.pop(uid, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _current(self, uid: str) -> dict[str, Any] | None:
        key = self.keys_by_uid.get(uid)
        return self.triggers.get(key) if key else None

    @staticmethod
    def _paused(body: dict[str, Any]) -> bool:
        return bool((body.get("spec") or {}).get("suspend")) \
            or bool(body["metadata"].get("deletionTimestamp"))

    async def _consume(self, uid: str) -> None:
        """Long-poll the trigger's queue until the trigger goes. While it is suspended the
        messages stay in the queue; a poll that returns just as it is suspended hands its
        messages back (visibility 0) instead of acting on them."""
        sqs = self.aws.consumer()
        failures = 0
        try:
            while True:
                body, queue = self._current(uid), self.queue_states.get(uid)
                if body is None:  # the trigger is gone (checked first: no cache entry made)
                    return
                changed = self.changed[uid]
                changed.clear()
                if queue is None or self._paused(body):
                    await changed.wait()
                    continue
                try:
                    messages = await sqs.receive(queue.url, wait_s=POLL_SECONDS)
                    body = self._current(uid)
                    if messages and (body is None or self._paused(body)):
                        await sqs.hand_back(queue.url, [m.receipt_handle for m in messages])
                    elif messages and body is not None:
                        async with self.locks[uid]:
                            await self._process(uid, queue, sqs, messages)
                    failures = 0
                except asyncio.CancelledError:
                    raise
                except Exception as exc:
                    failures += 1
                    delay = min(60.0, 2.0 ** failures)
                    log.warning("trigger %s: consuming %s failed (%d in a row): %r; again in "
                                "%.0fs", self.keys_by_uid.get(uid), queue.url, failures, exc,
                                delay)
                    await asyncio.sleep(delay)
        finally:
            sqs.close()

    async def _process(self, uid: str, queue: QueueState, sqs: NotificationQueue,
                       messages: list[Received]) -> None:
        """One batch: each message's objects decided and acted on in order; the status written
        once; then the handled messages deleted. A failure part-way leaves the rest in the
        queue for redelivery, where the run names make a second try harmless."""
        body = self._current(uid)
        if body is None:
            return
        spec, _ = _spec_problem(body)
        if spec is None:  # the reconcile reports it; the messages wait for a readable spec
            return
        batch = Batch(body, self._names(body), spec, self._status(body), self._run_views(uid),
                      queue, sqs)
        handled: list[str] = []
        try:
            for message in messages:
                await self._handle(batch, message)
                handled.append(message.receipt_handle)
        finally:
            await self._publish(body, batch.status)
            for type_, reason, text in batch.events:
                await self.kube.event(body, type_, reason, text, kind=KIND)
            if handled:
                for failure in await sqs.delete(queue.url, handled):
                    # Redelivered later, and then a Duplicate.
                    log.warning("trigger %s/%s: could not delete a handled message: %s",
                                batch.names.namespace, batch.names.name, failure)

    async def _handle(self, batch: Batch, message: Received) -> None:
        try:
            notification = parse(message.body)
        except MalformedNotification as exc:
            await self._dead_letter(batch, message, str(exc))
            return
        for obj in notification.objects:
            admission = reconcile_trigger.admit(batch.spec, batch.status, batch.runs, obj,
                                                batch.names)
            if admission.outcome == ObjectOutcome.CREATED:
                admission = await self._create(batch, obj, admission)
            elif admission.outcome == ObjectOutcome.SKIPPED:
                batch.event("Normal", "RunSkipped", f"{obj.uri}: {admission.reason}")
            metrics.TRIGGER_OBJECTS.labels(outcome=admission.outcome.value).inc()
            batch.status = reconcile_trigger.record(batch.status, obj, admission, _now())

    async def _create(self, batch: Batch, obj: ObjectEvent,
                      admission: reconcile_trigger.Admission) -> reconcile_trigger.Admission:
        assert admission.run is not None and admission.digest is not None
        names = batch.names
        for old in admission.replace:
            await self.kube.delete("MultiTurnRLRun", old, names.namespace)
            self._mark_deleting(names.uid, old)
            batch.runs[:] = [replace(r, deleting=True) if r.name == old else r
                             for r in batch.runs]
            batch.event("Normal", "RunReplaced", f"deleted run {old} (concurrencyPolicy "
                                                 f"Replace) for {obj.uri}")
        manifest = build.run_manifest(batch.body, names, obj, admission.digest)
        try:
            created = await self.kube.create(manifest)
        except SpecError as exc:  # a template the run's own schema refuses with this object
            reason = f"the API server refused run {admission.run}: {exc}"
            batch.event("Warning", "RunRejected", f"{obj.uri}: {reason}")
            return replace(admission, outcome=ObjectOutcome.SKIPPED, reason=reason)
        if not created:
            return replace(admission, outcome=ObjectOutcome.DUPLICATE,
                           reason=f"run {admission.run} already exists")
        batch.runs.append(RunView(admission.run, Phase.PENDING, _now()))
        # Until the watch brings it, the next batch must see it too (Forbid, Replace).
        self.runs.setdefault(names.uid, {}).setdefault(admission.run, manifest)
        batch.event("Normal", "RunCreated", f"created run {admission.run} for {obj.uri}")
        log.info("trigger %s/%s: created run %s for %s", names.namespace, names.name,
                 admission.run, obj.uri)
        return admission

    async def _dead_letter(self, batch: Batch, message: Received, error: str) -> None:
        metrics.TRIGGER_MALFORMED.inc()
        where = f"{batch.names.namespace}/{batch.names.name}"
        if batch.queue.dead_letter_url:
            # SQS attribute names allow no '/': hence not the mtrl.dev/ form of the tags.
            await batch.sqs.send(batch.queue.dead_letter_url, message.body, {
                "mtrl-trigger": where, "mtrl-error": error[:1024] or "malformed"})
            fate = f"moved to {batch.queue.dead_letter_url.rsplit('/', 1)[-1]}"
        else:
            fate = "deleted (the queue has no dead-letter queue)"
        log.warning("trigger %s: malformed notification %s (%s): %s", where,
                    message.message_id, error, fate)
        batch.event("Warning", "MalformedNotification",
                    f"message {message.message_id}: {error}; {fate}")

    # ------------------------------------------------------------------ sweeper

    async def sweep_once(self) -> int:
        """Delete trigger queues (and their bucket entry) whose trigger no longer exists, with
        the runs' sweeper's rules (`reconcile.sweep`). The tags are read before the triggers,
        so a trigger made in between is never missed."""
        tagged = await self.aws.tagged_queues(self.settings.owner)
        known = await self.kube.uids(KIND, self.settings.list_scopes) if tagged else set()
        plan = plan_sweep(tagged, owner=self.settings.owner, uid_tag=TAG_TRIGGER_UID,
                          known=known, watches=self.settings.watches,
                          first_seen=self.orphans_seen, now=time.monotonic(),
                          min_age=self.settings.sweep_min_age_seconds)
        self.orphans_seen = plan.first_seen
        swept = 0
        for arn, tags in plan.delete:
            name, bucket = arn.rsplit(":", 1)[-1], tags.get(TAG_SOURCE_BUCKET, "")
            try:
                if bucket and not name.endswith("-dlq"):
                    await self.aws.remove_notification(bucket, name)  # its Id is its name
                swept += await self.aws.delete_queue_by_arn(arn)
            except CloudError as exc:
                log.warning("sweeper could not delete trigger queue %s: %s", arn, exc)
        if swept:
            metrics.SWEPT.inc(swept)
            log.info("sweeper deleted %d orphaned trigger queue(s)", swept)
        return swept
