"""A fault-injecting reverse proxy on loopback, in front of the moto server.

It extends the test bed's recording proxy (`mtrl_testbed.aws_proxy`): for a seeded fraction
of requests it answers in place of AWS with what AWS answers under load (throttling, 5xx) or
cuts the connection (before the request reaches moto, or after moto acted on it and before the
answer comes back). Every
other request is forwarded unchanged. Error bodies follow the protocol the client spoke, read
from the request's Content-Type, so botocore parses them as it would real AWS errors.
"""

from __future__ import annotations

import io
import json
import random
import socket
import struct
import threading
from collections import Counter
from dataclasses import dataclass, field

from mtrl_testbed.aws_proxy import ForwardingHandler, ForwardingServer, RecordingProxy

# (status, error code, message) of the answers the proxy makes up.
ERRORS: dict[str, tuple[int, str, str]] = {
    "throttle": (400, "ThrottlingException", "Rate exceeded"),
    "internal": (500, "InternalFailure", "We encountered an internal error. Please try again."),
    "unavailable": (503, "ServiceUnavailable", "Service is unavailable. Please try again."),
}
# Connection faults: `reset` drops the request unread by moto; `lost-response` lets moto act
# and drops its answer, so the client's retry repeats a call that already took effect.
CUTS = ("reset", "lost-response")
KINDS = (*ERRORS, *CUTS)
# SQS speaks JSON 1.0 with query-compatible error codes: botocore maps the code in this header
# (the old query-protocol name of the error) over `__type`.
SQS_QUERY_CODES = {"ThrottlingException": "RequestThrottled;Sender",
                   "InternalFailure": "InternalError;Receiver",
                   "ServiceUnavailable": "ServiceUnavailable;Receiver"}


@dataclass
class FaultPlan:
    """Which requests fail and how: a seeded RNG, so a run's fault sequence is reproducible
    for a given request order."""

    rate: float
    seed: int = 0
    kinds: tuple[str, ...] = KINDS
    injected: Counter[str] = field(default_factory=Counter)
    by_operation: Counter[str] = field(default_factory=Counter)
    total: int = 0
    _rng: random.Random = field(init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def choose(self, operation: str) -> str | None:
        with self._lock:
            self.total += 1
            if self._rng.random() >= self.rate:
                return None
            kind = self._rng.choice(self.kinds)
            self.injected[kind] += 1
            self.by_operation[operation] += 1
            return kind

    def summary(self) -> str:
        kinds = ", ".join(f"{k}={self.injected[k]}" for k in self.kinds)
        return (f"{self.total} AWS requests, {sum(self.injected.values())} faults injected "
                f"({kinds})")


def _cbor_head(major: int, n: int) -> bytes:
    if n < 24:
        return bytes([major << 5 | n])
    if n < 256:
        return bytes([major << 5 | 24, n])
    return bytes([major << 5 | 25]) + n.to_bytes(2, "big")


def cbor_map(fields: dict[str, str]) -> bytes:
    """A CBOR map of text strings: all an rpc-v2-cbor error body needs (botocore prefers that
    protocol for some services when it supports it)."""
    out = _cbor_head(5, len(fields))
    for key, value in fields.items():
        for text in (key, value):
            raw = text.encode()
            out += _cbor_head(3, len(raw)) + raw
    return out


def error_response(content_type: str, target: str, code: str,
                   message: str) -> tuple[dict[str, str], bytes]:
    """Headers and body of an AWS error in the protocol of the request."""
    fields = {"__type": code, "message": message}
    if content_type.startswith("application/cbor"):
        return {"Content-Type": "application/cbor", "smithy-protocol": "rpc-v2-cbor"}, \
            cbor_map(fields)
    headers = {"Content-Type": content_type or "application/x-amz-json-1.1"}
    if target.startswith("AmazonSQS."):
        fields["__type"] = f"com.amazonaws.sqs#{code}"
        headers["x-amzn-query-error"] = SQS_QUERY_CODES[code]
    return headers, json.dumps(fields).encode()


class FaultHandler(ForwardingHandler):
    server: FaultServer

    def _forward(self) -> None:
        target = self.headers.get("X-Amz-Target", "")
        fault = self.server.plan.choose(target.rsplit(".", 1)[-1] or self.path)
        if fault is None:
            super()._forward()
        elif fault == "lost-response":
            # Forward and record as usual, but into a sink: moto acted, the client hears nothing.
            wfile, self.wfile = self.wfile, io.BytesIO()
            try:
                super()._forward()
            finally:
                self.wfile = wfile
            self._reset()
        elif fault == "reset":
            self._read_body()
            self._reset()
        else:
            self._read_body()  # keep the keep-alive stream in step
            self._answer(fault, target)

    # The base class binds its verbs to its own `_forward`; rebind them to this one.
    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward

    def _answer(self, fault: str, target: str) -> None:
        status, code, message = ERRORS[fault]
        headers, body = error_response(self.headers.get("Content-Type", ""), target, code, message)
        self.send_response(status)
        for key, value in {**headers, "x-amzn-RequestId": "fault-injected"}.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _reset(self) -> None:
        """Close with RST and no response: to the client, a network failure."""
        self.close_connection = True
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class FaultServer(ForwardingServer):
    def __init__(self, upstream: str, plan: FaultPlan) -> None:
        super().__init__(upstream, FaultHandler)
        self.plan = plan


class FaultProxy(RecordingProxy):
    """`with FaultProxy(moto.endpoint, FaultPlan(0.25, seed=1)) as proxy:` ... `proxy.plan`."""

    def __init__(self, upstream: str, plan: FaultPlan) -> None:
        super().__init__(upstream, FaultServer(upstream, plan))
        self.plan = plan
