"""DAPO's dynamic sampling: how many more groups a step plays, and what it trains on."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from mtrl_trainer.dataset import Tasks
from mtrl_trainer.loop import extra_groups

from .conftest import run_spec


@pytest.mark.parametrize(("informative", "complete", "wanted", "more"), [
    (4, 4, 4, 0),  # full: no extra round
    (6, 8, 4, 0),
    (2, 4, 4, 4),  # half were informative: twice the 2 missing
    (3, 4, 4, 2),  # ceil(1 * 4 / 3)
    (1, 8, 4, 4),  # capped at a step's worth
    (0, 4, 4, 4),  # nothing informative yet: a whole step's worth
])
def test_extra_groups(informative: int, complete: int, wanted: int, more: int) -> None:
    assert extra_groups(informative, complete, wanted) == more


def test_extra_rounds_draw_the_same_tasks_again_after_a_restart() -> None:
    tasks = Tasks([{"i": i} for i in range(10)], [])
    first = tasks.extra_for_step(3, 1, 4, seed=7)
    assert first == tasks.extra_for_step(3, 1, 4, seed=7)
    assert first != tasks.extra_for_step(3, 2, 4, seed=7)


@pytest.mark.slow
@pytest.mark.aws
def test_flat_groups_make_a_step_play_more_through_a_real_worker(training_run) -> None:
    """One-token completions score 0 or 1 and are mostly 0 at chance (1/102): most groups are
    flat, and each step plays extra rounds until it has promptsPerStep informative groups or
    its two extra rounds are spent. At chance every group of both steps can be flat: then the
    trainer rightly ends with "nothing trained" (exit 1), and the rounds are still checked."""
    spec = run_spec(training_run.bucket, maxSteps=2, groupSize=4, promptsPerStep=2,
                    maxNewTokens=1, dynamicSamplingRounds=2)
    spec["dataset"]["evalIntervalSteps"] = 0
    training_run.start_worker()
    trainer = training_run.start_trainer(spec)
    code = trainer.wait(300)
    metrics = training_run.metrics(spec)
    trained = sum(m["trainedGroups"] for m in metrics)
    if trained:
        assert code == 0, training_run.log("trainer")[-3000:]
    else:
        assert code == 1 and "nothing trained" in training_run.log("trainer"), \
            training_run.log("trainer")[-3000:]
    print([(m["samplingRounds"], m["sampledGroups"], m["trainedGroups"]) for m in metrics])
    assert any(m["samplingRounds"] > 1 for m in metrics), "no step played an extra round"
    for m in metrics:
        assert 1 <= m["samplingRounds"] <= 3 and 0 <= m["trainedGroups"] <= 2
        assert m["sampledGroups"] >= 2 + (m["samplingRounds"] - 1)  # each round plays some
        # rounds stop early only once the step has its informative groups
        assert m["samplingRounds"] == 3 or m["trainedGroups"] == 2 or m["sampledGroups"] == 2
