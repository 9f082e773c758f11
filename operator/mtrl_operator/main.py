"""`mtrl operator`: run the operator (kopf) with metrics, a health endpoint and, unless turned
off, leader election.

With leader election, a replica stands by until it holds the Lease and only then starts kopf,
so nothing it does (kopf's handlers, the controllers' own watches, work queues, sweepers and
trigger consumers, all started in kopf's startup handler) runs on a standby. Every mutation is
fenced on the Lease (`adapters/mutations.py`), and a leader that loses it exits at once, as
client-go's and controller-runtime's managers do; its restart stands by.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys

import kopf
from aiohttp import web
from kopf._core.engines.peering import Identity  # kopf.operator's type, not re-exported

from mtrl_operator import handlers, logs, metrics
from mtrl_operator.adapters import mutations
from mtrl_operator.adapters.kube import FIELD_MANAGER, check_config
from mtrl_operator.adapters.lease import KubeLease
from mtrl_operator.errors import FatalConfig
from mtrl_operator.leader import ElectionThread, LeaderElector
from mtrl_operator.settings import Settings

log = logging.getLogger("mtrl.operator")


def main(argv: list[str] | None = None) -> int:
    settings = Settings.parse(argv)
    logs.configure(settings.log_format)
    try:
        check_config()
    except FatalConfig as exc:
        return _fatal(str(exc))
    handlers.configure(settings)
    if settings.metrics_port:
        metrics.serve(settings.metrics_port)
    log.info("starting mtrl operator %s", settings)
    return asyncio.run(serve(settings))


def _election(settings: Settings) -> ElectionThread:
    namespace, name = settings.lease
    identity = settings.new_identity()

    def elector() -> LeaderElector:  # on the election thread: the client belongs to its loop
        store = KubeLease.connect(name, namespace, FIELD_MANAGER)
        return LeaderElector(store, identity, lease_duration=settings.lease_duration_seconds,
                             renew_deadline=settings.renew_deadline_seconds,
                             retry_period=settings.retry_period_seconds)

    def lost() -> None:
        log.error("leadership lost; exiting so that no two replicas act at once")
        sys.stderr.flush()
        os._exit(1)

    def fatal(line: str) -> None:
        _fatal(line)
        sys.stderr.flush()
        os._exit(FATAL_EXIT_CODE)

    return ElectionThread(elector, lost, fatal)


FATAL_EXIT_CODE = 2


def _fatal(line: str) -> int:
    """One line naming what cannot work, in the log and on stderr; the exit code."""
    log.critical("%s", line)
    print(f"mtrl operator: {line}", file=sys.stderr)
    return FATAL_EXIT_CODE


async def _health_server(port: int, elector: ElectionThread | None) -> web.AppRunner:
    """/healthz (liveness) answers 200 while the event loop and the election run, leader or
    standby; /readyz (readiness) only while the API server answers the election too, so a
    replica that cannot reach it shows as not ready. A standby that can reach the API server
    is ready (controller-runtime's convention), so a rollout never waits on the election."""
    def body(ok: bool) -> web.Response:
        return web.json_response({
            "status": "ok" if ok else "unavailable",
            "leader": elector.holding() if elector else True,
            "lease_holder": elector.leader if elector else None,
            "error": elector.error if elector else None}, status=200 if ok else 503)

    async def healthz(_: web.Request) -> web.Response:
        return body(elector.alive() if elector else True)

    async def readyz(_: web.Request) -> web.Response:
        return body(elector.ready() if elector else True)

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "0.0.0.0", port).start()
    return runner


async def _stand_by(elector: ElectionThread) -> bool:
    """Wait for the Lease; False when SIGTERM or SIGINT came first."""
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopped.set)
    acquire = asyncio.create_task(elector.acquire())
    stop = asyncio.create_task(stopped.wait())
    try:
        await asyncio.wait({acquire, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):  # kopf installs its own from here on
            loop.remove_signal_handler(sig)
        for task in (acquire, stop):
            task.cancel()
    return not stopped.is_set()


async def serve(settings: Settings) -> int:
    elector = _election(settings) if settings.leader_elect else None
    health = await _health_server(settings.health_port, elector) if settings.health_port else None
    try:
        if elector is not None:
            if not await _stand_by(elector):
                return 0
            mutations.fence(elector.holding)
            metrics.LEADER.set(1)
        # A lost Lease ends the process from the election thread, whatever kopf is doing.
        clusterwide, namespaces = settings.kopf_scope
        # An identity of our own: kopf's default asks the OS for the user's name, and the image's
        # uid 65532 has no passwd entry (KeyError: 'getpwuid(): uid not found'; seen under a
        # real kubelet, docs/kubelet.md). Peering is off (standalone); kopf only logs it.
        await kopf.operator(clusterwide=clusterwide, namespaces=namespaces, standalone=True,
                            identity=Identity(settings.new_identity()))
        if elector is not None:
            await elector.release()
            metrics.LEADER.set(0)
        return 0
    finally:
        if health is not None:
            await health.cleanup()
