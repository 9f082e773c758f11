"""Kubernetes calls through lightkube's async client: create-if-absent, delete, status."""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from lightkube import AsyncClient, codecs
from lightkube.core.exceptions import ApiError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.core_v1 import Event as CoreEvent
from lightkube.types import CascadeType, PatchType

from mtrl_api import API_VERSION, GROUP, VERSION
from mtrl_operator import metrics
from mtrl_operator.adapters.mutations import mutating
from mtrl_operator.errors import SpecError, StaleCopy

log = logging.getLogger("mtrl.kube")
FIELD_MANAGER = "mtrl-operator"

MultiTurnRLRun = create_namespaced_resource(GROUP, VERSION, "MultiTurnRLRun", "multiturnrlruns")
PyTorchJob = create_namespaced_resource("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs")
HyperPodPyTorchJob = create_namespaced_resource("sagemaker.amazonaws.com", "v1",
                                                "HyperPodPyTorchJob", "hyperpodpytorchjobs")


def merge_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """The JSON merge patch (RFC 7386) that turns `old` into `new`. A key `new` lacks is sent
    as null: a merge patch that only omits it would leave the old value on the server (a
    finished run would keep naming its deleted trainer). Lists are replaced whole."""
    patch: dict[str, Any] = {key: None for key in old if key not in new}
    for key, value in new.items():
        before = old.get(key)
        if isinstance(value, dict) and isinstance(before, dict):
            if nested := merge_patch(before, value):
                patch[key] = nested
        elif value != before or key not in old:
            patch[key] = value
    return patch


