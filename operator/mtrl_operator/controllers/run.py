"""The run controller: the runs' cache, the work queue, and the reconcile that glues
observation, `reconcile.run.decide` and the actions together.

Runs arrive from kopf's watch; their children, their pods and the cluster's nodes from
`Children`'s watches; AWS state is read per reconcile, as much as `reconcile.lookups` asks. A
reconcile lists nothing in Kubernetes but a failed trainer's pods, once per failed attempt, so
its cost per run stays flat as runs are added.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ValidationError

from mtrl_api.run import (
    MultiTurnRLRunSpec,
    MultiTurnRLRunStatus,
    Phase,
    QueueRef,
    ResourceRefs,
    WorkerBackend,
)
from mtrl_operator import launchers, metrics
from mtrl_operator.adapters.aws import Aws
from mtrl_operator.adapters.kube import Kube
from mtrl_operator.builders.workers import LOG_STREAM_PREFIX
from mtrl_operator.builders.workers import log_group as worker_log_group
from mtrl_operator.controllers.children import Children
from mtrl_operator.controllers.preflight import due as preflight_due
from mtrl_operator.controllers.preflight import preflight
from mtrl_operator.controllers.run_actions import RunActions
from mtrl_operator.errors import SpecError, StaleCopy
from mtrl_operator.naming import (
    ANNOTATION_FORCE_RELEASE,
    FINALIZER,
    LABEL_ATTEMPT,
    TAG_RUN_UID,
    RunNames,
)
from mtrl_operator.reconcile import lookups
from mtrl_operator.reconcile.cost import refresh_due, steady
from mtrl_operator.reconcile.draft import (
    CONDITION_TYPES,
    Decision,
    EcsTask,
    Observed,
    TrainerObserved,
    TrainerReport,
    TrainerState,
    WorkerProblem,
)
from mtrl_operator.reconcile.readings import (
    progress_from_configmap,
    queue_hold,
    spec_problem,
    trainer_report,
    with_cause,
    with_pods,
)
from mtrl_operator.reconcile.run import decide, is_news, stalled
from mtrl_operator.reconcile.sweep import plan_sweep
from mtrl_operator.reconcile.workers import newest_stopped, pod_problem, stopped_task_problem
from mtrl_operator.settings import Settings
from mtrl_operator.workqueue import WorkQueue, every

log = logging.getLogger("mtrl.controller")

Key = tuple[str, str]  # (namespace, name)

# How long our own status write outranks what the watch brings, if its echo never comes.
EXPECTATION_S = 60.0


@dataclass
class WorkersSeen:
    """What a reconcile saw of the run's workers, on either backend."""

    exist: bool = False
    desired: int = 0
    ready: int = 0
    stopped: int = 0
    problem: WorkerProblem | None = None
    tasks: tuple[EcsTask, ...] = ()
    definitions_listed: bool = False  # ListTaskDefinitions was called (and found refs' one)
    refs: ResourceRefs = field(default_factory=ResourceRefs)


@dataclass(frozen=True)
class TrainerSeen:
    """What a reconcile saw of the run's trainer: the current attempt's workload, if any,
    every attempt's workload, the progress ConfigMap, and the workload the status names."""

    current: TrainerObserved | None
    workloads: dict[tuple[str, str], dict[str, Any]]
    progress: dict[str, Any] | None
    report: TrainerReport | None  # what `progress` says of the launch that wrote it
    kind: str | None
    name: str | None


def _report(progress: dict[str, Any] | None) -> TrainerReport | None:
    return trainer_report(progress) if progress else None


@dataclass(frozen=True)
class Expected:
    """A status write whose echo the watch has not delivered yet. Events from before it
    (another writer's label change, made first, delivered after our write) still carry the
    old status; a reconcile on that copy would write the same transition again and post its
    Event twice. So until the echo arrives, or the expectation expires, the cache keeps the
    status we wrote (the "expectations" of Kubernetes' own controllers:
    kubernetes/pkg/controller/controller_utils.go, ControllerExpectations)."""

    resource_version: str
    status: dict[str, Any]
    until: float

    def overlay(self, body: dict[str, Any], now: float) -> dict[str, Any] | None:
        """The body to cache; None once the expectation is met or expired."""
        if body["metadata"].get("resourceVersion") == self.resource_version or now > self.until:
            return None
        return {**body, "status": self.status}


