"""Free loopback ports and readiness polling for the local servers."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerExited(RuntimeError):
    """The process being waited for has exited; waiting longer cannot help."""


def wait_until(check: Callable[[], bool], timeout: float, what: str, interval: float = 0.1) -> None:
    """Poll `check` until it returns True; raise TimeoutError naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except ServerExited:
            raise
        except Exception as exc:  # a server that is still starting refuses or resets
            last_error = exc
        time.sleep(interval)
    raise TimeoutError(f"{what} not ready after {timeout:.0f}s (last error: {last_error!r})")
