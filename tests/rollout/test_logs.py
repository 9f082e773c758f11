"""The processes the operator starts log what they say, not every HTTP request they make."""

from __future__ import annotations

import subprocess
import sys

import pytest

# One real request through the HTTP client lightkube uses (as the trainer's progress patches
# do), to a server on loopback, then one line of the process's own.
PROGRAM = """
import http.server, logging, sys, threading
import httpx2
from mtrl_rollout import logs
logs.configure(sys.argv[1])
server = http.server.HTTPServer(("127.0.0.1", 0), http.server.SimpleHTTPRequestHandler)
threading.Thread(target=server.serve_forever, daemon=True).start()
httpx2.get(f"http://127.0.0.1:{server.server_port}/")
logging.getLogger("mtrl_trainer").info("step 1 done")
server.shutdown()
"""


def _stderr(level: str) -> str:
    done = subprocess.run([sys.executable, "-c", PROGRAM, level], capture_output=True, text=True,
                          timeout=60, check=True)
    return done.stderr


@pytest.mark.parametrize("level", ["INFO", "info"])
def test_http_requests_stay_out_of_an_info_log(level: str) -> None:
    err = _stderr(level)
    assert "step 1 done" in err
    assert "HTTP Request" not in err


def test_a_debug_log_shows_them() -> None:
    assert "HTTP Request: GET" in _stderr("DEBUG")
