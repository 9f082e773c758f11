"""Test bed only: a pod's Python process behaves as if it had its own network namespace.

The node agent runs pods as local processes that share the machine's network, and gives each
its own loopback address as its pod IP (MTRL_POD_IP). In a real pod, a server bound to the
wildcard address (0.0.0.0) listens only on that pod's interfaces, so two replicas of one
Deployment both bind :8080. Here the wildcard would be the whole machine's, and the second
replica would fail with "address already in use". The node agent puts this directory first on
each pod's PYTHONPATH, so Python imports this module at start-up and a wildcard bind becomes a
bind to the pod's own IP.
"""

from __future__ import annotations

import os
import socket

_POD_IP = os.environ.get("MTRL_POD_IP")
_WILDCARDS = ("", "0.0.0.0")


if _POD_IP:
    _bind = socket.socket.bind

    def _bind_in_pod(self: socket.socket, address: object) -> None:
        if self.family == socket.AF_INET and isinstance(address, tuple) \
                and address[0] in _WILDCARDS:
            address = (_POD_IP, *address[1:])
        _bind(self, address)  # type: ignore[arg-type]

    socket.socket.bind = _bind_in_pod  # type: ignore[method-assign]
