"""Free loopback ports and readiness polling for the local servers."""

from __future__ import annotations

import itertools
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

LOWEST_PORT = 10000


def _ports_below_the_ephemeral_range() -> Iterator[int]:
    """Ports the kernel never picks by itself, in an order that starts at random (so two test
    processes rarely try the same ones): below `ip_local_port_range`, from which it takes
    every bind(0) and every outgoing connection's source port."""
    try:
        ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768  # Linux's default
    high = max(ephemeral, LOWEST_PORT + 1000)
    start = random.randrange(LOWEST_PORT, high)
    return itertools.chain(range(start, high), range(LOWEST_PORT, start))


_candidates = _ports_below_the_ephemeral_range()
_lock = threading.Lock()


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now and that this process has not
    handed out before. A port from bind(0) is free only until the next bind(0) or outgoing
    connection, which the kernel may give the same port; under load, a server started a moment
    later then failed with "Address already in use"."""
    with _lock:
        for port in _candidates:
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
            return port
    raise RuntimeError(f"no free port left between {LOWEST_PORT} and the ephemeral range")


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
