"""The run's actions against recording adapters: what teardown asks AWS for, in what order."""

from __future__ import annotations

from typing import Any

from mtrl_api.run import MultiTurnRLRunSpec, MultiTurnRLRunStatus
from mtrl_operator.controllers.run_actions import RunActions
from mtrl_operator.naming import RunNames
from mtrl_operator.reconcile.run import Act, Decision
from mtrl_operator.settings import Settings

NAMES = RunNames("team-a", "run", "0b7e3c9e-2a65-4f1c-9d55-3b1f7e8d2c11")
SPEC = MultiTurnRLRunSpec.model_validate({
    "model": {"name": "m"}, "rollout": {"environment": "target"},
    "dataset": {"inline": {"train": [{"target": "a"}]}},
    "output": {"s3Uri": "s3://outputs/runs"}})


class _Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def delete_payloads(self, bucket: str, prefix: str) -> int:
        self.calls.append(("delete_payloads", bucket, prefix))
        return 3

    async def delete_queues(self, names: RunNames) -> int:
        self.calls.append(("delete_queues", names.aws_prefix))
        return 4

    async def event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.calls.append(("event", reason, message))


async def test_deleting_the_queues_deletes_the_runs_payloads_first() -> None:
    """The payloads under the run's own prefix go before its queues (no message can point at
    one once the queues are gone; a failure leaves the queues, so the action comes again).
    Nothing deleted them before: they lived under no run's prefix."""
    recorder = _Recorder()
    actions = RunActions(Settings(), kube=recorder, aws=recorder)  # type: ignore[arg-type]
    body = {"metadata": {"namespace": NAMES.namespace, "name": NAMES.name, "uid": NAMES.uid}}
    await actions.run(body, NAMES, SPEC, None,  # type: ignore[arg-type]
                      Decision([Act.DELETE_QUEUES], MultiTurnRLRunStatus()))
    prefix = f"mtrl-payloads/{NAMES.aws_prefix}"
    assert recorder.calls[0] == ("delete_payloads", "outputs", prefix)
    assert recorder.calls[1][0] == "event" and f"3 offloaded payloads under s3://outputs/{prefix}/" \
        in recorder.calls[1][2]
    assert ("delete_queues", NAMES.aws_prefix) in recorder.calls[2:]
