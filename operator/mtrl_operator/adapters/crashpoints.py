"""A test hook: exit abruptly after the k-th mutating call (MTRL_CRASH_AFTER_STEP=k).

The crash-consistency test sets k = 1, 2, 3, ... in turn, restarts the operator each time and
checks that no step is done twice and nothing leaks.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("mtrl.crashpoint")
_limit: int | None = None
_count = 0


def arm(limit: int | None) -> None:
    global _limit, _count
    _limit, _count = limit, 0


def step(what: str) -> None:
    """Call after each mutating call has succeeded."""
    global _count
    if _limit is None:
        return
    _count += 1
    if _count >= _limit:
        log.error("crashpoint: exiting after step %d (%s)", _count, what)
        os._exit(137)
