"""A recording reverse proxy on loopback, in front of the moto server.

A process pointed at it with AWS_ENDPOINT_URL makes the same HTTP calls it would make to AWS;
the proxy forwards each one to moto and keeps request and response. Only that process's
traffic is recorded, unlike moto's own recorder, which sees every client of the shared server
(the test's own boto3 calls and other tests' operators included). The IAM tests read the
recording; the fault proxies (`aws_faults`, the robustness tests') change what passes.
"""

from __future__ import annotations

import http.client
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

# Headers that describe one hop, not the message (RFC 9110 §7.6.1), plus the length we recompute.
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer",
               "transfer-encoding", "upgrade", "content-length"}
_UPSTREAM_TIMEOUT_S = 70  # longer than SQS's 20 s long poll, with botocore's retries in mind


@dataclass(frozen=True)
class Exchange:
    """One request as the client sent it, and moto's answer."""

    method: str
    path: str  # without the query string
    query: str
    headers: dict[str, str]  # names in lower case
    body: bytes
    status: int
    response: bytes


class ForwardingHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as botocore expects
    server: ForwardingServer

    def _forward(self) -> None:
        body = self._read_body()
        url = urlsplit(self.path)
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
        status, reply_headers, payload = self.exchange(body, headers)
        self.server.record(Exchange(self.command, url.path, url.query,
                                    {k.lower(): v for k, v in self.headers.items()}, body,
                                    status, payload))
        self.send_response(status)
        for key, value in reply_headers:
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(payload)

    def exchange(self, body: bytes, headers: dict[str, str]
                 ) -> tuple[int, list[tuple[str, str]], bytes]:
        """The answer the client gets: moto's, unless a subclass says otherwise."""
        return self.upstream(body, headers)

    def upstream(self, body: bytes, headers: dict[str, str]
                 ) -> tuple[int, list[tuple[str, str]], bytes]:
        """moto's answer to the request (status, headers, payload)."""
        upstream = http.client.HTTPConnection(self.server.upstream_host, self.server.upstream_port,
                                              timeout=_UPSTREAM_TIMEOUT_S)
        try:
            upstream.request(self.command, self.path, body=body, headers=headers)
            reply = upstream.getresponse()
            payload = reply.read()
            reply_headers = [(k, v) for k, v in reply.getheaders() if k.lower() not in _HOP_BY_HOP]
            return reply.status, reply_headers, payload
        finally:
            upstream.close()

    def _read_body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while size := int(self.rfile.readline().split(b";")[0], 16):
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
            while self.rfile.readline() not in (b"\r\n", b"\n", b""):  # trailers
                pass
            return b"".join(chunks)
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _forward

    def log_message(self, format: str, *args: Any) -> None:
        pass  # botocore retries are in the recording; stderr noise helps no one


class ForwardingServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, upstream: str,
                 handler: type[ForwardingHandler] = ForwardingHandler) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        target = urlsplit(upstream)
        self.upstream_host = target.hostname or "127.0.0.1"
        self.upstream_port = target.port or 80
        self.exchanges: list[Exchange] = []
        self._lock = threading.Lock()

    def record(self, exchange: Exchange) -> None:
        with self._lock:
            self.exchanges.append(exchange)


class RecordingProxy:
    """`with RecordingProxy(moto.endpoint) as proxy:` ... `proxy.exchanges`; a fault proxy
    passes its own server."""

    def __init__(self, upstream: str, server: ForwardingServer | None = None) -> None:
        self._server = server or ForwardingServer(upstream)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name=f"{type(self).__name__}")

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    @property
    def exchanges(self) -> list[Exchange]:
        with self._server._lock:
            return list(self._server.exchanges)

    def __enter__(self) -> RecordingProxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
