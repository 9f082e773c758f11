"""Structured JSON logs: one object per line, with the run's namespace/name when known."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

from mtrl_api import CLIENT_LOGGERS


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        run = getattr(record, "run", None)
        ref = getattr(record, "k8s_ref", None)  # kopf's per-object loggers carry this
        if run:
            out["run"] = run
        elif isinstance(ref, dict) and ref.get("name"):
            out["run"] = f"{ref.get('namespace', '')}/{ref['name']}"
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


def configure(fmt: str, level: int = logging.INFO) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter() if fmt == "json" else
                         logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # kopf.objects says "Handler 'run_event' succeeded." for every watch event of every run:
    # most of the log at scale, and none of it news. Its warnings and errors still show.
    for noisy in (*CLIENT_LOGGERS, "kopf.objects"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
