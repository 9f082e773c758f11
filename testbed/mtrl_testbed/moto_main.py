"""`python -m mtrl_testbed.moto_main [moto_server args]`: moto's server, without one quadratic cost.

moto's SQS ReceiveMessage checks each message it returns against the queue's retention period
by asking `get_queue_attributes` for `MessageRetentionPeriod`, which builds the queue's whole
attribute map three times; each build counts the queue's visible, delayed and in-flight
messages, each reading the clock per message (moto 5.x, `moto/sqs/models.py`:
`is_message_valid_based_on_retention_period`). So one received message costs time in
proportion to every message the queue holds, in flight included. Under a training run's load
(hundreds of requests in flight on the generate and rollout queues) that made ReceiveMessage
cost 24 ms of moto's CPU on average, moto's one process ran out of CPU, and every SQS call of
the run queued behind it: a SendMessageBatch took 220 ms on loopback. Real SQS has no such
cost, so the benchmarks measured moto.

`fast_retention_check` gives the same answer from the queue's retention attribute alone. It is
applied only where moto still has the method it replaces, so a moto that changes it runs
unpatched (slower, never wrong).
"""

from __future__ import annotations

import sys

from moto.core.utils import unix_time
from moto.sqs.models import Message, SQSBackend


def fast_retention_check(self: SQSBackend, queue_name: str, message: Message) -> bool:
    """Whether `message` is still within its queue's MessageRetentionPeriod."""
    retention_s = int(self.get_queue(queue_name).message_retention_period)
    return retention_s + message.sent_timestamp / 1000 > unix_time()  # type: ignore[operator]


def patch() -> bool:
    """Install `fast_retention_check`; False where this moto has no method of that name."""
    if not hasattr(SQSBackend, "is_message_valid_based_on_retention_period"):
        return False
    SQSBackend.is_message_valid_based_on_retention_period = fast_retention_check  # type: ignore[method-assign]
    return True


def main(argv: list[str]) -> None:
    from moto.server import main as moto_server

    patch()
    moto_server(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
