"""The kopf settings the operator starts with."""

from __future__ import annotations

import logging

import kopf

from mtrl_operator.handlers import NoDiffBase, identified, tune
from mtrl_operator.settings import Settings

RUN = {"apiVersion": "mtrl.dev/v1alpha1", "kind": "MultiTurnRLRun",
       "metadata": {"name": "r", "namespace": "ns", "uid": "u", "resourceVersion": "7",
                    "annotations": {"note": "x"}},
       "spec": {"model": {"name": "m"}, "grpo": {"groupSize": 8}},
       "status": {"phase": "Running"}}


def test_kopf_keeps_no_essence_of_the_runs() -> None:
    """kopf's own storage copies every event's body into an essence for change handlers;
    the operator has none, so its storage keeps nothing and stores nothing on the run."""
    settings = kopf.OperatorSettings()
    assert kopf.AnnotationsDiffBaseStorage().build(body=kopf.Body(RUN))  # what kopf would copy
    tune(settings)
    storage = settings.persistence.diffbase_storage
    assert isinstance(storage, NoDiffBase)
    assert storage.build(body=kopf.Body(RUN)) == {}
    assert storage.fetch(body=kopf.Body(RUN)) is None
    patch = kopf.Patch()
    storage.store(body=kopf.Body(RUN), patch=patch, essence=kopf.BodyEssence())
    assert not patch


def test_kopf_settings_reconnect_and_post_warnings_only() -> None:
    settings = kopf.OperatorSettings()
    tune(settings)
    assert settings.watching.client_timeout == 300
    assert settings.watching.server_timeout == 240
    assert settings.posting.level == logging.WARNING
    assert settings.persistence.finalizer == "mtrl.dev/kopf"


class _Kube:
    def __init__(self) -> None:
        self.asked = 0

    async def cluster_uid(self) -> str:
        self.asked += 1
        return "0b7e3c9e-2a65-4f1c-9d55-3b1f7e8d2c11"


async def test_the_cluster_identity_is_the_kube_system_uid_unless_set() -> None:
    kube = _Kube()
    found = await identified(Settings(), kube)  # type: ignore[arg-type]
    assert found.cluster_id == "0b7e3c9e-2a65-4f1c-9d55-3b1f7e8d2c11"
    assert found.owner.cluster_id == found.cluster_id
    assert (await identified(Settings(cluster_id="prod"), kube)).cluster_id == "prod"  # type: ignore[arg-type]
    assert kube.asked == 1
