"""The controller: caches of watched objects, the work queue, and the reconcile that glues
observation, `reconcile.decide` and the actions together.

Runs arrive from kopf's watch; the run's children (trainer workloads, worker Deployments,
progress ConfigMaps) from label-selected watches; AWS state is read per reconcile. A
reconcile never lists the cluster: it reads caches, so its cost per run stays flat.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from dataclasses import replace
from typing import Any

from lightkube.core.exceptions import ApiError
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import ConfigMap, Service
from pydantic import ValidationError

from mtrl_api.run import (
    MultiTurnRLRunSpec,
    MultiTurnRLRunStatus,
    Phase,
    QueueRef,
    ResourceRefs,
    WorkerBackend,
)
from mtrl_operator import metrics
from mtrl_operator.adapters.aws import Aws, WorkerTask
from mtrl_operator.adapters.kube import (
    HyperPodPyTorchJob,
    Kube,
    MultiTurnRLRun,
    PyTorchJob,
    merge_patch,
    owner_reference,
)
from mtrl_operator.builders import queues as queue_builders
from mtrl_operator.builders import trainer as trainer_builders
from mtrl_operator.builders import workers as worker_builders
from mtrl_operator.builders.env import trainer_env, worker_env
from mtrl_operator.errors import SpecError, StaleCopy
from mtrl_operator.naming import (
    ANNOTATION_FORCE_RELEASE,
    FINALIZER,
    LABEL_ATTEMPT,
    LABEL_COMPONENT,
    LABEL_MANAGED_BY,
    LABEL_RUN_UID,
    MANAGED_BY,
    RunNames,
)
from mtrl_operator.reconcile.observe import (
    progress_from_configmap,
    spec_problem,
    trainer_report,
    trainer_state,
)
from mtrl_operator.reconcile.run import Act, Decision, Observed, TrainerObserved, decide
from mtrl_operator.settings import Settings
from mtrl_operator.workqueue import WorkQueue, every

log = logging.getLogger("mtrl.controller")

Key = tuple[str, str]  # (namespace, name)
TRAINER_KINDS = {"Job": Job, "PyTorchJob": PyTorchJob, "HyperPodPyTorchJob": HyperPodPyTorchJob}


def _http_status(exc: Exception) -> int | None:
    if isinstance(exc, ApiError):
        return exc.status.code
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


def _reconcile_input(body: dict[str, Any]) -> tuple[Any, ...]:
    """What a reconcile reads from a run. The watch's echo of our own status write changes
    only the resourceVersion, so it costs no reconcile (and no AWS calls)."""
    meta = body["metadata"]
    return (meta.get("uid"), meta.get("generation"), meta.get("deletionTimestamp"),
            meta.get("finalizers"), meta.get("annotations"), body.get("spec"), body.get("status"))


def _version(obj: dict[str, Any]) -> str | None:
    return obj["metadata"].get("resourceVersion")


def _dump(obj: Any) -> dict[str, Any]:
    return obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)


class Controller:
    def __init__(self, settings: Settings, kube: Kube, aws: Aws) -> None:
        self.settings = settings
        self.kube = kube
        self.aws = aws
        self.runs: dict[Key, dict[str, Any]] = {}
        self.keys_by_uid: dict[str, Key] = {}
        # run UID -> {(kind, name): object}
        self.trainers: dict[str, dict[tuple[str, str], dict[str, Any]]] = {}
        self.deployments: dict[str, dict[str, Any]] = {}
        self.progress: dict[str, dict[str, Any]] = {}
        self.phases: dict[Key, str] = {}  # for the runs-by-phase gauge, kept in O(1) per change
        self.polls: dict[Key, tuple[Any, int]] = {}  # last poll's outcome, polls in a row
        self.queue: WorkQueue | None = None
        self._tasks: list[asyncio.Task[None]] = []
        # No reconcile before every child watch has listed once: a new leader whose cache
        # has not seen a run's trainer yet would take it for gone (and, deleting the run,
        # release its finalizer while the trainer still runs).
        self._unsynced: set[tuple[str, str]] = set()
        self.caches_synced = asyncio.Event()

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        self.queue = WorkQueue(self.reconcile, workers=self.settings.workers)
        selector = {LABEL_MANAGED_BY: MANAGED_BY}
        # Namespaced RBAC allows only per-namespace watches; globs need a cluster-wide one.
        for resource, component in ((Job, "trainer"), (PyTorchJob, "trainer"),
                                    (HyperPodPyTorchJob, "trainer"), (Deployment, "worker"),
                                    (ConfigMap, "progress")):
            labels = {**selector, LABEL_COMPONENT: component}
            for ns in self.settings.list_scopes:
                self._unsynced.add((resource.__name__, ns))
                self._tasks.append(asyncio.create_task(
                    self._watch_children(resource, labels, ns)))
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
            self.polls.pop(key, None)
            self.runs.pop(key, None)
            self.keys_by_uid.pop(meta["uid"], None)
            for cache in (self.trainers, self.deployments, self.progress):
                cache.pop(meta["uid"], None)
            if self.queue:
                self.queue.forget(key)
            return
        previous = self.runs.get(key)
        self.runs[key] = body
        self._track_phase(key, (body.get("status") or {}).get("phase") or Phase.PENDING.value)
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

    def on_child(self, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        uid = (meta.get("labels") or {}).get(LABEL_RUN_UID)
        if not uid:
            return
        gone = event_type == "DELETED"
        if kind in TRAINER_KINDS:
            if gone:  # never a new entry: a late DELETED after the run's own would leak one
                trainers = self.trainers.get(uid, {})
                trainers.pop((kind, meta["name"]), None)
                if not trainers:
                    self.trainers.pop(uid, None)
            else:
                self.trainers.setdefault(uid, {})[(kind, meta["name"])] = obj
        elif kind == "Deployment":
            if gone:
                self.deployments.pop(uid, None)
            else:
                self.deployments[uid] = obj
        elif kind == "ConfigMap":
            if gone:
                self.progress.pop(uid, None)
            else:
                self.progress[uid] = obj
        key = self.keys_by_uid.get(uid)
        if key and self.queue:
            self.queue.add(key)

    def on_children_listed(self, kind: str, namespace: str, objs: list[dict[str, Any]]) -> None:
        """A fresh list is the truth for its kind and namespace ("*": all): cached children it
        lacks were deleted while no watch was open, and their runs hear of it now."""
        present = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in objs}
        if kind in TRAINER_KINDS:
            cached = [obj for objs_ in self.trainers.values()
                      for (kind_, _), obj in objs_.items() if kind_ == kind]
        else:
            cached = list((self.deployments if kind == "Deployment" else self.progress).values())
        for obj in cached:
            meta = obj["metadata"]
            if namespace in ("*", meta["namespace"]) and \
                    (meta["namespace"], meta["name"]) not in present:
                self.on_child(kind, "DELETED", obj)
        for obj in objs:  # a relist every few minutes must not wake every run
            cached = self._cached_child(kind, obj)
            if cached is None or _version(cached) != _version(obj):
                self.on_child(kind, "ADDED", obj)

    def _cached_child(self, kind: str, obj: dict[str, Any]) -> dict[str, Any] | None:
        meta = obj["metadata"]
        uid = (meta.get("labels") or {}).get(LABEL_RUN_UID, "")
        if kind in TRAINER_KINDS:
            return self.trainers.get(uid, {}).get((kind, meta["name"]))
        return (self.deployments if kind == "Deployment" else self.progress).get(uid)

    def _synced(self, kind: str, namespace: str) -> None:
        self._unsynced.discard((kind, namespace))
        if not self._unsynced and not self.caches_synced.is_set():
            log.info("child caches listed; reconciling")
            self.caches_synced.set()

    async def _watch_children(self, resource: Any, labels: dict[str, str], namespace: str) -> None:
        """List, then watch from the list's version, as an informer does. A watch that was cut
        resumes from scratch with a new list: the events of the gap are lost for good, and a
        missed DELETED would leave a child in the cache forever (a teardown waiting on it
        would never end)."""
        kind = resource.__name__
        absent_for = 0.0  # an uninstalled kind is looked for again after 5 s, 10 s, ... 60 s
        while True:
            try:
                objs, version = await self.kube.list_with_version(resource, labels, namespace)
                absent_for = 0.0
                self.on_children_listed(kind, namespace, [_dump(obj) for obj in objs])
                self._synced(kind, namespace)
                async for event, obj in self.kube.watch(resource, labels=labels,
                                                        namespace=namespace,
                                                        resource_version=version):
                    self.on_child(kind, event, _dump(obj))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a cut stream or a version too old (410): list again
                if _http_status(exc) == 404:  # e.g. no PyTorchJob CRD (yet) in this cluster
                    self._synced(kind, namespace)  # nothing of a kind not served can exist
                    absent_for = min(60.0, max(5.0, 2 * absent_for))
                    log.info("%s is not served here; looking again in %.0fs", kind, absent_for)
                    await asyncio.sleep(absent_for)
                    continue
                log.warning("watch of %s ended: %r", kind, exc)
            await asyncio.sleep(1)

    # ------------------------------------------------------------------ reconcile

    async def reconcile(self, key: Key) -> float | None:
        await self.caches_synced.wait()
        body = self.runs.get(key)
        if body is None:
            return None
        started = time.perf_counter()
        try:
            return await self._reconcile(body)
        except StaleCopy:
            return 0.2
        except ApiError as exc:
            if exc.status.code == 409:  # our cached copy was stale; the watch brings a new one
                return 0.2
            await self._report_error(body, exc)
            raise
        except Exception as exc:
            await self._report_error(body, exc)
            raise
        finally:
            metrics.RECONCILE_SECONDS.observe(time.perf_counter() - started)

    async def _report_error(self, body: dict[str, Any], exc: Exception) -> None:
        """Persistent failures are visible on the run, not only in the operator's log."""
        metrics.RECONCILE_ERRORS.labels(kind=type(exc).__name__).inc()
        await self.kube.event(body, "Warning", "ReconcileError",
                              f"{type(exc).__name__}: {exc}; retrying with backoff")

    def _names(self, body: dict[str, Any]) -> RunNames:
        meta = body["metadata"]
        return RunNames(meta["namespace"], meta["name"], meta["uid"], self.settings.operator_id)

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
            await self._remove_finalizer(body, finalizers)
            return None
        if not deleting and FINALIZER not in finalizers:
            # Before anything is created: no resource may exist without the finalizer.
            meta.update(await self.kube.set_finalizers(
                names.namespace, names.name, [*finalizers, FINALIZER], meta["resourceVersion"]))
            return 0.0

        spec, spec_error = self._parse_spec(body)
        status = self._parse_status(body)
        obs = await self._observe(names, spec, spec_error, status, deleting, body)
        decision = decide(obs)
        await self._publish(body, decision)
        try:
            await self._act(body, names, spec, obs, decision)
        except SpecError as exc:
            if deleting or decision.status.phase.finished:
                raise  # tearing down: retry with backoff; never fail twice
            # The spec names something that cannot exist: fail the run and tear down.
            log.warning("%s/%s: %s: %s", names.namespace, names.name, exc.reason, exc,
                        extra={"run": f"{names.namespace}/{names.name}"})
            decision = decide(replace(obs, spec_error=(exc.reason, str(exc))))
            await self._publish(body, decision)
            await self._act(body, names, spec, obs, decision)
        if decision.requeue_after is None:
            # ECS tasks have no watch, and a missed event must not stall a run forever.
            return None if decision.status.phase.finished else self.settings.resync_seconds
        return self._backoff((names.namespace, names.name), decision)

    def _backoff(self, key: Key, decision: Decision) -> float:
        """A poll that found nothing changed waits twice as long as the last one, up to the
        resync period: a run waiting on AWS costs O(log wait) reconciles, however long the
        wait (with 500 runs starting at once, waits grow with the number of runs)."""
        assert decision.requeue_after is not None
        outcome = (decision.status, tuple(decision.actions))  # models compare by value
        last, polls = self.polls.get(key, (None, 0))
        polls = polls + 1 if outcome == last else 0
        self.polls[key] = (outcome, polls)
        return min(decision.requeue_after * 2 ** polls,
                   max(decision.requeue_after, self.settings.resync_seconds))

    def _parse_spec(self, body: dict[str, Any]) -> tuple[MultiTurnRLRunSpec | None,
                                                        tuple[str, str] | None]:
        try:
            spec = MultiTurnRLRunSpec.model_validate(body.get("spec") or {})
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            return None, ("InvalidSpec", f"spec.{where}: {first['msg']}")
        return spec, spec_problem(spec, self.settings)

    @staticmethod
    def _parse_status(body: dict[str, Any]) -> MultiTurnRLRunStatus:
        try:
            return MultiTurnRLRunStatus.model_validate(body.get("status") or {})
        except ValidationError:
            log.warning("unreadable status on %s; starting from an empty one",
                        body["metadata"]["name"])
            return MultiTurnRLRunStatus()

    async def _observe(self, names: RunNames, spec: MultiTurnRLRunSpec | None,
                       spec_error: tuple[str, str] | None, status: MultiTurnRLRunStatus,
                       deleting: bool, body: dict[str, Any]) -> Observed:
        refs = ResourceRefs()
        # A finished run whose status records nothing left in AWS needs no AWS calls.
        skip_aws = not deleting and status.phase.finished and not status.resources.queues \
            and not status.resources.task_arns and not status.resources.task_definition_arn
        queue_urls = {} if skip_aws else await self.aws.queues(names)
        refs.queues = [QueueRef(role=r, url=u) for r, u in sorted(queue_urls.items())]

        workers_exist, desired, ready = False, 0, 0
        # Without a readable spec the backend is unknown: look for workers of both.
        backend = spec.workers.backend if spec else None
        if backend in (WorkerBackend.KUBERNETES, None):
            dep = self.deployments.get(names.uid)
            if dep is not None:
                workers_exist = True
                refs.worker_deployment = dep["metadata"]["name"]
                desired = (dep.get("spec") or {}).get("replicas") or 0
                ready = (dep.get("status") or {}).get("readyReplicas") or 0
        if backend in (WorkerBackend.ECS_FARGATE, None) and not skip_aws:
            live = [t for t in await self.aws.worker_tasks(names, self._cluster(spec),
                                                           stopped=False) if t.live]
            # Live tasks name their definition. Without them, it is looked up once one may
            # have been registered: workers come after the queues, or it was recorded.
            may_exist = len(queue_urls) == 4 or deleting or status.phase.finished or \
                status.resources.task_definition_arn is not None
            if live and live[0].task_definition_arn:
                definitions = [live[0].task_definition_arn]
            else:
                definitions = await self.aws.active_task_definitions(names) if may_exist else []
            workers_exist = workers_exist or bool(live or definitions)
            desired, ready = desired + len(live), ready + sum(t.ready for t in live)
            refs.task_arns = [t.arn for t in live]
            refs.task_definition_arn = definitions[0] if definitions else None

        trainers = self.trainers.get(names.uid, {})
        current: TrainerObserved | None = None
        for (kind, name), obj in trainers.items():
            attempt = int((obj["metadata"].get("labels") or {}).get(LABEL_ATTEMPT, "0"))
            if attempt == status.attempts:
                current = trainer_state(kind, obj, attempt)
                refs.trainer_kind, refs.trainer_name = kind, name
        if trainers and refs.trainer_name is None:
            kind, name = next(iter(trainers))
            refs.trainer_kind, refs.trainer_name = kind, name
        progress_cm = self.progress.get(names.uid)
        if current is None and spec is not None and not deleting and \
                not status.phase.finished and status.launched_attempt >= status.attempts >= 1:
            # `decide` would take a missing workload of a launched attempt for one that is gone
            # for good, so a cache that has not caught up (a restart's first reconcile, a
            # watch behind a create) must not say so: read both from the API server.
            kind = spec.trainer.launcher.value
            live = await self.kube.get(TRAINER_KINDS[kind], names.trainer(status.attempts),
                                       names.namespace)
            if live is not None:
                current = trainer_state(kind, live, status.attempts)
                trainers = {**trainers, (kind, names.trainer(status.attempts)): live}
                refs.trainer_kind, refs.trainer_name = kind, names.trainer(status.attempts)
            progress_cm = await self.kube.get(ConfigMap, names.progress_config_map,
                                              names.namespace) or progress_cm
        if spec is not None and trainers:
            refs.config_map = names.config_map
        reported_attempt, outcome = trainer_report(progress_cm) if progress_cm else (None, None)
        return Observed(
            now=dt.datetime.now(dt.UTC),
            generation=body["metadata"].get("generation", 0),
            deleting=deleting, spec=spec, spec_error=spec_error, status=status,
            queues_ready=len(queue_urls) == 4, queues_exist=bool(queue_urls),
            workers_exist=workers_exist, workers_desired=desired, workers_ready=ready,
            trainer=current, trainers_exist=bool(trainers), resources=refs,
            progress=progress_from_configmap(progress_cm) if progress_cm else None,
            namespace=names.namespace, reported_attempt=reported_attempt, trainer_outcome=outcome,
        )

    async def _ecs_tasks(self, names: RunNames, spec: MultiTurnRLRunSpec | None) -> list[WorkerTask]:
        return await self.aws.worker_tasks(names, self._cluster(spec))

    def _cluster(self, spec: MultiTurnRLRunSpec | None) -> str:
        return (spec.workers.ecs.cluster if spec and spec.workers.ecs.cluster
                else self.settings.ecs_cluster)

    async def _publish(self, body: dict[str, Any], decision: Decision) -> None:
        """Write status only when it changed; post an Event per transition."""
        meta = body["metadata"]
        new = decision.status.wire()
        old = self._parse_status(body).wire()
        if new != old:
            await self.kube.patch_status(meta["namespace"], meta["name"],
                                         merge_patch(body.get("status") or {}, new))
            body["status"] = new  # our cache sees our own write before the watch echoes it
            self._track_phase((meta["namespace"], meta["name"]), new["phase"])
        for event in decision.events:
            await self.kube.event(body, event.type, event.reason, event.message)

    # ------------------------------------------------------------------ actions

    async def _act(self, body: dict[str, Any], names: RunNames, spec: MultiTurnRLRunSpec | None,
                   obs: Observed, decision: Decision) -> None:
        for action in decision.actions:
            log.info("%s/%s: %s", names.namespace, names.name, action.value,
                     extra={"run": f"{names.namespace}/{names.name}"})
            if action == Act.ENSURE_QUEUES:
                assert spec is not None
                await self.aws.ensure_queues(
                    names, queue_builders.dead_letter_queue(names, spec.queues),
                    lambda role, arn: queue_builders.work_queue(names, spec.queues, role, arn),
                    existing=self._queue_urls(obs))
            elif action == Act.ENSURE_WORKERS:
                assert spec is not None
                await self._ensure_workers(body, names, spec, obs)
            elif action == Act.ENSURE_TRAINER:
                assert spec is not None
                await self._ensure_trainer(body, names, spec, obs, decision.attempt)
            elif action == Act.DELETE_TRAINER:
                await self._delete_trainers(names)
            elif action == Act.DELETE_WORKERS:
                await self._delete_workers(names, spec, obs)
            elif action == Act.DELETE_QUEUES:
                await self.aws.delete_queues(names)
            elif action == Act.DELETE_RUN:
                await self.kube.delete_run(names.namespace, names.name, names.uid)
            elif action == Act.REMOVE_FINALIZER:
                await self._remove_finalizer(body, list(body["metadata"].get("finalizers") or []))

    def _queue_urls(self, obs: Observed) -> dict[str, str]:
        return {q.role: q.url for q in obs.resources.queues}

    async def _ensure_workers(self, body: dict[str, Any], names: RunNames,
                              spec: MultiTurnRLRunSpec, obs: Observed) -> None:
        env = worker_env(names, spec, self._queue_urls(obs), self.settings.region)
        if spec.workers.backend == WorkerBackend.KUBERNETES:
            await self.kube.create(worker_builders.deployment(names, spec, env,
                                                              owner_reference(body)))
            return
        definition = await self.aws.ensure_task_definition(
            names, worker_builders.task_definition(names, spec, env,
                                                   self.settings.ecs_execution_role_arn),
            known=obs.resources.task_definition_arn)
        tasks = await self._ecs_tasks(names, spec)
        live = sum(t.live for t in tasks)
        missing = spec.workers.max_replicas - live
        if missing <= 0:
            return
        requests = worker_builders.run_task_requests(
            names, spec, definition, self._cluster(spec),
            spec.workers.ecs.subnets or self.settings.ecs_subnets,
            spec.workers.ecs.security_groups or self.settings.ecs_security_groups,
            attempt=1, missing=missing, first_batch=len(tasks))
        await self.aws.run_tasks(requests)

    async def _ensure_trainer(self, body: dict[str, Any], names: RunNames,
                              spec: MultiTurnRLRunSpec, obs: Observed, attempt: int) -> None:
        owner = owner_reference(body)
        env = trainer_env(names, spec, self._queue_urls(obs), self.settings.region, attempt)
        await self.kube.create(trainer_builders.config_map(names, spec, owner))
        for manifest in trainer_builders.progress_channel(names, spec, owner):
            await self.kube.create(manifest)
        for manifest in trainer_builders.workload(names, spec, env, attempt, owner):
            await self.kube.create(manifest)

    async def _delete_trainers(self, names: RunNames) -> None:
        # The rendezvous Service first: it is not watched, so the workload's existence is
        # what brings a restarted operator back here.
        await self.kube.delete_collection(Service, names.namespace,
                                          {LABEL_RUN_UID: names.uid, LABEL_COMPONENT: "trainer"})
        for kind, name in list(self.trainers.get(names.uid, {})):
            await self.kube.delete(TRAINER_KINDS[kind], name, names.namespace)

    async def _delete_workers(self, names: RunNames, spec: MultiTurnRLRunSpec | None,
                              obs: Observed) -> None:
        dep = self.deployments.get(names.uid)
        if dep is not None:
            await self.kube.delete(Deployment, dep["metadata"]["name"], names.namespace)
        if spec is None or spec.workers.backend == WorkerBackend.ECS_FARGATE:
            # The live tasks this reconcile observed; one started since is stopped next time.
            await self.aws.stop_tasks(self._cluster(spec), obs.resources.task_arns)
            await self.aws.deregister_task_definitions(names)

    async def _remove_finalizer(self, body: dict[str, Any], finalizers: list[str]) -> None:
        meta = body["metadata"]
        new = await self.kube.remove_finalizer(meta["namespace"], meta["name"], finalizers,
                                               FINALIZER)
        # Our copy sees its own write: a reconcile before the watch's DELETED must not repeat it.
        meta.update(new or {"finalizers": [f for f in finalizers if f != FINALIZER]})

    # ------------------------------------------------------------------ sweeper

    async def sweep_once(self) -> int:
        """Delete cloud resources tagged by this operator whose run no longer exists."""
        known = await self.kube.uids(MultiTurnRLRun, self.settings.list_scopes)
        swept = 0
        for uid, arns in (await self.aws.tagged(self.settings.operator_id)).items():
            if uid in known:
                continue
            for arn in arns:
                try:
                    swept += await self.aws.delete_by_arn(arn, self.settings.ecs_cluster)
                except Exception as exc:  # one stubborn resource must not stop the sweep
                    log.warning("sweeper could not delete %s: %r", arn, exc)
        if swept:
            metrics.SWEPT.inc(swept)
            log.info("sweeper deleted %d orphaned resource(s)", swept)
        return swept