def owner_reference(body: dict[str, Any]) -> dict[str, Any]:
    """Children are owned by the run: Kubernetes' garbage collector is the last safety net."""
    return {"apiVersion": API_VERSION, "kind": "MultiTurnRLRun",
            "name": body["metadata"]["name"], "uid": body["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}


class Kube:
    def __init__(self, client: AsyncClient | None = None) -> None:
        self.client = client or AsyncClient(field_manager=FIELD_MANAGER)

    @mutating("create {manifest[kind]} {manifest[metadata][name]}")
    async def create(self, manifest: dict[str, Any]) -> bool:
        """Create unless it exists; True when this call created it."""
        obj = codecs.from_dict(manifest)
        try:
            await self.client.create(obj)
        except ApiError as exc:
            if exc.status.code == 409:
                return False
            if exc.status.code == 422:  # the run's spec made an object Kubernetes refuses
                raise SpecError("InvalidChildObject", f"{manifest['kind']} "
                                f"{manifest['metadata']['name']}: {exc.status.message}") from exc
            raise
        metrics.RESOURCES_CREATED.labels(kind=manifest["kind"]).inc()
        return True

    async def get(self, resource: Any, name: str, namespace: str) -> dict[str, Any] | None:
        """A live (quorum) read, never a cache: None when the object does not exist."""
        try:
            obj = await self.client.get(resource, name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise
        return obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)

    @mutating("delete {resource.__name__} {namespace}/{name}")
    async def delete(self, resource: Any, name: str, namespace: str) -> None:
        """Delete in the background (children follow); a missing object is already deleted."""
        try:
            await self.client.delete(resource, name, namespace=namespace,
                                     cascade=CascadeType.BACKGROUND, grace_period=None)
        except ApiError as exc:
            if exc.status.code != 404:
                raise
            return
        metrics.RESOURCES_DELETED.labels(kind=resource.__name__).inc()

    async def delete_collection(self, resource: Any, namespace: str, labels: dict[str, str]) -> None:
        async for obj in self.client.list(resource, namespace=namespace, labels=labels):
            await self.delete(resource, obj.metadata.name, namespace)

    @mutating("patch the status of {namespace}/{name}")
    async def patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        await self.client.patch(MultiTurnRLRun.Status, name, {"status": status},
                                namespace=namespace, patch_type=PatchType.MERGE)

    @mutating("set the finalizers of {namespace}/{name}")
    async def set_finalizers(self, namespace: str, name: str, finalizers: list[str],
                             resource_version: str, resource: Any = MultiTurnRLRun) -> dict[str, Any]:
        """Optimistic: a stale resourceVersion fails with 409 and the reconcile runs again.
        Returns the new metadata, so the caller's cached copy sees its own write at once (a
        reconcile before the watch's echo would otherwise repeat it and get a 409)."""
        obj = await self.client.patch(resource, name, {"metadata": {
            "finalizers": finalizers, "resourceVersion": resource_version}},
            namespace=namespace, patch_type=PatchType.MERGE)
        return dict(obj.to_dict()["metadata"])

    @mutating("remove {finalizer} from {namespace}/{name}")
    async def remove_finalizer(self, namespace: str, name: str, finalizers: list[str],
                               finalizer: str) -> dict[str, Any] | None:
        """Remove `finalizer` from a run whose finalizers are still `finalizers`. The condition
        is a JSON-patch test of that list, not the resourceVersion, which our own status writes
        move on: a teardown must not wait for their echo. Returns the new metadata, None when
        the run is gone; raises StaleCopy when the list changed meanwhile."""
        try:
            obj = await self.client.patch(MultiTurnRLRun, name, [
                {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
                {"op": "replace", "path": "/metadata/finalizers",
                 "value": [f for f in finalizers if f != finalizer]},
            ], namespace=namespace, patch_type=PatchType.JSON)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            if exc.status.code == 422:  # the test failed: someone changed the list
                raise StaleCopy(f"finalizers of {namespace}/{name}") from exc
            raise
        return dict(obj.to_dict()["metadata"])

    @mutating("delete MultiTurnRLRun {namespace}/{name}")
    async def delete_run(self, namespace: str, name: str, uid: str) -> None:
        try:
            await self.client.delete(MultiTurnRLRun, name, namespace=namespace)
        except ApiError as exc:
            if exc.status.code != 404:
                raise

    async def uids(self, resource: Any, scopes: list[str]) -> set[str]:
        """UIDs of every object of `resource` that exists now in `scopes` (namespaces, or "*"):
        read from the server, not from a cache, because the sweepers delete whatever is not in
        this set."""
        uids: set[str] = set()
        for ns in scopes:
            async for obj in self.client.list(resource, namespace=ns):
                uids.add(obj.metadata.uid)
        return uids

    @mutating("post the event {reason}", step=False)
    async def event(self, body: dict[str, Any], type_: str, reason: str, message: str,
                    kind: str = "MultiTurnRLRun") -> None:
        """An Event about `body`, an object of our API group; best effort."""
        meta = body["metadata"]
        now = datetime.now(UTC)
        event = CoreEvent.from_dict({
            "apiVersion": "v1", "kind": "Event",
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:16]}",
                         "namespace": meta["namespace"]},
            "involvedObject": {"apiVersion": API_VERSION, "kind": kind,
                               "name": meta["name"], "namespace": meta["namespace"],
                               "uid": meta["uid"]},
            "type": type_, "reason": reason, "message": message[:1024],
            "source": {"component": FIELD_MANAGER},
            "reportingComponent": FIELD_MANAGER, "reportingInstance": FIELD_MANAGER,
            "firstTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "lastTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "count": 1,
        })
        try:
            await self.client.create(event)
        except ApiError as exc:  # an event is best effort: a terminating namespace refuses it
            log.debug("event not posted: %s", exc)

    async def list_with_version(self, resource: Any, labels: dict[str, Any],
                                namespace: str = "*") -> tuple[list[Any], str]:
        """The objects, and the resourceVersion to watch from for what follows."""
        listing = self.client.list(resource, namespace=namespace, labels=labels)
        objs = [obj async for obj in listing]
        return objs, listing.resourceVersion

    async def watch(self, resource: Any, labels: dict[str, Any], namespace: str = "*",
                    resource_version: str | None = None) -> AsyncIterator[tuple[str, Any]]:
        async for event, obj in self.client.watch(resource, namespace=namespace, labels=labels,
                                                  server_timeout=240,
                                                  resource_version=resource_version):
            yield event, obj
