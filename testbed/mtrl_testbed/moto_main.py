"""`python -m mtrl_testbed.moto_main [moto_server args]`: moto's server, less three of its costs
and without its lost updates.

moto's threaded server runs each connection's requests in its own thread against backends that
hold no locks, and SQS loses messages that way. `Queue.delete_message` rebuilds the queue's
message list from a copy and assigns it back, so a SendMessage that appends between the two is
answered 200 and its message is gone; ReceiveMessage also fails now and then with
`RuntimeError: Set changed size during iteration`, and ECS DescribeTasks with
`dictionary changed size during iteration`. Real SQS loses nothing it acknowledged, and a
worker whose generate request vanished waits out MTRL_GENERATE_TIMEOUT_S. `one_at_a_time`
makes moto answer one request at a time (Python's GIL ran one at a time already, so this costs
no parallelism); an SQS long poll lets go of the lock while it waits for messages, as the real
service serves other callers meanwhile.

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

And connections are kept alive, as AWS's endpoints keep them. werkzeug's development server
answers every request with `Connection: close` (werkzeug 2.1 on, `serving.py`: http.server
cannot drain a body the application left unread before the next request line), so every AWS
call of every client made a new TCP connection and moto a new thread. `KeepAliveHandler`
reads a request's whole body (its Content-Length) before moto sees it, so nothing is left to
drain, and leaves the connection open; a chunked body or `Expect: 100-continue` still closes
it, as before.

And a RunTask that botocore repeats after losing its answer (a read timeout, a reset
connection, a 5xx) starts its tasks once. Real ECS answers a repeated `clientToken` with the
first call's tasks (RunTask API reference: "An identifier that you provide to ensure the
idempotency of the request"); moto ignores the token and starts them again (the fault tests
once saw 14 tasks of a 12-task run; the 4 live tasks of a 2-task run that CI saw twice in
test_two_installs were, by the second failure's log, a second operator reconciling that run,
fixed in the test). `answer_retries_once` honours the token for a retry of the same call only,
as botocore marks it (the same `amz-sdk-invocation-id` header): a new call with an old token
still starts new tasks, so an operator that skipped its look-up before RunTask still fails the
crash tests.
"""

from __future__ import annotations

import functools
import io
import logging
import os
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

import moto.server
from moto import backends
from moto.core.utils import unix_time
from moto.ecs.responses import EC2ContainerServiceResponse
from moto.moto_server.werkzeug_app import DomainDispatcherApplication
from moto.server import MotoRequestHandler
from moto.sqs.models import Message, Queue, SQSBackend

BACKENDS = threading.Lock()  # held while moto reads or changes its state for a request
log = logging.getLogger("mtrl.moto")

WsgiApp = Callable[[Any, dict[str, Any], Any], Iterable[bytes]]


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


def one_at_a_time(app: WsgiApp) -> WsgiApp:
    """`app`, answering under BACKENDS; its answer is read whole before the lock is let go, so
    no backend code runs outside it."""

    @functools.wraps(app)
    def locked(self: Any, environ: dict[str, Any], start_response: Any) -> list[bytes]:
        with BACKENDS:
            answer = app(self, environ, start_response)
            try:
                return [b"".join(answer)]
            finally:
                close = getattr(answer, "close", None)
                if close is not None:
                    close()

    return locked


def unlocked_while_waiting(wait: Callable[[Queue, int], None]) -> Callable[[Queue, int], None]:
    """`Queue.wait_for_messages`, letting go of BACKENDS for the wait: a long poll must not
    hold back the SendMessage it waits for."""

    @functools.wraps(wait)
    def waiting(self: Queue, timeout: int) -> None:
        BACKENDS.release()
        try:
            wait(self, timeout)
        finally:
            BACKENDS.acquire()

    return waiting


def answer_retries_once(run_task: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """`EC2ContainerServiceResponse.run_task`, answering a retry of one call (the same
    invocation id and clientToken) with the tasks its first attempt started."""
    answered: dict[tuple[str, str], Any] = {}

    @functools.wraps(run_task)
    def once(self: Any) -> Any:
        key = (self.headers.get("amz-sdk-invocation-id") or "",
               self._get_param("clientToken") or "")
        if not all(key):
            return run_task(self)
        if key in answered:
            log.warning("RunTask retried (invocation %s, clientToken %s): answered with its "
                        "first attempt's tasks, as ECS does", *key)
        else:
            answered[key] = run_task(self)
        return answered[key]

    return once


def serialize() -> None:
    DomainDispatcherApplication.__call__ = one_at_a_time(  # type: ignore[method-assign]
        DomainDispatcherApplication.__call__)
    Queue.wait_for_messages = unlocked_while_waiting(Queue.wait_for_messages)  # type: ignore[method-assign]


class KeepAliveHandler(MotoRequestHandler):
    """moto's request handler, which keeps a connection for the client's next request when
    the body of this one has a known length."""

    _keep_alive = False
    # A kept connection carries the next request only once this answer is wholly received;
    # werkzeug writes its headers and body separately, which Nagle's algorithm would hold
    # back for the client's delayed ACK (some 40 ms) where closing the connection flushed.
    disable_nagle_algorithm = True

    def run_wsgi(self) -> None:
        length = self.headers.get("Content-Length")
        self._keep_alive = (
            "chunked" not in self.headers.get("Transfer-Encoding", "").lower()
            and "100-continue" not in self.headers.get("Expect", "").lower()
            and (length is None or length.isdigit())
        )
        if not self._keep_alive:
            super().run_wsgi()
            return
        connection = self.rfile
        self.rfile = io.BytesIO(connection.read(int(length)) if length else b"")  # type: ignore[assignment]
        try:
            super().run_wsgi()
        finally:
            self.rfile = connection

    def send_header(self, keyword: str, value: str) -> None:
        if self._keep_alive and keyword.lower() == "connection" and value.lower() == "close":
            return
        super().send_header(keyword, value)


def main(argv: list[str]) -> None:
    if switch_s := os.environ.get("MTRL_MOTO_SWITCH_INTERVAL_S"):  # tests: races show sooner
        sys.setswitchinterval(float(switch_s))
    patch()
    read_modules_once()
    serialize()
    EC2ContainerServiceResponse.run_task = answer_retries_once(  # type: ignore[method-assign]
        EC2ContainerServiceResponse.run_task)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    moto.server.MotoRequestHandler = KeepAliveHandler  # type: ignore[misc]
    moto.server.main(argv)


if __name__ == "__main__":
    main(sys.argv[1:])
