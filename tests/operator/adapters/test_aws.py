"""The AWS adapter against the moto server: what it answers is what AWS then holds."""

from __future__ import annotations

import asyncio
import os
import uuid

from mtrl_api.run import QueuesSpec
from mtrl_operator.adapters.aws import Aws
from mtrl_operator.builders import queues as queue_builders
from mtrl_operator.naming import RunNames


def test_ensure_queues_answers_every_queue_it_made_or_found(aws_env: dict[str, str]) -> None:
    aws = Aws(os.environ["AWS_DEFAULT_REGION"])
    names = RunNames("ns", "queues", str(uuid.uuid4()))
    spec = QueuesSpec()

    def ensure(existing: dict[str, str]) -> dict[str, str]:
        return asyncio.run(aws.ensure_queues(
            names, queue_builders.dead_letter_queue(names, spec),
            lambda role, arn: queue_builders.work_queue(names, spec, role, arn), existing))

    made = ensure({})
    assert made == asyncio.run(aws.queues(names))
    assert set(made) == {queue_builders.DLQ, *queue_builders.WORK_QUEUES}
    # A repeat after a crash: what was listed is kept, the rest is made (or found) again.
    assert ensure({queue_builders.DLQ: made[queue_builders.DLQ]}) == made
