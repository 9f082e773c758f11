"""The kopf settings the operator starts with."""

from __future__ import annotations

import logging

import kopf

from mtrl_operator.handlers import NoDiffBase, tune

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
