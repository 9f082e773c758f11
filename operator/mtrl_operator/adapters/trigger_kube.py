"""Kubernetes calls for triggers: their status, finalizer and Events, and their runs."""

from __future__ import annotations

from typing import Any

from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.types import PatchType

from mtrl_api import GROUP, VERSION
from mtrl_operator.adapters.kube import Kube, MultiTurnRLRun
from mtrl_operator.adapters.mutations import mutating

MultiTurnRLTrigger = create_namespaced_resource(GROUP, VERSION, "MultiTurnRLTrigger",
                                                "multiturnrltriggers")


class TriggerKube:
    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.client = kube.client

    @mutating("patch the status of trigger {namespace}/{name}")
    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        """A merge patch; a trigger deleted meanwhile has no status to keep."""
        try:
            await self.client.patch(MultiTurnRLTrigger.Status, name, {"status": status},
                                    namespace=namespace, patch_type=PatchType.MERGE)
        except ApiError as exc:
            if exc.status.code != 404:
                raise

    async def set_finalizers(self, namespace: str, name: str, finalizers: list[str],
                             resource_version: str) -> dict[str, Any]:
        return await self.kube.set_finalizers(namespace, name, finalizers, resource_version,
                                              MultiTurnRLTrigger)

    async def create_run(self, manifest: dict[str, Any]) -> bool:
        """True when created; False when a run of that name exists (the object's run)."""
        return await self.kube.create(manifest)

    async def delete_run(self, namespace: str, name: str) -> None:
        await self.kube.delete(MultiTurnRLRun, name, namespace)

    async def trigger_uids(self, scopes: list[str]) -> set[str]:
        return await self.kube.uids(MultiTurnRLTrigger, scopes)

    async def event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        await self.kube.event(body, type_, reason, message, kind="MultiTurnRLTrigger")
