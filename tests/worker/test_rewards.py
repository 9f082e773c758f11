import pytest
from hypothesis import given
from hypothesis import strategies as st

from mtrl_worker.rewards import RewardComponent, Score, compose, resolve_weights

COMPONENTS = (
    RewardComponent("win", 1.0, 0.0, 1.0, "outcome", ""),
    RewardComponent("bad", 0.5, -1.0, 0.0, "penalty", ""),
)


def test_weighted_sum_is_mapped_onto_the_requested_range() -> None:
    weights = resolve_weights(COMPONENTS, {})
    top, entries = compose(Score({"win": 1.0, "bad": 0.0}, {"turns": 3}), COMPONENTS, weights, (-1.0, 1.0))
    bottom, _ = compose(Score({"win": 0.0, "bad": -1.0}), COMPONENTS, weights, (-1.0, 1.0))
    assert (top, bottom) == (1.0, -1.0)
    assert [(e.name, e.type) for e in entries] == [("win", "Reward"), ("bad", "Reward"), ("turns", "Metric")]


def test_weights_are_overridable_but_unknown_names_fail_fast() -> None:
    assert resolve_weights(COMPONENTS, {"bad": 2})["bad"] == 2.0
    with pytest.raises(ValueError, match="unknown reward components"):
        resolve_weights(COMPONENTS, {"typo": 1})


@pytest.mark.parametrize(
    "components", [{"win": 1.0}, {"win": 2.0, "bad": 0.0}, {"win": 1.0, "bad": 0.0, "x": 1.0}]
)
def test_scores_must_match_the_declaration(components: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        compose(Score(components), COMPONENTS, resolve_weights(COMPONENTS, {}), (0.0, 1.0))


unit = st.floats(0.0, 1.0)


@given(a=st.tuples(unit, unit), b=st.tuples(unit, unit), lo=st.floats(-5, 5), width=st.floats(0.1, 10))
def test_the_mapping_preserves_order(a, b, lo, width) -> None:
    weights = resolve_weights(COMPONENTS, {})

    def aggregate(x: tuple[float, float]) -> float:
        score = Score({"win": x[0], "bad": -x[1]})
        return compose(score, COMPONENTS, weights, (lo, lo + width))[0]

    raw_a, raw_b = a[0] - 0.5 * a[1], b[0] - 0.5 * b[1]
    if raw_a > raw_b + 1e-9:
        assert aggregate(a) > aggregate(b)
    assert lo - 1e-9 <= aggregate(a) <= lo + width + 1e-9
