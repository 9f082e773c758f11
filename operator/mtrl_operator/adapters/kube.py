"""Kubernetes calls through lightkube's async client: create-if-absent, delete, status,
finalizers, Events, and informer-style list-and-watch."""

from __future__ import annotations

import logging
import os
import re
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any, cast

import httpx2 as httpx
from lightkube import AsyncClient, KubeConfig, codecs
from lightkube.core.exceptions import ApiError
from lightkube.core.exceptions import ConfigError as KubeConfigError
from lightkube.generic_resource import create_namespaced_resource
from lightkube.resources.apps_v1 import Deployment
from lightkube.resources.batch_v1 import Job
from lightkube.resources.core_v1 import ConfigMap, Namespace, Node, Pod, Service
from lightkube.resources.core_v1 import Event as CoreEvent
from lightkube.types import CascadeType, PatchType

from mtrl_api import API_VERSION, GROUP, VERSION
from mtrl_operator import metrics
from mtrl_operator.adapters.mutations import mutating
from mtrl_operator.errors import FatalConfig, NotPermitted, NotServed, SpecError, StaleCopy

log = logging.getLogger("mtrl.kube")
FIELD_MANAGER = "mtrl-operator"

MultiTurnRLRun = create_namespaced_resource(GROUP, VERSION, "MultiTurnRLRun", "multiturnrlruns")
PyTorchJob = create_namespaced_resource("kubeflow.org", "v1", "PyTorchJob", "pytorchjobs")
HyperPodPyTorchJob = create_namespaced_resource("sagemaker.amazonaws.com", "v1",
                                                "HyperPodPyTorchJob", "hyperpodpytorchjobs")
MultiTurnRLTrigger = create_namespaced_resource(GROUP, VERSION, "MultiTurnRLTrigger",
                                                "multiturnrltriggers")
# Kueue's (v0.17, the version HyperPod task governance builds on is older; v1beta2 is what a
# current Kueue stores and serves).
Workload = create_namespaced_resource("kueue.x-k8s.io", "v1beta2", "Workload", "workloads")
KUEUE_JOB_UID = "kueue.x-k8s.io/job-uid"  # the label Kueue gives a job's Workload


# Every kind the controllers name, by its Kubernetes kind: they speak names, not client types.
KINDS: dict[str, Any] = {
    "MultiTurnRLRun": MultiTurnRLRun, "MultiTurnRLTrigger": MultiTurnRLTrigger, "Job": Job,
    "PyTorchJob": PyTorchJob, "HyperPodPyTorchJob": HyperPodPyTorchJob,
    "Deployment": Deployment, "ConfigMap": ConfigMap, "Service": Service, "Pod": Pod,
    "Node": Node, "Workload": Workload,
}


def check_config() -> None:
    """The in-cluster service account or $KUBECONFIG, loadable; else FatalConfig naming it."""
    try:
        KubeConfig.from_env()
    except KubeConfigError as exc:
        raise FatalConfig(f"no usable Kubernetes configuration (in-cluster or "
                          f"KUBECONFIG={os.environ.get('KUBECONFIG', '')!r}): {exc}") from exc


def _dict(obj: Any) -> dict[str, Any]:
    return obj.to_dict() if hasattr(obj, "to_dict") else dict(obj)


def _message(exc: Exception) -> str:
    return str(exc.status.message) if isinstance(exc, ApiError) else str(exc)


def _status_code(exc: Exception) -> int | None:
    if isinstance(exc, ApiError):
        return int(exc.status.code) if exc.status.code is not None else None
    response = getattr(exc, "response", None)  # a watch's HTTP error
    return getattr(response, "status_code", None)



# Characters YAML may not carry raw (https://yaml.org/spec/1.2.2/#51-character-set). An apply
# patch is parsed as YAML and the client sends UTF-8 unescaped, so a status that quotes a spec
# holding a C1 control character would be refused ("control characters are not allowed") and
# the run would never get a status.
_NOT_YAML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x84\x86-\x9f\ud800-\udfff\ufffe\uffff]")


