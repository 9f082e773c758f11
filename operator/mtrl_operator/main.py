"""`mtrl operator`: run the operator (kopf) with metrics and a liveness endpoint."""

from __future__ import annotations

import asyncio
import logging

import kopf
from prometheus_client import start_http_server

from mtrl_operator import handlers, logs
from mtrl_operator.settings import Settings

log = logging.getLogger("mtrl.operator")


def main(argv: list[str] | None = None) -> int:
    settings = Settings.parse(argv)
    logs.configure(settings.log_format)
    handlers.configure(settings)
    if settings.metrics_port:
        start_http_server(settings.metrics_port)
    log.info("starting mtrl operator %s", settings)
    asyncio.run(kopf.operator(
        clusterwide=not settings.namespaces,
        namespaces=settings.namespaces,
        standalone=not settings.peering,
        peering_name=settings.peering or None,
        liveness_endpoint=f"http://0.0.0.0:{settings.health_port}/healthz"
        if settings.health_port else None,
    ))
    return 0
