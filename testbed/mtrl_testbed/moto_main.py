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

Two costs every request paid are gone too; together they were about a fifth of moto's CPU in
`bench/scale_bench.py` (py-spy, 500 runs):
- moto lists its own package folder (`os.listdir`, then `isdir` on each of some 150 entries) to
  route each request (`backends.list_of_moto_modules`, called by the dispatcher's
  `get_backend_for_host`); the folder does not change while the server runs, so it is read once;
- werkzeug logs a line per request (`"POST / HTTP/1.1" 200 -`, which names no action); only its
  warnings and errors are kept.
"""

from __future__ import annotations

import functools
import logging
import sys

from moto import backends
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


def read_modules_once() -> None:
    listed = backends.list_of_moto_modules
    backends.list_of_moto_modules = functools.cache(lambda: tuple(listed()))  # type: ignore[assignment]


def main(argv: list[str]) -> None:
    from moto.server import main as moto_server

    patch()
    read_modules_once()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    moto_server(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
