"""metrics.jsonl as points: keys in either spelling, cut lines skipped, one point a step."""

from __future__ import annotations

import json

from mtrl_cli.metrics import metric_key, numeric_keys, parse, series


def test_snake_case_names_the_camel_case_key() -> None:
    assert metric_key("reward_mean") == "rewardMean"
    assert metric_key("rewardMean") == "rewardMean"
    assert metric_key("validation_success_rate") == "validationSuccessRate"


def test_series_is_in_step_order_with_the_latest_report_of_a_step() -> None:
    lines = [{"step": 2, "rewardMean": 0.5, "successRate": 0.25},
             {"step": 1, "rewardMean": 0.25, "successRate": None},
             {"step": 2, "rewardMean": 0.75, "outcome": "Succeeded"}]
    text = "\n".join(json.dumps(line) for line in lines) + '\n{"step": 3, "rewardMe'
    rows = parse(text)
    assert [r["step"] for r in rows] == [2, 1, 2]  # the cut last line is skipped
    assert series(rows, "reward_mean") == [(1, 0.25), (2, 0.75)]
    assert series(rows, "successRate") == [(2, 0.25)]
    assert numeric_keys(rows) == ["rewardMean", "successRate"]
