"""Liveness and readiness for the kubelet: `GET /healthz` (the event loop answers and the
worker's loops are alive) and `GET /readyz` (queues set up and not draining)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web


class HealthServer:
    def __init__(
        self,
        port: int,
        host: str,
        alive: Callable[[], bool],
        ready: Callable[[], bool],
        stats: Callable[[], dict[str, Any]],
    ) -> None:
        self._port = port
        self._host = host
        self._alive = alive
        self._ready = ready
        self._stats = stats
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> None:
        app = web.Application()
        app.router.add_get("/healthz", self._probe(self._alive))
        app.router.add_get("/readyz", self._probe(self._ready))
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._host, self._port)  # the kubelet probes the pod IP
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    def _probe(self, check: Callable[[], bool]) -> Callable[[web.Request], Any]:
        async def handler(request: web.Request) -> web.Response:
            ok = check()
            body = {"status": "ok" if ok else "unavailable", **self._stats()}
            return web.json_response(body, status=200 if ok else 503)

        return handler

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
