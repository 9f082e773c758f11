"""The test bed's moto launcher: moto's answers, at less cost (`mtrl_testbed.moto_main`)."""

from __future__ import annotations

import http.client
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.config import Config
from moto.sqs.models import Queue, SQSBackend

from mtrl_testbed import moto_main
from mtrl_testbed.moto import REGION, MotoServer
from mtrl_testbed.ports import wait_until
from tests.robustness.faults import FaultPlan, FaultProxy

RETENTION_S = 60  # SQS's shortest MessageRetentionPeriod
SQS_FORM = {"Content-Type": "application/x-www-form-urlencoded",
            "Authorization": "AWS4-HMAC-SHA256 Credential=testing/20260101/us-west-2/sqs/"
                             "aws4_request, SignedHeaders=host, Signature=0"}


def backend_with_messages() -> SQSBackend:
    backend = SQSBackend(REGION, "123456789012")
    backend.create_queue("q", MessageRetentionPeriod=str(RETENTION_S))
    backend.send_message("q", "fresh")
    expired = backend.send_message("q", "expired")
    expired.sent_timestamp -= (RETENTION_S + 1) * 1000  # type: ignore[operator]
    just_in = backend.send_message("q", "just in")
    just_in.sent_timestamp -= (RETENTION_S - 5) * 1000  # type: ignore[operator]
    return backend


def test_the_fast_check_agrees_with_moto_s_own() -> None:
    backend = backend_with_messages()
    messages = backend.get_queue("q")._messages
    own = [SQSBackend.is_message_valid_based_on_retention_period(backend, "q", m) for m in messages]
    fast = [moto_main.fast_retention_check(backend, "q", m) for m in messages]
    assert fast == own == [True, False, True]


