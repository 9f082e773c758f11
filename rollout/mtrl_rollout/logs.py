"""Logging for the processes the operator starts (the trainer and the workers).

One line format, and the HTTP clients' one-line-per-request chatter (`httpx2: HTTP Request:
PATCH .../configmaps/<run>-progress ... 200 OK`, several per step) kept at DEBUG, so that
`mtrl logs` and `kubectl logs` show what the process itself says.
"""

from __future__ import annotations

import logging
import sys

from mtrl_api import CLIENT_LOGGERS

# HyperPod's log monitoring reads the trainer's step lines in this format (builders/trainer.py,
# STEP_LOG_PATTERN).
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure(level: str) -> None:
    """Log at `level` to stderr; HTTP clients log their requests only when `level` is DEBUG."""
    logging.basicConfig(level=level.upper(), stream=sys.stderr, format=FORMAT)
    clients = logging.DEBUG if level.upper() == "DEBUG" else logging.WARNING
    for name in CLIENT_LOGGERS:
        logging.getLogger(name).setLevel(clients)
