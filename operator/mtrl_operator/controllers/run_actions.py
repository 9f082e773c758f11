"""What a run's decision asks for, done through the adapters: queues, workers and trainer made
from the builders' manifests and request bodies, and taken down again.

Creating works from what its reconcile just observed (the queues, the ECS tasks, the task
definition) instead of looking again; every name is known. Deleting queues and task
definitions lists them again, on purpose: everything under the run's prefix goes, the workers'
reply queues and a revision registered since the observation included.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from mtrl_api.run import MultiTurnRLRunSpec, WorkerBackend
from mtrl_operator import launchers
from mtrl_operator.adapters.aws import Aws
from mtrl_operator.adapters.kube import Kube
from mtrl_operator.builders import queues as queue_builders
from mtrl_operator.builders import trainer as trainer_builders
from mtrl_operator.builders import workers as worker_builders
from mtrl_operator.builders.env import payload_bucket, trainer_env, worker_env
from mtrl_operator.naming import FINALIZER, RunNames, owner_reference
from mtrl_operator.reconcile.draft import (
    Act,
    Decision,
    Observed,
    Placement,
    TrainerObserved,
    TrainerState,
)
from mtrl_operator.settings import Settings
from mtrl_rollout.settings import run_payload_prefix

log = logging.getLogger("mtrl.controller")
KEPT_LOG_LINES = 200  # of a failed trainer container's log, kept after its pods go


def _queue_urls(obs: Observed) -> dict[str, str]:
    return {q.role: q.url for q in obs.resources.queues}


# The Event that says what a teardown action deleted, by action.
TEARDOWN_EVENTS = {Act.DELETE_TRAINER: "TrainerDeleted", Act.DELETE_WORKERS: "WorkersDeleted",
                   Act.DELETE_QUEUES: "QueuesDeleted", Act.DELETE_LOGS: "LogsDeleted"}


@dataclass
class Done:
    """What the actions learned that the next reconcile would otherwise look up again."""

    placement: Placement | None = None  # what RunTask answered, if it was called
    queues: dict[str, str] | None = None  # role -> URL of the queues EnsureQueues made


class RunActions:
    def __init__(self, settings: Settings, kube: Kube, aws: Aws) -> None:
        self.settings = settings
        self.kube = kube
        self.aws = aws
        # Teardown messages already announced, by run UID: SQS lists a deleted queue for up
        # to a minute, and a repeated delete must not repeat its Event.
        self._announced: dict[str, set[str]] = {}

    def forget(self, uid: str) -> None:
        self._announced.pop(uid, None)

    def cluster(self, spec: MultiTurnRLRunSpec | None) -> str:
        """The run's ECS cluster, or the operator's default."""
        return (spec.workers.ecs.cluster if spec and spec.workers.ecs.cluster
                else self.settings.ecs_cluster)

    async def run(self, body: dict[str, Any], names: RunNames, spec: MultiTurnRLRunSpec | None,
                  obs: Observed, decision: Decision) -> Done:
        """The decision's actions, in their order; what RunTask answered (the decision is
        taken again with it: a shortfall is news for the run's status) and the queues made."""
        done = Done()
        for action in decision.actions:
            log.info("%s/%s: %s", names.namespace, names.name, action.value,
                     extra={"run": f"{names.namespace}/{names.name}"})
            if action == Act.ENSURE_QUEUES:
                assert spec is not None
                done.queues = await self.aws.ensure_queues(
                    names, queue_builders.dead_letter_queue(names, spec.queues),
                    lambda role, arn: queue_builders.work_queue(names, spec.queues, role, arn),
                    existing=_queue_urls(obs))
            elif action == Act.ENSURE_WORKERS:
                assert spec is not None
                done.placement = await self._ensure_workers(body, names, spec, obs)
            elif action == Act.ENSURE_TRAINER:
                assert spec is not None
                await self._ensure_trainer(body, names, spec, obs, decision.attempt,
                                          decision.status.trainer_launch)
            elif action == Act.DELETE_TRAINER:
                await self._announce(body, names, action,
                                     await self._delete_trainers(body, names, obs))
            elif action == Act.DELETE_WORKERS:
                await self._announce(body, names, action,
                                     await self._delete_workers(names, spec, obs))
            elif action == Act.DELETE_LOGS:
                deleted = await self.aws.delete_log_group(names.log_group)
                await self._announce(body, names, action,
                                     [f"log group {names.log_group}"] if deleted else [])
            elif action == Act.DELETE_QUEUES:
                # The payloads first: no message can point at one once the queues are gone,
                # and a failure here leaves the queues, so DELETE_QUEUES comes again.
                if spec is not None and (payloads := await self.aws.delete_payloads(
                        payload_bucket(spec), run_payload_prefix(names.aws_prefix))):
                    await self._announce(body, names, action, [
                        f"{payloads} offloaded payloads under s3://{payload_bucket(spec)}/"
                        f"{run_payload_prefix(names.aws_prefix)}/"])
                count = await self.aws.delete_queues(names)
                await self._announce(body, names, action, [f"{count} queues named "
                                                           f"{names.aws_prefix}-*"] if count else [])
            elif action == Act.DELETE_RUN:
                await self.kube.delete("MultiTurnRLRun", names.name, names.namespace)
            elif action == Act.REMOVE_FINALIZER:
                await self.remove_finalizer(body)
        return done

    async def _ensure_workers(self, body: dict[str, Any], names: RunNames,
                              spec: MultiTurnRLRunSpec, obs: Observed) -> Placement | None:
        env = worker_env(names, spec, _queue_urls(obs), self.settings.region)
        if spec.workers.backend == WorkerBackend.KUBERNETES:
            await self.kube.create(worker_builders.deployment(names, spec, env,
                                                              owner_reference(body)))
            return None
        if not spec.workers.ecs.log_group:  # the run's own, made before anything writes to it
            await self.aws.ensure_log_group(names.log_group, names.tags("logs"),
                                            spec.workers.ecs.log_retention_days)
        definition = await self.aws.ensure_task_definition(
            names, worker_builders.task_definition(names, spec, env,
                                                   self.settings.ecs_execution_role_arn,
                                                   self.settings.region),
            known=obs.resources.task_definition_arn, looked=obs.task_definitions_listed)
        tasks = obs.ecs_tasks  # live and stopped: the observation lists both when any is missing
        missing = spec.workers.max_replicas - sum(t.live for t in tasks)
        if missing <= 0:
            return None
        requests = worker_builders.run_task_requests(
            names, spec, definition, self.cluster(spec),
            spec.workers.ecs.subnets or self.settings.ecs_subnets,
            spec.workers.ecs.security_groups or self.settings.ecs_security_groups,
            placement=obs.status.workers.placement_failures, missing=missing,
            first_batch=len(tasks))
        return await self.aws.run_tasks(requests)

    async def _ensure_trainer(self, body: dict[str, Any], names: RunNames,
                              spec: MultiTurnRLRunSpec, obs: Observed, attempt: int,
                              launch: int) -> None:
        owner = owner_reference(body)
        env = trainer_env(names, spec, _queue_urls(obs), self.settings.region, attempt, launch)
        await self.kube.create(trainer_builders.config_map(names, spec, owner))
        for manifest in trainer_builders.progress_channel(names, spec, owner):
            await self.kube.create(manifest)
        for manifest in launchers.build(names, spec, env, attempt, owner):
            await self.kube.create(manifest)

    async def _announce(self, body: dict[str, Any], names: RunNames, action: Act,
                        deleted: list[str]) -> None:
        """The operator's log and the run's Events name what a teardown action deleted."""
        if not deleted:
            return
        message = f"deleted {', '.join(deleted)}"
        announced = self._announced.setdefault(names.uid, set())
        if message in announced:
            return
        announced.add(message)
        log.info("%s/%s: %s", names.namespace, names.name, message,
                 extra={"run": f"{names.namespace}/{names.name}"})
        await self.kube.event(body, "Normal", TEARDOWN_EVENTS[action], message)

    async def _keep_failed_log(self, body: dict[str, Any], names: RunNames,
                               trainer: TrainerObserved) -> None:
        """Before a failed attempt's workload goes (and its pods with it), the tail of the
        log of the container that told its cause (read by the reconcile) into a ConfigMap the
        run owns: readable (`mtrl logs`) until the run is deleted, while the nodes are free."""
        key = f"log-{trainer.attempt}"
        if trainer.failed_in is None or key in self._announced.setdefault(names.uid, set()):
            return
        pod, container = trainer.failed_in
        text = await self.kube.pod_log(pod, names.namespace, container, tail_lines=KEPT_LOG_LINES)
        if text is not None:
            await self.kube.create(trainer_builders.kept_log(
                names, trainer.attempt, pod, container, text, owner_reference(body)))
            log.info("%s/%s: kept the log of %s (attempt %d) in ConfigMap %s",
                     names.namespace, names.name, pod, trainer.attempt,
                     names.trainer_log(trainer.attempt),
                     extra={"run": f"{names.namespace}/{names.name}"})
        self._announced[names.uid].add(key)

    async def _delete_trainers(self, body: dict[str, Any], names: RunNames,
                               obs: Observed) -> list[str]:
        if obs.trainer is not None and obs.trainer.state == TrainerState.FAILED:
            await self._keep_failed_log(body, names, obs.trainer)
        # What the reconcile observed, a live read included: a kind whose watch has not listed
        # yet (a CRD installed after the operator started) is not in the cache.
        deleted = []
        for kind, name in obs.trainer_workloads:
            if kind == "Job":
                # Its rendezvous Service, of the same name, first: the Service is not watched,
                # so the Job's existence is what brings a restarted operator back here.
                await self.kube.delete("Service", name, names.namespace)
            if await self.kube.delete(kind, name, names.namespace):
                deleted.append(f"{kind} {name}")
        return deleted

    async def _delete_workers(self, names: RunNames, spec: MultiTurnRLRunSpec | None,
                              obs: Observed) -> list[str]:
        deleted = []
        if obs.resources.worker_deployment and await self.kube.delete(
                "Deployment", obs.resources.worker_deployment, names.namespace):
            deleted.append(f"Deployment {obs.resources.worker_deployment}")
        if spec is None or spec.workers.backend == WorkerBackend.ECS_FARGATE:
            # The live tasks this reconcile observed; one started since is stopped next time.
            tasks = obs.resources.task_arns
            await self.aws.stop_tasks(self.cluster(spec), tasks)
            if tasks:
                deleted.append(f"{len(tasks)} ECS tasks in cluster {self.cluster(spec)}")
            if revisions := await self.aws.deregister_task_definitions(names):
                deleted.append(f"{revisions} revision(s) of task definition {names.task_family}")
        return deleted

    async def remove_finalizer(self, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        new = await self.kube.remove_finalizer(meta["namespace"], meta["name"], finalizers,
                                               FINALIZER)
        # Our copy sees its own write: a reconcile before the watch's DELETED must not repeat it.
        meta.update(new or {"finalizers": [f for f in finalizers if f != FINALIZER]})
