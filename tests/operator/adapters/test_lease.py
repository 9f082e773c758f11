"""The Lease adapter against a stand-in for lightkube's client: a renewal changes the spec
only, so the chart's Lease keeps its release's labels and Helm's annotations (which is what
lets `helm uninstall` delete it, and `helm upgrade` leave it alone)."""

from __future__ import annotations

import datetime as dt
from typing import Any

from lightkube.models.coordination_v1 import LeaseSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.coordination_v1 import Lease

from mtrl_operator.adapters.lease import KubeLease
from mtrl_operator.leader import LeaseRecord

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
HELMS = {"app.kubernetes.io/managed-by": "Helm", "app.kubernetes.io/instance": "mtrl-operator"}
OWNER = {"meta.helm.sh/release-name": "mtrl-operator",
         "meta.helm.sh/release-namespace": "mtrl-system"}


class Client:
    """get answers the chart's Lease as the API server keeps it; replace records the PUT."""

    def __init__(self) -> None:
        self.lease = Lease(metadata=ObjectMeta(name="mtrl-operator-default",
                                               namespace="mtrl-system", resourceVersion="7",
                                               labels=dict(HELMS), annotations=dict(OWNER)),
                           spec=LeaseSpec())
        self.put: list[Lease] = []

    async def get(self, _kind: Any, _name: str, namespace: str) -> Lease:
        return self.lease

    async def replace(self, lease: Lease) -> Lease:
        self.put.append(lease)
        return Lease(metadata=ObjectMeta(resourceVersion="8"))


async def test_a_write_keeps_the_charts_labels_and_annotations() -> None:
    client = Client()
    store = KubeLease(client, "mtrl-operator-default", "mtrl-system")  # type: ignore[arg-type]
    found = await store.read()
    assert found is not None
    record, version = found
    assert (record.holder, record.renew_time, version) == ("", None, "7")  # free to take
    assert await store.write(LeaseRecord("a", 15, T0, T0, 1), version) == "8"
    [put] = client.put
    assert put.metadata is not None and put.spec is not None
    assert put.metadata.labels == HELMS and put.metadata.annotations == OWNER
    assert (put.metadata.name, put.metadata.namespace, put.metadata.resourceVersion) == (
        "mtrl-operator-default", "mtrl-system", "7")
    assert (put.spec.holderIdentity, put.spec.leaseDurationSeconds,
            put.spec.leaseTransitions) == ("a", 15, 1)
    assert str(store) == "mtrl-system/mtrl-operator-default"