def yaml_safe(value: Any) -> Any:
    """`value` with every string's YAML-forbidden characters replaced by U+FFFD."""
    if isinstance(value, str):
        return _NOT_YAML.sub("\ufffd", value)
    if isinstance(value, dict):
        return {yaml_safe(k): yaml_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [yaml_safe(v) for v in value]
    return value

class Kube:
    """The operator's Kubernetes calls. Objects go in and come out as plain dicts; failures
    come out as the operator's own errors where a caller acts on them (`StaleCopy`,
    `SpecError`, `NotServed`)."""

    def __init__(self, client: AsyncClient | None = None) -> None:
        self.client = client or AsyncClient(field_manager=FIELD_MANAGER)

    @mutating("create {manifest[kind]} {manifest[metadata][name]}")
    async def create(self, manifest: dict[str, Any]) -> bool:
        """Create unless it exists; True when this call created it."""
        obj = codecs.from_dict(manifest)
        try:
            await self.client.create(obj)
        except (ApiError, httpx.HTTPStatusError) as exc:
            if _status_code(exc) == 409:
                return False
            # 422 (invalid) and 400 (unreadable, e.g. a quantity "4K"): the object is made
            # from the run's spec, so the spec is at fault and retrying cannot help.
            if _status_code(exc) in (400, 422):
                raise SpecError("InvalidChildObject", f"{manifest['kind']} "
                                f"{manifest['metadata']['name']}: {_message(exc)}") from exc
            raise
        metrics.RESOURCES_CREATED.labels(kind=manifest["kind"]).inc()
        return True

    async def get(self, kind: str, name: str, namespace: str) -> dict[str, Any] | None:
        """A live (quorum) read, never a cache: None when the object does not exist."""
        try:
            obj = await self.client.get(KINDS[kind], name, namespace=namespace)
        except (ApiError, httpx.HTTPStatusError) as exc:
            if _status_code(exc) == 404:
                return None
            raise
        return _dict(obj)

    @mutating("delete {kind} {namespace}/{name}")
    async def delete(self, kind: str, name: str, namespace: str) -> bool:
        """Delete in the background (children follow); a missing object is already deleted
        (False: this call found nothing to delete)."""
        try:
            await self.client.delete(KINDS[kind], name, namespace=namespace,
                                     cascade=CascadeType.BACKGROUND, grace_period=None)
        except (ApiError, httpx.HTTPStatusError) as exc:
            if _status_code(exc) != 404:
                raise
            return False
        metrics.RESOURCES_DELETED.labels(kind=kind).inc()
        return True

    @mutating("apply the status of {kind} {namespace}/{name}")
    async def apply_status(self, namespace: str, name: str, status: dict[str, Any],
                           own_conditions: frozenset[str],
                           kind: str = "MultiTurnRLRun") -> str | None:
        """Server-side apply under the operator's field manager: it owns the fields it sends,
        and of `conditions` (a map keyed by `type`) only the types in `own_conditions`, so
        another writer's conditions stay, and a field it no longer sends goes. Returns the
        resourceVersion the write made; None when the run or trigger is gone (no status to
        keep)."""
        ours = yaml_safe({**status, "conditions": [c for c in status.get("conditions") or []
                                                   if c.get("type") in own_conditions]})
        body = {"apiVersion": API_VERSION, "kind": kind,
                "metadata": {"name": name, "namespace": namespace}, "status": ours}
        try:
            obj = await self.client.patch(KINDS[kind].Status, name, body, namespace=namespace,
                                          patch_type=PatchType.APPLY,
                                          field_manager=FIELD_MANAGER, force=True)
        except (ApiError, httpx.HTTPStatusError) as exc:
            # No 409 to expect: a forced apply without a resourceVersion takes the fields from
            # any other manager and is conditioned on no version.
            if _status_code(exc) != 404:
                raise
            return None
        return str(_dict(obj)["metadata"]["resourceVersion"])

    @mutating("set the finalizers of {kind} {namespace}/{name}")
    async def set_finalizers(self, namespace: str, name: str, finalizers: list[str],
                             resource_version: str,
                             kind: str = "MultiTurnRLRun") -> dict[str, Any] | None:
        """Optimistic: a stale resourceVersion raises StaleCopy and the reconcile runs again.
        Returns the new metadata, so the caller's cached copy sees its own write at once (a
        reconcile before the watch's echo would otherwise repeat it and get a 409); None
        when the object is gone."""
        try:
            obj = await self.client.patch(KINDS[kind], name, {"metadata": {
                "finalizers": finalizers, "resourceVersion": resource_version}},
                namespace=namespace, patch_type=PatchType.MERGE)
        except (ApiError, httpx.HTTPStatusError) as exc:
            if _status_code(exc) == 409:
                raise StaleCopy(f"finalizers of {namespace}/{name}") from exc
            if _status_code(exc) == 404:
                return None
            raise
        return dict(_dict(obj)["metadata"])

    @mutating("remove {finalizer} from {namespace}/{name}")
    async def remove_finalizer(self, namespace: str, name: str, finalizers: list[str],
                               finalizer: str,
                               kind: str = "MultiTurnRLRun") -> dict[str, Any] | None:
        """Remove `finalizer` from a run or trigger whose finalizers are still `finalizers`. The
        condition is a JSON-patch test of that list, not the resourceVersion, which our own
        status writes move on: a teardown must not wait for their echo. Returns the new
        metadata, None when the object is gone; raises StaleCopy when the list changed
        meanwhile."""
        try:
            obj = await self.client.patch(KINDS[kind], name, [
                {"op": "test", "path": "/metadata/finalizers", "value": finalizers},
                {"op": "replace", "path": "/metadata/finalizers",
                 "value": [f for f in finalizers if f != finalizer]},
            ], namespace=namespace, patch_type=PatchType.JSON)
        except (ApiError, httpx.HTTPStatusError) as exc:
            if _status_code(exc) == 404:
                return None
            if _status_code(exc) == 422:  # the test failed: someone changed the list
                raise StaleCopy(f"finalizers of {namespace}/{name}") from exc
            raise
        return dict(_dict(obj)["metadata"])

    async def labelled(self, kind: str, namespace: str,
                       labels: dict[str, Any]) -> list[dict[str, Any]]:
        """Objects of `kind` in `namespace` carrying `labels`, read from the server."""
        return [_dict(obj) async for obj in
                self.client.list(KINDS[kind], namespace=namespace, labels=labels)]

    async def queue_workloads(self, namespace: str, job_uid: str) -> list[dict[str, Any]]:
        """Kueue's Workloads of the job with `job_uid`; none when Kueue is not installed or
        the operator may not read them (the chart grants it)."""
        try:
            return await self.labelled("Workload", namespace, {KUEUE_JOB_UID: job_uid})
        except (ApiError, httpx.HTTPStatusError) as exc:
            if _status_code(exc) in (403, 404):
                return []
            raise

    async def pod_log(self, name: str, namespace: str, container: str,
                      tail_lines: int) -> str | None:
        """The tail of a container's log (pods/log, as `kubectl logs --tail`); None when the
        pod or its log is gone."""
        try:
            return "".join([line async for line in self.client.log(
                name, namespace=namespace, container=container, tail_lines=tail_lines)])
        except (ApiError, httpx.HTTPStatusError) as exc:
            if _status_code(exc) in (400, 404):
                return None
            raise

    async def names(self, kind: str, scopes: list[str]) -> list[tuple[str, str]]:
        """(namespace, name) of every object of `kind` in `scopes` (namespaces, or "*"), read
        from the server; none when the kind is not served."""
        found: list[tuple[str, str]] = []
        for ns in scopes:
            try:
                found += [(o.metadata.namespace, o.metadata.name)
                          async for o in self.client.list(KINDS[kind], namespace=ns)]
            except (ApiError, httpx.HTTPStatusError) as exc:
                if _status_code(exc) != 404:
                    raise
        return found

    async def cluster_uid(self) -> str:
        """The UID of the kube-system namespace: the usual identity of a cluster (it lives as
        long as the cluster, and no two clusters share it). FatalConfig when it cannot be
        read: without an identity the sweeper could not tell this cluster's resources from
        another's."""
        try:
            obj = await self.client.get(Namespace, "kube-system")
        except (ApiError, httpx.HTTPStatusError) as exc:
            raise FatalConfig(
                f"cannot read the kube-system namespace for the cluster's identity "
                f"({_status_code(exc)}: {_message(exc)}); grant get on it (the chart does) "
                "or set MTRL_CLUSTER_ID") from exc
        assert obj.metadata is not None and obj.metadata.uid
        return str(obj.metadata.uid)

    async def uids(self, kind: str, scopes: list[str]) -> set[str]:
        """UIDs of every object of `kind` that exists now in `scopes` (namespaces, or "*"):
        read from the server, not from a cache, because the sweepers delete whatever is not in
        this set."""
        uids: set[str] = set()
        for ns in scopes:
            async for obj in self.client.list(KINDS[kind], namespace=ns):
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
            await self.client.create(cast(CoreEvent, event))
        # An Event is best effort: a terminating namespace refuses it.
        except (ApiError, httpx.HTTPStatusError) as exc:
            log.debug("event not posted: %s", exc)

    async def list_and_watch(self, kind: str, labels: dict[str, Any],
                             namespace: str) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
        """An informer's stream: first ("LISTED", every object), then ("ADDED" | "MODIFIED" |
        "DELETED", [object]) from the list's resourceVersion on, until the watch ends (a cut
        stream, a version too old) or fails; raises NotServed when the kind is not served and
        NotPermitted when the operator may not list it. `namespace` "" for cluster-wide kinds."""
        where = namespace or None
        try:
            listing = self.client.list(KINDS[kind], namespace=where, labels=labels)
            objs = [_dict(obj) async for obj in listing]
            yield "LISTED", objs
            async for event, obj in self.client.watch(
                    KINDS[kind], namespace=where, labels=labels, server_timeout=240,
                    resource_version=listing.resourceVersion):
                yield event, [_dict(obj)]
        except Exception as exc:
            if _status_code(exc) == 404:
                raise NotServed(kind) from exc
            if _status_code(exc) == 403:
                raise NotPermitted(kind) from exc
            raise