def _reconcile_input(body: dict[str, Any]) -> tuple[Any, ...]:
    """What a reconcile reads from a run. The watch's echo of our own status write changes
    only the resourceVersion, so it costs no reconcile (and no AWS calls)."""
    meta = body["metadata"]
    return (meta.get("uid"), meta.get("generation"), meta.get("deletionTimestamp"),
            meta.get("finalizers"), meta.get("annotations"), body.get("spec"), body.get("status"))


class Controller:
    def __init__(self, settings: Settings, kube: Kube, aws: Aws) -> None:
        self.settings = settings
        self.kube = kube
        self.aws = aws
        self.runs: dict[Key, dict[str, Any]] = {}
        self.keys_by_uid: dict[str, Key] = {}
        self.children = Children(kube, settings.list_scopes, self._child_changed,
                                 nodes=settings.preflight_nodes)
        self.actions = RunActions(settings, kube, aws)
        self.phases: dict[Key, str] = {}  # for the runs-by-phase gauge, kept in O(1) per change
        self.polls: dict[Key, tuple[Any, int]] = {}  # last poll's outcome, polls in a row
        self.expected: dict[Key, Expected] = {}  # status writes not yet echoed by the watch
        self.failures: dict[Key, int] = {}  # failed reconciles in a row
        self.last_lines: dict[str, str] = {}  # stopped ECS task -> its worker's last log line
        self.cost_written: dict[Key, float] = {}  # when each run's status was last written
        # Each run's queues as last listed (monotonic time, role -> URL), by UID: SQS has no
        # watch, and ListQueues by prefix is the dearest read (lookups.queues_listed_again).
        self.queue_urls: dict[str, tuple[float, dict[str, str]]] = {}
        self.orphans_seen: dict[str, float] = {}  # ARN -> first sighting as an orphan
        self.queue: WorkQueue[Key] | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.queue = WorkQueue(self.reconcile, workers=self.settings.workers)
        self._tasks += self.children.watches()
        if self.settings.sweep_interval_seconds > 0:
            self._tasks.append(asyncio.create_task(
                every(self.settings.sweep_interval_seconds, self.sweep_once, "sweep")))

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.queue:
            await self.queue.stop()

    # ------------------------------------------------------------------ events in

    def on_run(self, event_type: str | None, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        if event_type == "DELETED":
            self._track_phase(key, None)
            metrics.forget_run(*key)
            self.polls.pop(key, None)
            self.failures.pop(key, None)
            self.expected.pop(key, None)
            self.cost_written.pop(key, None)
            self.runs.pop(key, None)
            self.keys_by_uid.pop(meta["uid"], None)
            self.children.forget(meta["uid"])
            self.actions.forget(meta["uid"])
            self.queue_urls.pop(meta["uid"], None)
            if self.queue:
                self.queue.forget(key)
            return
        expected = self.expected.get(key)
        if expected is not None:
            overlaid = expected.overlay(body, time.monotonic())
            if overlaid is None:
                del self.expected[key]
            else:
                body = overlaid
        previous = self.runs.get(key)
        self.runs[key] = body
        self._track_phase(key, (body.get("status") or {}).get("phase") or Phase.PENDING.value)
        if previous is None or previous.get("status") != body.get("status"):
            # From the stored status, not only after our own writes: a finished or suspended
            # run never writes again, and a restarted operator must still export its figures.
            metrics.set_run_figures(key[0], key[1], (body.get("status") or {}).get("progress")
                                    or {})
        self.keys_by_uid[meta["uid"]] = key
        if self.queue and (previous is None or _reconcile_input(previous) != _reconcile_input(body)):
            self.queue.add(key)

    def _track_phase(self, key: Key, phase: str | None) -> None:
        previous = self.phases.pop(key, None)
        if previous == phase:
            if phase is not None:
                self.phases[key] = phase
            return
        if previous is not None:
            metrics.RUNS_BY_PHASE.labels(phase=previous).dec()
        if phase is not None:
            metrics.RUNS_BY_PHASE.labels(phase=phase).inc()
            self.phases[key] = phase

    def _child_changed(self, uid: str) -> None:
        key = self.keys_by_uid.get(uid)
        if key and self.queue:
            self.queue.add(key)

    # ------------------------------------------------------------------ reconcile

    async def reconcile(self, key: Key) -> float | None:
        await self.children.synced.wait()
        body = self.runs.get(key)
        if body is None:
            return None
        started = time.perf_counter()
        try:
            requeue = await self._reconcile(body)
        except StaleCopy:  # our cached copy was stale; the watch brings a new one
            return 0.2
        except Exception as exc:
            self.failures[key] = self.failures.get(key, 0) + 1
            await self._report_error(body, exc, self.failures[key])
            raise
        finally:
            metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)
        self.failures.pop(key, None)
        return requeue

    async def _report_error(self, body: dict[str, Any], exc: Exception, failures: int) -> None:
        """Persistent failures are visible on the run, not only in the operator's log: an
        Event, and the run's status says what failed (never a blank phase)."""
        metrics.RECONCILE_ERRORS.labels(kind=type(exc).__name__).inc()
        cause = f"{type(exc).__name__}: {exc}"
        await self.kube.event(body, "Warning", "ReconcileError", f"{cause}; retrying with backoff")
        meta = body["metadata"]
        status = stalled(self._parse_status(body), deleting=meta.get("deletionTimestamp") is not None,
                         cause=cause[:1024], failures=failures, namespace=meta["namespace"],
                         name=meta["name"], now=dt.datetime.now(dt.UTC),
                         generation=meta.get("generation", 0))
        try:
            await self._publish(body, Decision([], status))
        except Exception as write_error:  # the API server may be what failed
            log.debug("could not write the failure into %s/%s: %s", meta["namespace"],
                      meta["name"], write_error)

    def _names(self, body: dict[str, Any]) -> RunNames:
        meta = body["metadata"]
        return RunNames(meta["namespace"], meta["name"], meta["uid"], self.settings.operator_id,
                        self.settings.cluster_id)

    async def _reconcile(self, body: dict[str, Any]) -> float | None:
        meta = body["metadata"]
        names = self._names(body)
        deleting = meta.get("deletionTimestamp") is not None
        finalizers = list(meta.get("finalizers") or [])
        if deleting and FINALIZER not in finalizers:
            return None
        if deleting and (meta.get("annotations") or {}).get(ANNOTATION_FORCE_RELEASE) == "true":
            await self.kube.event(body, "Warning", "ForceReleased",
                                  "released by annotation without cleanup; the orphan sweeper "
                                  "deletes what is left in AWS")
            await self.actions.remove_finalizer(body)
            return None
        if not deleting and FINALIZER not in finalizers:
            # Before anything is created: no resource may exist without the finalizer.
            meta.update(await self.kube.set_finalizers(
                names.namespace, names.name, [*finalizers, FINALIZER],
                meta["resourceVersion"]) or {})
            return 0.0

        status = self._parse_status(body)
        spec, spec_error = self._parse_spec(body, status)
        checked = None
        if spec is not None and spec_error is None and preflight_due(status, deleting):
            nodes = self.children.nodes
            spec_error, checked = await preflight(spec, self.aws, self.actions.cluster(spec),
                                                  None if nodes is None else list(nodes.values()))
        obs = replace(await self._fetch(names, spec, spec_error, status, deleting, body),
                      preflight=checked,
                      price=self.settings.price(spec.trainer.instance_type) if spec else None,
                      retry_backoff_seconds=self.settings.retry_backoff_seconds)
        decision = decide(obs)
        await self._publish(body, decision)
        try:
            done = await self.actions.run(body, names, spec, obs, decision)
            if done.queues is not None:  # the next reconcile need not list what was just made
                self.queue_urls[names.uid] = (time.monotonic(), done.queues)
            if (placement := done.placement) is not None:
                # What RunTask answered is news for the status (a shortfall, its backoff):
                # the same decision again, knowing it and from the status just written (what
                # that decision announced is not news twice); its actions were just done.
                decision = decide(replace(obs, status=decision.status, placement=placement))
                await self._publish(body, decision)
        except SpecError as exc:
            if deleting or decision.status.phase.finished:
                raise  # tearing down: retry with backoff; never fail twice
            # The spec names something that cannot exist: fail the run and tear down.
            log.warning("%s/%s: %s: %s", names.namespace, names.name, exc.reason, exc,
                        extra={"run": f"{names.namespace}/{names.name}"})
            decision = decide(replace(obs, spec_error=(exc.reason, str(exc))))
            await self._publish(body, decision)
            await self.actions.run(body, names, spec, obs, decision)
        if decision.requeue_after is None:
            # ECS tasks have no watch, and a missed event must not stall a run forever.
            return None if decision.status.phase.finished else self.settings.resync_seconds
        return self._backoff((names.namespace, names.name), decision)

    def _backoff(self, key: Key, decision: Decision) -> float:
        """A poll that found nothing changed waits twice as long as the last one, up to the
        resync period: a run waiting on AWS costs O(log wait) reconciles, however long the
        wait (with 500 runs starting at once, waits grow with the number of runs)."""
        assert decision.requeue_after is not None
        outcome = (steady(decision.status), tuple(decision.actions))  # models compare by value
        last, polls = self.polls.get(key, (None, 0))
        polls = polls + 1 if outcome == last else 0
        self.polls[key] = (outcome, polls)
        wait, resync = decision.requeue_after * 2 ** polls, self.settings.resync_seconds
        if decision.status.phase.finished:  # what is left: teardown, or the TTL's moment
            return min(wait, max(decision.requeue_after, resync))
        # A live run is looked at every resync period at least, whatever deadline is far
        # (ECS has no watch: a stopped worker task is seen only by looking).
        return min(wait, resync)

    def _parse_spec(self, body: dict[str, Any], status: MultiTurnRLRunStatus
                    ) -> tuple[MultiTurnRLRunSpec | None, tuple[str, str] | None]:
        """The spec, and what makes it unable to run. The checks against the operator's own
        settings (its pricing, its environment catalog, its ECS defaults) are made until the
        run starts: a run is judged by the settings it started with, so an upgrade of the
        operator never fails a run that is under way."""
        try:
            spec = MultiTurnRLRunSpec.model_validate(body.get("spec") or {})
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            return None, ("InvalidSpec", f"spec.{where}: {first['msg']}")
        return spec, spec_problem(spec, self.settings) if status.start_time is None else None

    @staticmethod
    def _parse_status(body: dict[str, Any]) -> MultiTurnRLRunStatus:
        try:
            return MultiTurnRLRunStatus.model_validate(body.get("status") or {})
        except ValidationError:
            log.warning("unreadable status on %s; starting from an empty one",
                        body["metadata"]["name"])
            return MultiTurnRLRunStatus()

    async def _fetch(self, names: RunNames, spec: MultiTurnRLRunSpec | None,
                     spec_error: tuple[str, str] | None, status: MultiTurnRLRunStatus,
                     deleting: bool, body: dict[str, Any]) -> Observed:
        """What `decide` looks at: the caches, and what `reconcile.lookups` asks to read."""
        aws = lookups.needs_aws(status, deleting)
        queue_urls = await self._queues(names, spec, status, deleting) if aws else {}
        workers = await self._fetch_workers(names, spec, status, deleting, aws, len(queue_urls))
        trainer = await self._fetch_trainer(names, spec, status, deleting)
        refs = workers.refs.model_copy(update={
            "queues": [QueueRef(role=r, url=u) for r, u in sorted(queue_urls.items())],
            "trainer_kind": trainer.kind, "trainer_name": trainer.name,
            "config_map": names.config_map if spec is not None and trainer.workloads else None})
        # The run's own log group outlives the finished run and goes with the run; a spec that
        # names a group of its own (or no readable spec that could) leaves it alone.
        own_logs = spec is None or (spec.workers.backend == WorkerBackend.ECS_FARGATE
                                    and not spec.workers.ecs.log_group)
        logs_exist = deleting and own_logs and await self.aws.log_group_exists(names.log_group)
        progress_cm = trainer.progress
        return Observed(
            now=dt.datetime.now(dt.UTC),
            generation=body["metadata"].get("generation", 0),
            deleting=deleting, spec=spec, spec_error=spec_error, status=status,
            queues_ready=len(queue_urls) == lookups.QUEUE_ROLES, queues_exist=bool(queue_urls),
            logs_exist=logs_exist, workers_exist=workers.exist,
            workers_desired=workers.desired, workers_ready=workers.ready,
            trainer=trainer.current, trainers_exist=bool(trainer.workloads),
            trainer_workloads=tuple(trainer.workloads), resources=refs,
            progress=progress_from_configmap(progress_cm) if progress_cm else None,
            namespace=names.namespace, name=names.name, uid=names.uid,
            report=trainer.report,
            worker_problem=workers.problem, ecs_tasks=workers.tasks,
            task_definitions_listed=workers.definitions_listed,
            workers_stopped=workers.stopped,
        )

    async def _queues(self, names: RunNames, spec: MultiTurnRLRunSpec | None,
                      status: MultiTurnRLRunStatus, deleting: bool) -> dict[str, str]:
        listed = self.queue_urls.get(names.uid)
        now = time.monotonic()
        if listed is not None and not lookups.queues_listed_again(
                lookups.is_live(spec, status, deleting), set(listed[1]), now - listed[0],
                self.settings.resync_seconds):
            return listed[1]
        urls = await self.aws.queues(names)
        self.queue_urls[names.uid] = (now, urls)
        return urls

    async def _fetch_workers(self, names: RunNames, spec: MultiTurnRLRunSpec | None,
                             status: MultiTurnRLRunStatus, deleting: bool, aws: bool,
                             queues: int) -> WorkersSeen:
        live = lookups.is_live(spec, status, deleting)
        seen = WorkersSeen(stopped=status.workers.stopped)  # unless stopped tasks are listed
        backends = lookups.worker_backends(spec)
        if WorkerBackend.KUBERNETES in backends and \
                (dep := self.children.deployments.get(names.uid)) is not None:
            seen.exist = True
            seen.refs.worker_deployment = dep["metadata"]["name"]
            seen.desired = (dep.get("spec") or {}).get("replicas") or 0
            seen.ready = (dep.get("status") or {}).get("readyReplicas") or 0
            if lookups.needs_worker_pods(live, seen.desired, seen.ready):
                seen.problem = pod_problem(self.children.pods_of(names.uid,
                                                                 names.labels("worker")))
        if WorkerBackend.ECS_FARGATE in backends and aws:
            await self._fetch_tasks(names, spec, status, deleting, live, queues, seen)
        if spec is not None and spec.workers.backend == WorkerBackend.ECS_FARGATE:
            seen.refs.log_group = worker_log_group(names, spec)
        return seen

    async def _fetch_tasks(self, names: RunNames, spec: MultiTurnRLRunSpec | None,
                           status: MultiTurnRLRunStatus, deleting: bool, live: bool,
                           queues: int, seen: WorkersSeen) -> None:
        if not lookups.tasks_may_exist(queues, deleting, status):
            return
        cluster = self.actions.cluster(spec)
        tasks = await self.aws.worker_tasks(names, cluster, desired=("RUNNING",))
        if lookups.needs_stopped_tasks(live, spec, sum(t.live for t in tasks)):
            assert spec is not None
            listed = {t.arn for t in tasks}  # a task told to stop since is listed once
            tasks += [t for t in await self.aws.worker_tasks(names, cluster, desired=("STOPPED",))
                      if t.arn not in listed]
            seen.problem = await self._stopped_words(names, spec, tasks)
            seen.stopped = sum(t.stopped_on_its_own for t in tasks)
        running = [t for t in tasks if t.live]
        if running and running[0].task_definition_arn:  # live tasks name their definition
            definitions = [running[0].task_definition_arn]
        elif lookups.task_definition_may_exist(queues, deleting, status):
            definitions = await self.aws.active_task_definitions(names)
            seen.definitions_listed = True
        else:
            definitions = []
        seen.exist = seen.exist or bool(running or definitions)
        seen.desired += len(running)
        seen.ready += sum(t.ready for t in running)
        seen.tasks = tuple(tasks)
        seen.refs.task_arns = [t.arn for t in running]
        seen.refs.task_definition_arn = definitions[0] if definitions else None

    async def _fetch_trainer(self, names: RunNames, spec: MultiTurnRLRunSpec | None,
                             status: MultiTurnRLRunStatus, deleting: bool) -> TrainerSeen:
        workloads = dict(self.children.trainers.get(names.uid, {}))
        progress = self.children.progress.get(names.uid)
        found = lookups.current_workload(workloads, status.attempts)
        if lookups.needs_live_trainer_read(found is not None, spec, status, deleting):
            assert spec is not None
            key = (spec.trainer.launcher.value, names.trainer(status.attempts))
            if (workload := await self.kube.get(*key, names.namespace)) is not None:
                workloads[key] = workload
                found = (key, workload)
            progress = await self.kube.get("ConfigMap", names.progress_config_map,
                                           names.namespace) or progress
        if found is None:  # no current attempt: the refs name any workload that is left
            left: tuple[str | None, str | None] = next(iter(workloads), (None, None))
            return TrainerSeen(None, workloads, progress, _report(progress), *left)
        (kind, name), obj = found
        current = launchers.observe(kind, obj, status.attempts)
        report = _report(progress)
        if lookups.needs_live_report(current, report, status):
            # The workload's end can come through its watch before the trainer's last patch
            # of the report comes through the ConfigMap's: the verdict is read from the API
            # server, which had the report before the trainer exited.
            progress = await self.kube.get("ConfigMap", names.progress_config_map,
                                           names.namespace) or progress
            report = _report(progress)
        if lookups.needs_trainer_pods(current, lookups.is_live(spec, status, deleting)):
            labels = {**names.labels("trainer"), LABEL_ATTEMPT: str(current.attempt)}
            pods = (await self.kube.labelled("Pod", names.namespace, labels)
                    if lookups.trainer_pods_live(current)
                    else self.children.pods_of(names.uid, labels))
            current = (with_cause(current, pods) if current.state == TrainerState.FAILED
                       else with_pods(current, pods))
        if lookups.needs_queue_hold(current) and spec is not None:
            held = await self.kube.queue_workloads(names.namespace, obj["metadata"]["uid"])
            current = replace(current, message=queue_hold(spec.scheduling.queue_name or "",
                                                          held))
        return TrainerSeen(current, workloads, progress, report, kind, name)

    async def _stopped_words(self, names: RunNames, spec: MultiTurnRLRunSpec,
                             tasks: list[EcsTask]) -> WorkerProblem | None:
        """The newest task that stopped on its own, in ECS's words and the worker's last log
        line (read once per task: its stream is worker/worker/<task id>)."""
        task = newest_stopped(tasks)
        if task is None:
            return None
        line = self.last_lines.get(task.arn)
        if line is None:
            line = await self.aws.last_log_line(worker_log_group(names, spec),
                                                f"{LOG_STREAM_PREFIX}/worker/{task.id}")
            self.last_lines[task.arn] = line
        return stopped_task_problem(task, line)

    async def _publish(self, body: dict[str, Any], decision: Decision) -> None:
        """Write status only when it changed; post an Event per transition."""
        meta = body["metadata"]
        new = decision.status.wire()
        key = (meta["namespace"], meta["name"])
        shown = self._parse_status(body)
        # The cost meter's totals ride along with a write; alone they would write every time,
        # so they are brought up to date on their own once every cost_refresh_seconds.
        written = self.cost_written.get(key)
        if is_news(shown, decision) or refresh_due(
                shown.cost, decision.status.cost,
                None if written is None else time.monotonic() - written,
                self.settings.cost_refresh_seconds):
            version = await self.kube.apply_status(key[0], key[1], new, CONDITION_TYPES)
            body["status"] = new  # the rest of this reconcile sees our own write
            # So does the cache, which the watch may have refreshed since this reconcile read
            # it (the echo of an earlier write of ours, with the status this one replaces).
            cached = self.runs.get(key)
            if cached is not None and cached is not body:
                self.runs[key] = {**cached, "status": new}
            if version is not None:
                self.expected[key] = Expected(version, new, time.monotonic() + EXPECTATION_S)
            self._track_phase(key, new["phase"])
            self.cost_written[key] = time.monotonic()
            metrics.set_run_figures(key[0], key[1], new.get("progress") or {})
        for event in decision.events:
            await self.kube.event(body, event.type, event.reason, event.message)

    # ------------------------------------------------------------------ sweeper

    async def sweep_once(self) -> int:
        """Delete cloud resources this operator made, in this cluster, for runs in namespaces
        it watches that no longer exist, once seen as such for the minimum age
        (`reconcile.sweep`). Tags are read first, runs second (from the API server, not a
        cache): a run made between the two reads is in the second, and its fresh resources
        were not in the first."""
        tagged = await self.aws.tagged(self.settings.owner)
        known = await self.kube.uids("MultiTurnRLRun", self.settings.list_scopes)
        plan = plan_sweep(tagged, owner=self.settings.owner, uid_tag=TAG_RUN_UID, known=known,
                          watches=self.settings.watches, first_seen=self.orphans_seen,
                          now=time.monotonic(), min_age=self.settings.sweep_min_age_seconds)
        self.orphans_seen = plan.first_seen
        swept = 0
        for arn, _ in plan.delete:
            try:
                swept += await self.aws.delete_by_arn(arn, self.settings.ecs_cluster)
            except Exception as exc:  # one stubborn resource must not stop the sweep
                log.warning("sweeper could not delete %s: %r", arn, exc)
        if swept:
            metrics.SWEPT.inc(swept)
            log.info("sweeper deleted %d orphaned resource(s)", swept)
        return swept
