"""kopf wiring only: runs' watch events go to the controller's work queue."""

from __future__ import annotations

import logging
from typing import Any

import kopf

from mtrl_operator.adapters import crashpoints
from mtrl_operator.adapters.aws import Aws
from mtrl_operator.adapters.kube import Kube
from mtrl_operator.api import GROUP, VERSION
from mtrl_operator.controller import Controller
from mtrl_operator.settings import Settings


class _State:
    settings: Settings = Settings()
    controller: Controller | None = None


STATE = _State()


def configure(settings: Settings) -> None:
    STATE.settings = settings


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    ours = STATE.settings
    # A silent watch stream must not hang the operator: reconnect well within a few minutes.
    settings.watching.server_timeout = 240
    settings.watching.client_timeout = 300
    settings.watching.connect_timeout = 30
    settings.posting.level = logging.WARNING
    settings.persistence.finalizer = f"{GROUP}/kopf"  # never added: no kopf change handlers
    crashpoints.arm(ours.crash_after_step)
    controller = Controller(ours, Kube(), Aws(ours.region))
    controller.start()
    STATE.controller = controller


@kopf.on.cleanup()
async def cleanup(**_: Any) -> None:
    if STATE.controller:
        await STATE.controller.stop()


@kopf.on.event(GROUP, VERSION, "multiturnrlruns")
def run_event(event: dict[str, Any], **_: Any) -> None:
    if STATE.controller:
        STATE.controller.on_run(event.get("type"), event["object"])
