"""What a run's trainer costs: node-time held, priced per instance type. Pure.

The meter counts while the trainer's pods hold nodes: from the moment one is bound to a node,
whether its container runs or is stuck pulling its image (a node is billed either way), until
none is; closed intervals accumulate
in `nodeSeconds`, the open one starts at `runningSince`, so the total at any moment is exact
however rarely the run is reconciled. The totals (`gpuHours`, `usd`, `display`) move every
second; they are written with the rest of the status (`steady`), and on their own only when
the shown figure is stale and was last written a while ago (`refresh_due`): a trainer that
hangs in its rendezvous changes nothing else, and must not show $0.00 while it costs.
"""

from __future__ import annotations

import datetime as dt

from mtrl_api.run import Cost, MultiTurnRLRunSpec, MultiTurnRLRunStatus


def held_seconds(cost: Cost, nodes: int, now: dt.datetime) -> float:
    """Node-seconds held so far, the open interval included."""
    running = (now - cost.running_since).total_seconds() if cost.running_since else 0.0
    return cost.node_seconds + nodes * max(running, 0.0)


def metered(cost: Cost, spec: MultiTurnRLRunSpec, holding: bool, price: float | None,
            now: dt.datetime) -> Cost:
    """The meter after observing whether the trainer holds nodes now."""
    nodes = spec.trainer.nodes
    out = cost.model_copy()
    if holding and out.running_since is None:
        out.running_since = now
    elif not holding and out.running_since is not None:
        out.node_seconds, out.running_since = held_seconds(cost, nodes, now), None
    held = held_seconds(out, nodes, now)
    out.gpu_hours = round(held * spec.trainer.gpus_per_node / 3600, 4)
    out.usd = round(held / 3600 * price, 2) if price is not None else None
    out.display = f"${out.usd:,.2f}" if out.usd is not None else f"{out.gpu_hours:.1f} GPU-h"
    return out


def budget(cost: Cost, spec: MultiTurnRLRunSpec, price: float | None,
           now: dt.datetime) -> tuple[str | None, float | None]:
    """(why the run must end, or None; seconds until the budget is spent while the trainer
    runs, or None) for spec.lifecycle.maxCostUSD."""
    limit = spec.lifecycle.max_cost_usd
    if limit is None or price is None:
        return None, None
    nodes = spec.trainer.nodes
    spent = held_seconds(cost, nodes, now) / 3600 * price
    if spent >= limit:
        return (f"the trainer's estimated cost ${spent:,.2f} reached spec.lifecycle.maxCostUSD "
                f"${limit:,.2f} ({nodes} x {spec.trainer.instance_type} at ${price:,.2f}/h)"), None
    if cost.running_since is None:
        return None, None
    return None, (limit - spent) * 3600 / (price * nodes)


def steady(status: MultiTurnRLRunStatus) -> MultiTurnRLRunStatus:
    """The status without the meter's moving totals: what decides whether to write it."""
    out = status.model_copy()
    out.cost = status.cost.model_copy(update={"gpu_hours": 0.0, "usd": None, "display": ""})
    return out


def refresh_due(shown: Cost, current: Cost, since_write: float | None, every: float) -> bool:
    """Whether the meter alone is worth a status write: the shown figure is out of date and
    the run's status was last written `every` seconds ago or more (or never by us)."""
    return shown.display != current.display and (since_write is None or since_write >= every)
