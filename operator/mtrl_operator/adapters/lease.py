"""The leader-election Lease in the API server (`coordination.k8s.io/v1`)."""

from __future__ import annotations

import copy

from lightkube import AsyncClient
from lightkube.core.exceptions import ApiError
from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

from mtrl_operator.errors import FatalConfig
from mtrl_operator.leader import LeaseConflict, LeaseRecord
from mtrl_operator.naming import LABEL_MANAGED_BY, MANAGED_BY


def _refused(exc: ApiError, verb: str, name: str, namespace: str) -> Exception:
    """A 401 or 403 is no passing trouble: the replica can never hold the Lease."""
    if exc.status.code in (401, 403):
        return FatalConfig(f"the operator may not {verb} its Lease {namespace}/{name} "
                           f"({exc.status.code} {exc.status.reason}: {exc.status.message}); "
                           "its ServiceAccount needs get, create and update on leases "
                           "(coordination.k8s.io) there, as the chart's Role grants")
    return exc


class KubeLease:
    """One Lease, read and written with optimistic concurrency. A write changes the spec only:
    the Lease may be the chart's (its release's labels and Helm's annotations, so that `helm
    uninstall` deletes it), and those stay as they were read, as client-go's LeaseLock keeps
    the object it got."""

    def __init__(self, client: AsyncClient, name: str, namespace: str) -> None:
        self.client = client
        self.name = name
        self.namespace = namespace
        self._metadata: ObjectMeta | None = None  # as last read

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"

    @classmethod
    def connect(cls, name: str, namespace: str, field_manager: str) -> KubeLease:
        """The Lease over a client of its own (the election runs on a loop of its own)."""
        return cls(AsyncClient(field_manager=field_manager), name, namespace)

    async def read(self) -> tuple[LeaseRecord, str] | None:
        try:
            lease = await self.client.get(Lease, self.name, namespace=self.namespace)
        except ApiError as exc:
            if exc.status.code == 404:
                return None
            raise _refused(exc, "get", self.name, self.namespace) from exc
        self._metadata = lease.metadata
        spec = lease.spec or LeaseSpec()
        record = LeaseRecord(holder=spec.holderIdentity or "",
                             duration_seconds=spec.leaseDurationSeconds or 0,
                             acquire_time=spec.acquireTime, renew_time=spec.renewTime,
                             transitions=spec.leaseTransitions or 0)
        assert lease.metadata is not None and lease.metadata.resourceVersion is not None
        return record, lease.metadata.resourceVersion

    def _lease(self, record: LeaseRecord, resource_version: str | None) -> Lease:
        metadata = ObjectMeta(name=self.name, namespace=self.namespace,
                              labels={LABEL_MANAGED_BY: MANAGED_BY})
        if resource_version is not None and self._metadata is not None:
            metadata = copy.copy(self._metadata)  # a write: the object's metadata as read
        metadata.resourceVersion = resource_version
        return Lease(
            metadata=metadata,
            spec=LeaseSpec(holderIdentity=record.holder,
                           leaseDurationSeconds=record.duration_seconds,
                           acquireTime=record.acquire_time, renewTime=record.renew_time,
                           leaseTransitions=record.transitions))

    async def create(self, record: LeaseRecord) -> str:
        try:
            lease = await self.client.create(self._lease(record, None))
        except ApiError as exc:
            if exc.status.code == 409:  # another candidate created it first
                raise LeaseConflict(self.name) from exc
            raise _refused(exc, "create", self.name, self.namespace) from exc
        return str(lease.metadata.resourceVersion if lease.metadata else "")

    async def write(self, record: LeaseRecord, resource_version: str) -> str:
        try:
            lease = await self.client.replace(self._lease(record, resource_version))
        except ApiError as exc:
            if exc.status.code == 409:
                raise LeaseConflict(self.name) from exc
            raise _refused(exc, "update", self.name, self.namespace) from exc
        return str(lease.metadata.resourceVersion if lease.metadata else "")
