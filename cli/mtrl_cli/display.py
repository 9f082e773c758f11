"""A run's status in words and numbers for people: ages as kubectl writes them, step, reward
and success rate, messages cut to fit."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def parse_time(text: str | None) -> datetime | None:
    if not text:
        return None
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def age(since: datetime | None, now: datetime) -> str:
    """kubectl's short durations (apimachinery's HumanDuration): 45s, 3m12s, 36m, 5h20m, 2d3h."""
    if since is None:
        return "<unknown>"
    seconds = max(0, int((now - since).total_seconds()))
    minutes, hours, days = seconds // 60, seconds // 3600, seconds // 86400
    if seconds < 120:
        return f"{seconds}s"
    if minutes < 10:
        return f"{minutes}m{seconds % 60}s" if seconds % 60 else f"{minutes}m"
    if hours < 3:
        return f"{minutes}m"
    if hours < 8:
        return f"{hours}h{minutes % 60}m" if minutes % 60 else f"{hours}h"
    if hours < 48:
        return f"{hours}h"
    if days < 8:
        return f"{days}d{hours % 24}h" if hours % 24 else f"{days}d"
    return f"{days}d"


def cut(text: str, width: int) -> str:
    """One line of at most `width` characters; a cut one ends in an ellipsis."""
    line = " ".join(text.split())
    return line if len(line) <= width else line[:max(0, width - 1)] + "…"


def status(run: dict[str, Any]) -> dict[str, Any]:
    return run.get("status") or {}


def progress(run: dict[str, Any]) -> dict[str, Any]:
    return status(run).get("progress") or {}


def phase(run: dict[str, Any]) -> str:
    return str(status(run).get("phase") or "Pending")


def step(run: dict[str, Any]) -> str:
    p = progress(run)
    total = p.get("totalSteps") or ((run.get("spec") or {}).get("grpo") or {}).get("maxSteps")
    return f"{p.get('step') or 0}/{total}" if total else str(p.get("step") or 0)


def number(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def percent(value: Any) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def created(run: dict[str, Any]) -> datetime | None:
    return parse_time(run["metadata"].get("creationTimestamp"))


def now() -> datetime:
    return datetime.now(UTC)
