"""A plain-HTTP proxy on loopback in front of the kube-apiserver, for Kubernetes faults.

The operator gets a kubeconfig whose server is this proxy (`http://127.0.0.1:<port>`, no
credentials); the proxy forwards every request over TLS with the token it was given (the
operator's ServiceAccount's, so the chart's RBAC and admission policy apply) and streams the
answers back, watch streams included. On command it

- severs open connections (`cut`): every one, or only the requests whose path matches, so a
  watch stream ends mid-chunk as it does when a load balancer or the API server drops it;
- refuses matching requests for a while (`partition`): each is reset on arrival, so a watch
  cannot come back until the partition ends, while the cluster goes on changing;
- answers a seeded fraction of PATCH and PUT requests to a run's `/status` with a real-looking
  409 Conflict, as the API server does when an optimistic write lost a race.

It also counts the 409s the API server itself returned, by verb and resource: real conflicts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import socket
import ssl
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml
from aiohttp import web
from multidict import CIMultiDict

from mtrl_testbed.cluster import LocalCluster

Match = Callable[[str], bool]  # on the request's path and query string
_HOP_BY_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer",
               "transfer-encoding", "upgrade", "content-length", "host"}
RUN_STATUS = re.compile(r"^/apis/mtrl\.dev/[^/]+/namespaces/[^/]+/multiturnrlruns/([^/]+)/status$")


def is_watch(path_qs: str) -> bool:
    return re.search(r"[?&]watch=(true|1)(&|$)", path_qs) is not None


def resource_of(path: str) -> str:
    """`jobs` for /apis/batch/v1/namespaces/ns/jobs and .../jobs/name; the plural that follows
    a namespace, or the last segment of a cluster-scoped path."""
    parts = [p for p in path.split("?")[0].split("/") if p]
    if "namespaces" in parts and len(parts) > parts.index("namespaces") + 2:
        return parts[parts.index("namespaces") + 2]
    return parts[-1] if parts else ""


def conflict_status(name: str) -> dict[str, Any]:
    """What the API server answers an update whose resourceVersion is stale."""
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": f'Operation cannot be fulfilled on multiturnrlruns.mtrl.dev "{name}": the '
                       "object has been modified; please apply your changes to the latest "
                       "version and try again",
            "reason": "Conflict",
            "details": {"name": name, "group": "mtrl.dev", "kind": "multiturnrlruns"},
            "code": 409}


@dataclass
class ProxyCounts:
    requests: int = 0
    watches: Counter[str] = field(default_factory=Counter)  # watch requests made, by resource
    cuts: int = 0
    connections_cut: int = 0
    refused: int = 0  # requests reset on arrival during a partition
    status_writes: int = 0  # PATCH/PUT of a run's status
    conflicts_injected: int = 0
    # 409s the API server answered: "PATCH multiturnrlruns Conflict", "POST jobs AlreadyExists"
    conflicts_from_server: Counter[str] = field(default_factory=Counter)


class KubeProxy:
    """`with KubeProxy(cluster, tmp_path) as proxy:` gives `proxy.kubeconfig` to the operator."""

    def __init__(self, cluster: LocalCluster, directory: Path, conflict_rate: float = 0.0,
                 seed: int = 0, *, token: str) -> None:
        self.upstream = cluster.server
        self.conflict_rate = conflict_rate
        self.counts = ProxyCounts()
        self._rng = random.Random(seed)
        self._ssl = ssl.create_default_context(cafile=str(cluster.root / "pki" / "ca.crt"))
        # Forwarded as the token's owner (the operator's ServiceAccount), with no client
        # certificate: the API server would take that first.
        self._auth = {"Authorization": f"Bearer {token}"}
        self._sock = socket.socket()
        self._sock.bind(("127.0.0.1", 0))
        self.port = self._sock.getsockname()[1]
        self.kubeconfig = directory / "proxy.kubeconfig"
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "proxy", "cluster": {"server": f"http://127.0.0.1:{self.port}"}}],
            "users": [{"name": "proxy", "user": {}}],
            "contexts": [{"name": "proxy", "context": {"cluster": "proxy", "user": "proxy"}}],
            "current-context": "proxy"}))
        self._refusing: list[Match] = []
        self._in_flight: dict[asyncio.Task[Any], tuple[str, asyncio.BaseTransport]] = {}
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="kube-proxy")
        self._server: web.Server | None = None
        self._listener: asyncio.Server | None = None
        self._session: aiohttp.ClientSession | None = None

    # ------------------------------------------------------------------ test-side commands

    def __enter__(self) -> KubeProxy:
        self._thread.start()
        self._call(self._start())
        return self

    def __exit__(self, *exc: object) -> None:
        self._call(self._stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)

    def cut(self, match: Match | None = None) -> int:
        """Sever open connections: all of them (idle keep-alive ones too), or those carrying a
        request whose path and query match. Returns how many were severed."""
        return self._call(self._cut(match))

    @contextlib.contextmanager
    def partition(self, match: Match | None = None) -> Iterator[None]:
        """Sever matching connections and reset matching requests until the block ends."""
        always: Match = match or (lambda _: True)
        self._refusing.append(always)
        try:
            self.cut(match)
            yield
        finally:
            self._refusing.remove(always)

    def _call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    # ------------------------------------------------------------------ proxy loop

    async def _start(self) -> None:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(ssl=self._ssl, limit=0), auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None, connect=10))
        # Cancel a handler when its client goes: a severed watch ends upstream too.
        self._server = web.Server(self._handle, handler_cancellation=True, access_log=None)
        self._listener = await self._loop.create_server(self._server, sock=self._sock)

    async def _stop(self) -> None:
        assert self._server and self._listener and self._session
        self._listener.close()
        await self._cut(None)
        await self._server.shutdown(1)
        await self._session.close()

    async def _cut(self, match: Match | None) -> int:
        assert self._server is not None
        if match is None:
            transports = [t for t in self._server._connections.values() if t is not None]
        else:
            transports = [t for path, t in self._in_flight.values() if match(path)]
        for transport in set(transports):
            transport.abort()
        self.counts.cuts += 1
        self.counts.connections_cut += len(set(transports))
        return len(set(transports))

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        path = request.path_qs
        counts = self.counts
        counts.requests += 1
        body = await request.read()
        if any(refuse(path) for refuse in self._refusing):
            counts.refused += 1
            assert request.transport is not None
            request.transport.abort()
            raise asyncio.CancelledError  # nothing to answer on a reset connection
        if is_watch(path):
            counts.watches[resource_of(request.path)] += 1
        status_write = RUN_STATUS.match(request.path) if request.method in ("PATCH", "PUT") \
            else None
        if status_write:
            counts.status_writes += 1
            if self._rng.random() < self.conflict_rate:
                counts.conflicts_injected += 1
                return web.json_response(conflict_status(status_write.group(1)), status=409)
        task = asyncio.current_task()
        assert task is not None and request.transport is not None
        self._in_flight[task] = (path, request.transport)
        try:
            return await self._forward(request, body)
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError):
            # The API server is down or dropped the request: so does the proxy.
            request.transport.abort()
            raise asyncio.CancelledError from None
        finally:
            self._in_flight.pop(task, None)

    async def _forward(self, request: web.BaseRequest, body: bytes) -> web.StreamResponse:
        assert self._session is not None
        sent = {**{k: v for k, v in request.headers.items() if k.lower() not in _HOP_BY_HOP},
                **self._auth}
        async with self._session.request(request.method, self.upstream + request.path_qs,
                                         headers=sent, data=body or None,
                                         allow_redirects=False) as upstream:
            headers = CIMultiDict((k, v) for k, v in upstream.headers.items()
                                  if k.lower() not in _HOP_BY_HOP)
            if upstream.status == 409:  # a small Status object: read it to tell why
                payload = await upstream.read()
                reason = json.loads(payload).get("reason", "")
                self.counts.conflicts_from_server[
                    f"{request.method} {resource_of(request.path)} {reason}"] += 1
                return web.Response(status=409, body=payload, headers=headers)
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason,
                                          headers=headers)
            if upstream.content_length is not None:
                response.content_length = upstream.content_length
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response


def watches_of(*resources: str) -> Match:
    """Watch requests for these resources (plural names), e.g. `watches_of("jobs")`."""
    return lambda path: is_watch(path) and resource_of(path) in resources
