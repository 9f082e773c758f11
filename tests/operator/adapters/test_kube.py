"""The Kubernetes adapter's pure parts."""

from __future__ import annotations

from mtrl_operator.adapters.kube import merge_patch


def _apply(target: dict, patch: dict) -> dict:
    """RFC 7386, as the API server applies a merge patch."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _apply(out[key], value)
        else:
            out[key] = value
    return out


def test_a_field_that_went_away_is_removed_by_the_patch() -> None:
    old = {"phase": "Succeeded", "resources": {"queues": [{"role": "dlq"}], "trainerName": "r-t1",
                                                 "taskDefinitionArn": "arn:td"}}
    new = {"phase": "Succeeded", "resources": {"queues": []}}
    patch = merge_patch(old, new)
    assert patch == {"resources": {"queues": [], "trainerName": None, "taskDefinitionArn": None}}
    assert _apply(old, patch) == new


def test_the_patch_carries_only_what_changed_and_turns_old_into_new() -> None:
    old = {"a": 1, "b": {"c": [1, 2], "d": "x"}, "gone": {"deep": 1}}
    new = {"a": 1, "b": {"c": [1, 2, 3], "d": "x", "e": {"f": 2}}, "added": 0}
    patch = merge_patch(old, new)
    assert patch == {"gone": None, "b": {"c": [1, 2, 3], "e": {"f": 2}}, "added": 0}
    assert _apply(old, patch) == new
    assert merge_patch(new, new) == {}
