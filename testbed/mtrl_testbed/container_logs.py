"""The kubelet's container-log endpoint, served by the node agent: what `kubectl logs` (the
pods/log subresource) reaches through the API server, which connects to the node's address
(InternalIP) on its status.daemonEndpoints.kubeletEndpoint.Port and asks for

    GET /containerLogs/{podNamespace}/{podID}/{containerName}

(k8s.io/kubernetes pkg/kubelet/server/server.go: the route in InstallAuthRequiredHandlers,
the handler getContainerLogs, its 404 messages). Of PodLogOptions it honours follow,
tailLines, limitBytes and previous. Containers write straight to their `<container>.log`
with no time per line, so `timestamps=true` is refused rather than made up, and sinceSeconds
and sinceTime are not supported either.

Over HTTPS; a client must present a certificate of the cluster's CA (the API server's kubelet
client certificate), where a kubelet would also ask the API server to authorize the request.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

FOLLOW_POLL_SECONDS = 0.2
_TRUE, _FALSE = ("1", "t", "T", "TRUE", "true", "True"), ("0", "f", "F", "FALSE", "false", "False")


@dataclass
class ContainerLog:
    """One container's log file and the byte offset at which each of its starts began (the
    file is appended to across restarts); `running` says whether the newest start runs."""

    path: Path
    starts: list[int] = field(default_factory=list)
    running: Callable[[], bool] = lambda: False


# (namespace, pod name) -> the pod's containers by name, or None for a pod not on this node.
Lookup = Callable[[str, str], Mapping[str, ContainerLog] | None]


@dataclass(frozen=True)
class LogOptions:
    follow: bool = False
    previous: bool = False
    tail_lines: int | None = None
    limit_bytes: int | None = None

    @classmethod
    def parse(cls, query: Mapping[str, str]) -> LogOptions:
        """The query as the kubelet's parameter codec reads it (Go's strconv.ParseBool);
        ValueError for what it would refuse or what this endpoint cannot do."""
        if _flag(query, "timestamps"):
            raise ValueError("timestamps are not recorded by the mtrl node agent")
        if "sinceSeconds" in query or "sinceTime" in query:
            raise ValueError("sinceSeconds and sinceTime are not supported by the mtrl node agent")
        tail, limit = _number(query, "tailLines"), _number(query, "limitBytes")
        if limit is not None and limit < 1:
            raise ValueError("limitBytes must be greater than zero")
        return cls(_flag(query, "follow"), _flag(query, "previous"), tail, limit)


def _flag(query: Mapping[str, str], name: str) -> bool:
    value = query.get(name, "false")
    if value not in _TRUE + _FALSE:
        raise ValueError(f"{name}: {value!r} is not a boolean")
    return value in _TRUE


def _number(query: Mapping[str, str], name: str) -> int | None:
    if name not in query:
        return None
    try:
        value = int(query[name])
    except ValueError:
        raise ValueError(f"{name}: {query[name]!r} is not an integer") from None
    if value < 0:
        raise ValueError(f"{name} must be non-negative")
    return value


def _read(path: Path, start: int, end: int | None) -> bytes:
    with path.open("rb") as f:
        f.seek(start)
        return f.read() if end is None else f.read(max(0, end - start))


def tail(data: bytes, lines: int) -> bytes:
    """The last `lines` lines (an unfinished last line counts as one)."""
    return b"".join(data.splitlines(keepends=True)[-lines:]) if lines else b""


def _error(status: int, message: str) -> web.Response:
    return web.Response(status=status, text=message)


def handler(lookup: Lookup) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def container_logs(request: web.Request) -> web.StreamResponse:
        namespace, pod = request.match_info["namespace"], request.match_info["pod"]
        name = request.match_info["container"]
        containers = lookup(namespace, pod)
        if containers is None:
            return _error(404, f'pod "{pod}" does not exist')
        log = containers.get(name)
        if log is None:
            return _error(404, f'container "{name}" not found in pod "{pod}"')
        try:
            options = LogOptions.parse(request.query)
        except ValueError as exc:
            return _error(400, str(exc))
        if not log.starts:
            return _error(400, f'container "{name}" in pod "{pod}" is waiting to start')
        if options.previous and len(log.starts) < 2:
            return _error(400, f'previous terminated container "{name}" in pod "{pod}" not found')
        start, end = (log.starts[-2], log.starts[-1]) if options.previous else (log.starts[-1], None)
        follow = options.follow and not options.previous
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        budget = options.limit_bytes

        async def send(chunk: bytes) -> bool:
            """False once the byte limit is reached."""
            nonlocal budget
            if budget is not None:
                chunk, budget = chunk[:budget], budget - min(budget, len(chunk))
            if chunk:
                await response.write(chunk)
            return budget != 0

        with contextlib.suppress(ConnectionResetError):  # the client went away
            data = await asyncio.to_thread(_read, log.path, start, end)
            position = start + len(data)
            more = await send(data if options.tail_lines is None else tail(data, options.tail_lines))
            this_start = len(log.starts)
            while follow and more:
                # Asked before reading, so the read after the container ended is the last.
                running = log.running() and len(log.starts) == this_start
                data = await asyncio.to_thread(_read, log.path, position, None)
                position += len(data)
                more = await send(data)
                if not running:
                    break
                await asyncio.sleep(FOLLOW_POLL_SECONDS)
            await response.write_eof()
        return response

    return container_logs


def tls_context(cert: Path, key: Path, client_ca: Path) -> ssl.SSLContext:
    """Serving with `cert`; clients must present a certificate that `client_ca` signed."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(client_ca))
    context.load_cert_chain(str(cert), str(key))
    context.verify_mode = ssl.CERT_REQUIRED
    return context


async def serve(lookup: Lookup, host: str, port: int, tls: ssl.SSLContext) -> web.AppRunner:
    app = web.Application()
    app.router.add_get("/containerLogs/{namespace}/{pod}/{container}", handler(lookup))
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, ssl_context=tls).start()
    return runner
