"""kopf wiring only: runs' and triggers' watch events go to their controllers' work queues."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterable
from typing import Any, cast

import kopf

from mtrl_api import GROUP, VERSION
from mtrl_operator.adapters import mutations
from mtrl_operator.adapters.aws import Aws
from mtrl_operator.adapters.kube import Kube
from mtrl_operator.adapters.trigger_aws import TriggerAws
from mtrl_operator.controllers.run import Controller
from mtrl_operator.controllers.trigger import TriggerController
from mtrl_operator.errors import FatalConfig
from mtrl_operator.settings import Settings

log = logging.getLogger("mtrl.operator")
FATAL_EXIT_CODE = 2  # as main's: a configuration that cannot work


class NoDiffBase(kopf.DiffBaseStorage):
    """No essence kept. kopf builds one for every watch event (a deep copy of the whole body,
    then another to strip its progress fields) to diff it for change handlers; this operator
    registers none (only `on.event`), so nothing reads it. With 500 runs starting, those two
    copies were 9 % of the operator's CPU (py-spy, GIL samples, `bench/scale_bench.py`)."""

    def build(self, *, body: kopf.Body,
              extra_fields: Iterable[Any] | None = None) -> kopf.BodyEssence:
        return kopf.BodyEssence()

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


class _State:
    settings: Settings = Settings()
    controller: Controller | None = None
    triggers: TriggerController | None = None


STATE = _State()


def configure(settings: Settings) -> None:
    STATE.settings = settings


def tune(settings: kopf.OperatorSettings) -> None:
    """kopf as this operator uses it: an event pump, with no change handlers of its own."""
    # A silent watch stream must not hang the operator: reconnect well within a few minutes.
    settings.watching.server_timeout = 240
    settings.watching.client_timeout = 300
    settings.watching.connect_timeout = 30
    settings.posting.level = logging.WARNING
    settings.persistence.finalizer = f"{GROUP}/kopf"  # never added: no kopf change handlers
    settings.persistence.diffbase_storage = NoDiffBase()


async def identified(settings: Settings, kube: Kube) -> Settings:
    """The settings with the cluster's identity: MTRL_CLUSTER_ID, else the kube-system
    namespace's UID. An operator that cannot tell ends at once, with one line naming why."""
    if settings.cluster_id:
        return settings
    try:
        cluster_id = await kube.cluster_uid()
    except FatalConfig as exc:
        log.critical("%s", exc)
        print(f"mtrl operator: {exc}", file=sys.stderr, flush=True)
        os._exit(FATAL_EXIT_CODE)
    log.info("cluster identity %s (the kube-system namespace's UID)", cluster_id)
    return settings.model_copy(update={"cluster_id": cluster_id})


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    tune(settings)
    kube = Kube()
    ours = STATE.settings = await identified(STATE.settings, kube)
    mutations.arm_failpoint(ours.crash_after_step or None)
    controller = Controller(ours, kube, Aws(ours.region))
    controller.start()
    STATE.controller = controller
    triggers = TriggerController(ours, controller.kube, TriggerAws(ours.region))
    triggers.start()
    STATE.triggers = triggers


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    if STATE.triggers:
        await STATE.triggers.stop()
    if STATE.controller:
        await STATE.controller.stop()


def _object(event: kopf.RawEvent) -> dict[str, Any]:
    return cast(dict[str, Any], event["object"])


def _ours(event: kopf.RawEvent) -> bool:
    """In a watched namespace: kopf watches the whole cluster when they are globs."""
    return STATE.settings.watches(_object(event)["metadata"].get("namespace", ""))


@kopf.on.event(GROUP, VERSION, "multiturnrlruns")
def run_event(*, event: kopf.RawEvent, **_: Any) -> None:
    if not _ours(event):
        return
    if STATE.controller:
        STATE.controller.on_run(event.get("type"), _object(event))
    if STATE.triggers:  # a trigger counts its runs' phases
        STATE.triggers.on_run(event.get("type"), _object(event))


@kopf.on.event(GROUP, VERSION, "multiturnrltriggers")
def trigger_event(*, event: kopf.RawEvent, **_: Any) -> None:
    if not _ours(event):
        return
    if STATE.triggers:
        STATE.triggers.on_trigger(event.get("type"), _object(event))
