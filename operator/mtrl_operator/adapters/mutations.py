"""Every call that changes something outside the operator passes through here, in two places:
the `mutating` decorator on the Kubernetes adapter's writes, and botocore's call events on
every AWS client (`guard_aws_client`). Reads never do.

Before a mutation: the leader fence. A replica that has not renewed its Lease within the
renew deadline may be replaced at any moment, so it exits instead of acting (client-go's
leader election ends the process the same way when leadership is lost).

After a mutation: the crash-consistency test's failpoint. `MTRL_CRASH_AFTER_STEP=k` exits
abruptly after the k-th mutation, `=text` after the first whose description contains `text`.
The test kills the operator after every step in turn and checks that none is done twice and
nothing leaks.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

log = logging.getLogger("mtrl.mutations")

P = ParamSpec("P")
R = TypeVar("R")
READ_ONLY_PREFIXES = ("Get", "List", "Describe", "Receive")

_fence: Callable[[], bool] | None = None
_crash_after: int | str | None = None
_count = 0


def fence(holding: Callable[[], bool] | None) -> None:
    """From now on, mutate only while `holding()` (None: always, no leader election)."""
    global _fence
    _fence = holding


def arm_failpoint(spec: str | None) -> None:
    global _crash_after, _count
    _crash_after = int(spec) if spec and spec.isdigit() else (spec or None)
    _count = 0


def before(what: str) -> None:
    if _fence is not None and not _fence():
        log.error("not the leader any more; exiting before %s", what)
        os._exit(1)


def after(what: str) -> None:
    global _count
    if _crash_after is None:
        return
    _count += 1
    hit = _count >= _crash_after if isinstance(_crash_after, int) else _crash_after in what
    if hit:
        log.error("failpoint: exiting after step %d (%s)", _count, what)
        os._exit(137)


def mutating(describe: str, step: bool = True) -> Callable[
        [Callable[P, Awaitable[R]]], Callable[P, Awaitable[R]]]:
    """Fence an async adapter method; count it as a failpoint step when `step`. `describe`
    is a format string over the method's parameters that names the mutation for the logs."""
    def wrap(method: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        signature = inspect.signature(method)

        @functools.wraps(method)
        async def guarded(*args: P.args, **kwargs: P.kwargs) -> R:
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            what = describe.format(**bound.arguments)
            before(what)
            result = await method(*args, **kwargs)
            if step:
                after(what)
            return result
        return guarded
    return wrap


def _mutating_operation(model: Any) -> bool:
    return not model.name.startswith(READ_ONLY_PREFIXES)


def _before_call(model: Any, **_: Any) -> None:
    if _mutating_operation(model):
        before(f"{model.service_model.service_name} {model.name}")


def _after_call(model: Any, http_response: Any, **_: Any) -> None:
    if _mutating_operation(model) and http_response.status_code < 300:
        after(f"{model.service_model.service_name} {model.name}")


def guard_aws_client(client: Any) -> None:
    """Fence and count every mutating call this botocore client makes (not the reads)."""
    client.meta.events.register("before-call", _before_call)
    client.meta.events.register("after-call", _after_call)