def test_receive_with_the_patch_still_stops_at_an_expired_message(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """moto's ReceiveMessage ends its pass at the first expired message; so does the patch."""
    unpatched = backend_with_messages()
    own = [m.body for m in unpatched.receive_message("q", 10, 0, 30)]
    monkeypatch.setattr(SQSBackend, "is_message_valid_based_on_retention_period",
                        SQSBackend.is_message_valid_based_on_retention_period)
    assert moto_main.patch()
    patched = backend_with_messages()
    fast = [m.body for m in patched.receive_message("q", 10, 0, 30)]
    assert fast == own == ["fresh"]


def test_moto_s_modules_are_listed_once_and_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    from moto import backends

    listed = list(backends.list_of_moto_modules())
    monkeypatch.setattr(backends, "list_of_moto_modules", backends.list_of_moto_modules)
    moto_main.read_modules_once()
    assert list(backends.list_of_moto_modules()) == listed
    assert "sqs" in listed and "ecs" in listed
    assert backends.list_of_moto_modules() is backends.list_of_moto_modules()


def post(connection: http.client.HTTPConnection, path: str, body: bytes,
         headers: dict[str, str]) -> tuple[int, str | None, bytes]:
    connection.request("POST", path, body, headers)
    reply = connection.getresponse()
    return reply.status, reply.getheader("Connection"), reply.read()


def test_the_server_keeps_a_connection_for_the_next_request(moto_server: MotoServer) -> None:
    """Each request here has a body; the second one on the same socket is answered too, also
    after a request whose body moto never reads (an unknown path)."""
    connection = http.client.HTTPConnection("127.0.0.1", moto_server.port, timeout=30)
    listing = b"Action=ListQueues&Version=2012-11-05"
    status, closes, body = post(connection, "/", listing, SQS_FORM)
    assert (status, closes) == (200, None) and b"ListQueuesResponse" in body
    socket = connection.sock
    post(connection, "/moto-api/no-such-path", b"x" * 100_000, {})
    status, closes, body = post(connection, "/", listing, SQS_FORM)
    assert (status, closes) == (200, None) and b"ListQueuesResponse" in body
    assert connection.sock is socket  # one connection throughout
    connection.close()


def test_a_chunked_request_still_closes_its_connection(moto_server: MotoServer) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", moto_server.port, timeout=30)
    connection.request("POST", "/", iter([b"Action=ListQueues", b"&Version=2012-11-05"]),
                       SQS_FORM | {"Transfer-Encoding": "chunked"}, encode_chunked=True)
    reply = connection.getresponse()
    assert reply.status == 200 and b"ListQueuesResponse" in reply.read()
    assert reply.getheader("Connection") == "close"
    connection.close()


def test_a_long_poll_lets_other_requests_through(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ReceiveMessage waiting for messages lets go of the lock that serializes moto's
    requests, so the SendMessage it waits for gets in and ends the wait. Held through the wait,
    the send would queue behind the receive, which would come back empty after 5 s."""
    waiting = threading.Event()
    own_wait = Queue.wait_for_messages

    def wait_for_messages(queue: Queue, timeout: int) -> None:
        waiting.set()
        own_wait(queue, timeout)

    monkeypatch.setattr(Queue, "wait_for_messages",
                        moto_main.unlocked_while_waiting(wait_for_messages))
    backend = SQSBackend(REGION, "123456789012")
    backend.create_queue("q")
    received: list[list[str]] = []

    def long_poll() -> None:
        with moto_main.BACKENDS:
            received.append([m.body for m in backend.receive_message("q", 10, 5, 30)])

    poller = threading.Thread(target=long_poll)
    poller.start()
    assert waiting.wait(10), "the receive never waited"
    with moto_main.BACKENDS:
        backend.send_message("q", "hello")
    poller.join()
    assert received == [["hello"]]


def test_an_answer_is_read_whole_under_the_lock() -> None:
    """moto's WSGI app runs, and its answer is read and closed, while the lock is held."""
    seen: list[str] = []

    class Answer:
        def __iter__(self) -> Iterator[bytes]:
            seen.append(f"read, locked={moto_main.BACKENDS.locked()}")
            yield from (b"a", b"b")

        def close(self) -> None:
            seen.append(f"closed, locked={moto_main.BACKENDS.locked()}")

    def app(_self: object, _environ: dict[str, object], _start: object) -> Answer:
        seen.append(f"called, locked={moto_main.BACKENDS.locked()}")
        return Answer()

    assert moto_main.one_at_a_time(app)(None, {}, None) == [b"ab"]
    assert seen == ["called, locked=True", "read, locked=True", "closed, locked=True"]
    assert not moto_main.BACKENDS.locked()


def test_no_message_is_lost_to_concurrent_sends_and_deletes(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """moto_main's server keeps every message it acknowledged while other connections
    receive and delete on the same queue. moto alone loses some: `Queue.delete_message`
    rebuilds the message list from a copy, dropping what a SendMessage appended meanwhile.
    Threads switch every 10 us here instead of every 5 ms, so a race that costs a CI run a
    generate request now and then shows within a few thousand messages."""
    monkeypatch.setenv("MTRL_MOTO_SWITCH_INTERVAL_S", "0.00001")
    server = MotoServer(log_path=tmp_path / "moto.log").start()
    try:
        sqs = boto3.client("sqs", endpoint_url=server.endpoint, region_name=REGION,
                           aws_access_key_id="testing", aws_secret_access_key="testing",
                           config=Config(max_pool_connections=8))
        url = sqs.create_queue(QueueName="race", Attributes={"VisibilityTimeout": "2"})["QueueUrl"]
        sent: set[str] = set()
        received: set[str] = set()

        def take() -> None:
            messages = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10,
                                           WaitTimeSeconds=0).get("Messages", [])
            if messages:
                received.update(m["Body"] for m in messages)
                sqs.delete_message_batch(QueueUrl=url, Entries=[
                    {"Id": str(i), "ReceiptHandle": m["ReceiptHandle"]}
                    for i, m in enumerate(messages)])

        def producer_consumer(k: int) -> None:
            for batch in range(60):
                bodies = [f"{k}-{batch}-{i}" for i in range(10)]
                sqs.send_message_batch(QueueUrl=url, Entries=[
                    {"Id": str(i), "MessageBody": b} for i, b in enumerate(bodies)])
                sent.update(bodies)
                take()

        workers = [threading.Thread(target=producer_consumer, args=(k,)) for k in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()

        def drained() -> bool:
            take()
            counts = sqs.get_queue_attributes(QueueUrl=url, AttributeNames=[
                "ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"])
            return not any(int(n) for n in counts["Attributes"].values())

        wait_until(drained, 300, "the queue to drain", interval=0)
        assert len(sent) == 2400
        assert sent - received == set(), f"{len(sent - received)} acknowledged messages lost"
        assert "Traceback" not in (tmp_path / "moto.log").read_text()
    finally:
        server.stop()


class _LoseFirstRunTaskAnswer(FaultPlan):
    """moto starts the tasks of the first RunTask; its answer never reaches the client."""

    def choose(self, operation: str) -> str | None:
        if operation == "RunTask" and not self.injected:
            self.injected["lost-response"] += 1
            return "lost-response"
        return None


def _run_task(ecs: Any, family: str, token: str, subnet: str, group: str) -> list[str]:
    answer = ecs.run_task(cluster="retried", taskDefinition=family, count=2,
                          launchType="FARGATE", startedBy=family, clientToken=token,
                          networkConfiguration={"awsvpcConfiguration": {
                              "subnets": [subnet], "securityGroups": [group]}})
    return sorted(t["taskArn"] for t in answer["tasks"])


def test_a_run_task_retried_after_a_lost_answer_starts_its_tasks_once(
        moto_server: MotoServer, aws_env: dict[str, str]) -> None:
    """botocore repeats a RunTask whose answer was lost, with the same clientToken; ECS answers
    the repeat with the tasks the first attempt started, and so does the test bed's moto. A
    new call with that token (an operator restarted without looking first) starts new ones."""
    network = moto_server.prepare_fargate("retried")
    family = f"retried-{uuid.uuid4().hex[:8]}"
    ecs = boto3.client("ecs")
    ecs.register_task_definition(family=family, requiresCompatibilities=["FARGATE"],
                                 networkMode="awsvpc", cpu="256", memory="512",
                                 containerDefinitions=[{"name": "w", "image": "w:1",
                                                        "cpu": 256, "memory": 512}])
    with FaultProxy(moto_server.endpoint, _LoseFirstRunTaskAnswer(1.0)) as proxy:
        answered = _run_task(boto3.client("ecs", endpoint_url=proxy.endpoint), family, "t-1",
                             *network)
    assert proxy.plan.injected["lost-response"] == 1
    started = ecs.list_tasks(cluster="retried", startedBy=family)["taskArns"]
    assert len(answered) == 2 and sorted(started) == answered

    again = _run_task(ecs, family, "t-1", *network)
    started = ecs.list_tasks(cluster="retried", startedBy=family)["taskArns"]
    assert len(started) == 4 and not set(again) & set(answered)
