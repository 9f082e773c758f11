"""What a run's decision asks for, done through the adapters: queues, workers and trainer made
from the builders' manifests and request bodies, and taken down again.

Each action works from what its reconcile just observed (the queues, the live tasks, the task
definition) instead of looking again, and never lists: every name is known.
"""

from __future__ import annotations

import logging
from typing import Any

from mtrl_api.run import MultiTurnRLRunSpec, WorkerBackend
from mtrl_operator.adapters.aws import Aws
from mtrl_operator.adapters.kube import Kube
from mtrl_operator.builders import queues as queue_builders
from mtrl_operator.builders import trainer as trainer_builders
from mtrl_operator.builders import workers as worker_builders
from mtrl_operator.builders.env import trainer_env, worker_env
from mtrl_operator.naming import FINALIZER, RunNames, owner_reference
from mtrl_operator.reconcile.run import Act, Decision, Observed
from mtrl_operator.settings import Settings

log = logging.getLogger("mtrl.controller")


def _queue_urls(obs: Observed) -> dict[str, str]:
    return {q.role: q.url for q in obs.resources.queues}


class RunActions:
    def __init__(self, settings: Settings, kube: Kube, aws: Aws) -> None:
        self.settings = settings
        self.kube = kube
        self.aws = aws

    def cluster(self, spec: MultiTurnRLRunSpec | None) -> str:
        """The run's ECS cluster, or the operator's default."""
        return (spec.workers.ecs.cluster if spec and spec.workers.ecs.cluster
                else self.settings.ecs_cluster)

    async def run(self, body: dict[str, Any], names: RunNames, spec: MultiTurnRLRunSpec | None,
                  obs: Observed, decision: Decision) -> None:
        """The decision's actions, in their order."""
        for action in decision.actions:
            log.info("%s/%s: %s", names.namespace, names.name, action.value,
                     extra={"run": f"{names.namespace}/{names.name}"})
            if action == Act.ENSURE_QUEUES:
                assert spec is not None
                await self.aws.ensure_queues(
                    names, queue_builders.dead_letter_queue(names, spec.queues),
                    lambda role, arn: queue_builders.work_queue(names, spec.queues, role, arn),
                    existing=_queue_urls(obs))
            elif action == Act.ENSURE_WORKERS:
                assert spec is not None
                await self._ensure_workers(body, names, spec, obs)
            elif action == Act.ENSURE_TRAINER:
                assert spec is not None
                await self._ensure_trainer(body, names, spec, obs, decision.attempt)
            elif action == Act.DELETE_TRAINER:
                await self._delete_trainers(names, obs)
            elif action == Act.DELETE_WORKERS:
                await self._delete_workers(names, spec, obs)
            elif action == Act.DELETE_QUEUES:
                await self.aws.delete_queues(names)
            elif action == Act.DELETE_RUN:
                await self.kube.delete("MultiTurnRLRun", names.name, names.namespace)
            elif action == Act.REMOVE_FINALIZER:
                await self.remove_finalizer(body)

    async def _ensure_workers(self, body: dict[str, Any], names: RunNames,
                              spec: MultiTurnRLRunSpec, obs: Observed) -> None:
        env = worker_env(names, spec, _queue_urls(obs), self.settings.region)
        if spec.workers.backend == WorkerBackend.KUBERNETES:
            await self.kube.create(worker_builders.deployment(names, spec, env,
                                                              owner_reference(body)))
            return
        definition = await self.aws.ensure_task_definition(
            names, worker_builders.task_definition(names, spec, env,
                                                   self.settings.ecs_execution_role_arn),
            known=obs.resources.task_definition_arn)
        tasks = await self.aws.worker_tasks(names, self.cluster(spec))
        live = sum(t.live for t in tasks)
        missing = spec.workers.max_replicas - live
        if missing <= 0:
            return
        requests = worker_builders.run_task_requests(
            names, spec, definition, self.cluster(spec),
            spec.workers.ecs.subnets or self.settings.ecs_subnets,
            spec.workers.ecs.security_groups or self.settings.ecs_security_groups,
            attempt=1, missing=missing, first_batch=len(tasks))
        await self.aws.run_tasks(requests)

    async def _ensure_trainer(self, body: dict[str, Any], names: RunNames,
                              spec: MultiTurnRLRunSpec, obs: Observed, attempt: int) -> None:
        owner = owner_reference(body)
        env = trainer_env(names, spec, _queue_urls(obs), self.settings.region, attempt)
        await self.kube.create(trainer_builders.config_map(names, spec, owner))
        for manifest in trainer_builders.progress_channel(names, spec, owner):
            await self.kube.create(manifest)
        for manifest in trainer_builders.workload(names, spec, env, attempt, owner):
            await self.kube.create(manifest)

    async def _delete_trainers(self, names: RunNames, obs: Observed) -> None:
        # What the reconcile observed, a live read included: a kind whose watch has not listed
        # yet (a CRD installed after the operator started) is not in the cache.
        for kind, name in obs.trainer_workloads:
            if kind == "Job":
                # Its rendezvous Service, of the same name, first: the Service is not watched,
                # so the Job's existence is what brings a restarted operator back here.
                await self.kube.delete("Service", name, names.namespace)
            await self.kube.delete(kind, name, names.namespace)

    async def _delete_workers(self, names: RunNames, spec: MultiTurnRLRunSpec | None,
                              obs: Observed) -> None:
        if obs.resources.worker_deployment:
            await self.kube.delete("Deployment", obs.resources.worker_deployment,
                                   names.namespace)
        if spec is None or spec.workers.backend == WorkerBackend.ECS_FARGATE:
            # The live tasks this reconcile observed; one started since is stopped next time.
            await self.aws.stop_tasks(self.cluster(spec), obs.resources.task_arns)
            await self.aws.deregister_task_definitions(names)

    async def remove_finalizer(self, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        finalizers = list(meta.get("finalizers") or [])
        new = await self.kube.remove_finalizer(meta["namespace"], meta["name"], finalizers,
                                               FINALIZER)
        # Our copy sees its own write: a reconcile before the watch's DELETED must not repeat it.
        meta.update(new or {"finalizers": [f for f in finalizers if f != FINALIZER]})
