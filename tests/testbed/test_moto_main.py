"""The test bed's moto launcher: moto's answers, at less cost (`mtrl_testbed.moto_main`)."""

from __future__ import annotations

import http.client

import pytest
from moto.sqs.models import SQSBackend

from mtrl_testbed import moto_main
from mtrl_testbed.moto import REGION, MotoServer

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
