"""A run's per-step history: the lines of metrics.jsonl (one trainer report per step, in
camelCase: `rewardMean`, `successRate`, ...; mtrl_trainer.progress) as (step, value) points."""

from __future__ import annotations

import json
import re
from typing import Any

Point = tuple[int, float]


def metric_key(name: str) -> str:
    """`reward_mean` or `rewardMean`: the report's key, `rewardMean`."""
    return re.sub(r"_([a-z])", lambda m: m[1].upper(), name)


def parse(text: str) -> list[dict[str, Any]]:
    """The reports of a metrics.jsonl; a line cut short by a concurrent rewrite is skipped."""
    rows = []
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(row, dict) and isinstance(row.get("step"), int):
            rows.append(row)
    return rows


def numeric_keys(rows: list[dict[str, Any]]) -> list[str]:
    return sorted({k for row in rows for k, v in row.items()
                   if isinstance(v, int | float) and not isinstance(v, bool) and k != "step"})


def series(rows: list[dict[str, Any]], metric: str) -> list[Point]:
    """(step, value) of each report that has the metric, in step order; a step reported twice
    (a resumed trainer) counts once, its latest report."""
    key = metric_key(metric)
    by_step = {row["step"]: row[key] for row in rows
               if isinstance(row.get(key), int | float) and not isinstance(row.get(key), bool)}
    return [(step, float(by_step[step])) for step in sorted(by_step)]
