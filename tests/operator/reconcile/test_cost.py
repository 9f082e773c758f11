"""The cost meter and the budget as pure functions, and through `decide`."""

from __future__ import annotations

import datetime as dt
from dataclasses import replace

import pytest

from mtrl_api.run import Cost, MultiTurnRLRunSpec, Phase
from mtrl_operator.reconcile.cost import budget, metered, steady
from mtrl_operator.reconcile.run import Act, TrainerObserved, TrainerState, decide
from mtrl_operator.settings import Settings
from tests.operator.reconcile.test_run import NOW, SPEC, ready

TWO_NODES = SPEC.model_copy(update={"trainer": SPEC.trainer.model_copy(update={"nodes": 2})})
PRICE = 98.32  # per node-hour


def at(minutes: float) -> dt.datetime:
    return NOW + dt.timedelta(minutes=minutes)


def test_the_meter_counts_node_time_while_the_trainer_holds_nodes_and_only_then() -> None:
    cost = metered(Cost(), TWO_NODES, holding=False, price=PRICE, now=at(0))
    assert cost.running_since is None and cost.usd == 0.0
    cost = metered(cost, TWO_NODES, holding=True, price=PRICE, now=at(0))
    cost = metered(cost, TWO_NODES, holding=True, price=PRICE, now=at(30))  # looked at once
    assert cost.running_since == at(0)
    assert cost.gpu_hours == pytest.approx(2 * 8 * 0.5) and cost.usd == pytest.approx(98.32)
    cost = metered(cost, TWO_NODES, holding=False, price=PRICE, now=at(60))  # stopped: closed
    assert cost.running_since is None and cost.node_seconds == pytest.approx(2 * 3600)
    cost = metered(cost, TWO_NODES, holding=False, price=PRICE, now=at(600))  # idle: no charge
    assert cost.usd == pytest.approx(196.64) and cost.display == "$196.64"
    cost = metered(cost, TWO_NODES, holding=True, price=PRICE, now=at(600))  # a second attempt
    cost = metered(cost, TWO_NODES, holding=True, price=PRICE, now=at(630))
    assert cost.usd == pytest.approx(294.96)


def test_without_a_price_the_meter_shows_gpu_hours() -> None:
    cost = metered(Cost(running_since=at(0)), SPEC, holding=True, price=None, now=at(90))
    assert cost.usd is None and cost.display == "12.0 GPU-h"


def test_the_budget_ends_the_run_when_spent_and_says_when_it_will_be() -> None:
    capped = TWO_NODES.model_copy(update={"lifecycle": TWO_NODES.lifecycle.model_copy(
        update={"max_cost_usd": 100.0}), "trainer": TWO_NODES.trainer})
    running = Cost(running_since=at(0))
    over, left = budget(running, capped, PRICE, at(15))
    # $100 at 2 x $98.32/h lasts 30.5 minutes; 15 are gone.
    assert over is None and left == pytest.approx(100 / (2 * PRICE) * 3600 - 15 * 60)
    over, left = budget(running, capped, PRICE, at(31))
    assert over == ("the trainer's estimated cost $101.60 reached spec.lifecycle.maxCostUSD "
                    "$100.00 (2 x ml.p5.48xlarge at $98.32/h)") and left is None
    assert budget(Cost(node_seconds=60), capped, PRICE, at(31)) == (None, None)  # not running
    assert budget(running, capped, None, at(31)) == (None, None)  # no price: preflight's job


def test_decide_fails_a_run_over_budget_and_takes_the_gpus_first() -> None:
    capped = MultiTurnRLRunSpec.model_validate({**SPEC.model_dump(by_alias=True),
                                                "lifecycle": {"maxCostUSD": 50.0,
                                                                  "progressTimeoutSeconds": 0}})
    trainer = TrainerObserved(1, TrainerState.RUNNING)
    d = decide(ready(spec=capped, trainer=trainer, trainers_exist=True, price=PRICE))
    assert d.status.phase == Phase.RUNNING
    # Requeued for the moment the budget runs out: 50 / 98.32 h.
    assert d.requeue_after == pytest.approx(50 / PRICE * 3600)
    later = ready(spec=capped, trainer=trainer, trainers_exist=True, price=PRICE, now=at(31),
                  status=d.status)
    d = decide(later)
    assert d.status.phase == Phase.FAILED
    assert next(c.reason for c in d.status.conditions if c.type == "Failed") == "BudgetExceeded"
    assert d.actions == [Act.DELETE_TRAINER]
    # The GPUs are held until the trainer is gone; then the meter stops.
    gone = decide(replace(later, status=d.status, trainer=None, trainers_exist=False,
                          now=at(32)))
    assert gone.status.cost.running_since is None
    assert gone.status.cost.usd == pytest.approx(PRICE * 32 / 60, abs=0.01)


def test_the_meter_alone_never_writes_status() -> None:
    moved = Cost(running_since=at(0), gpu_hours=3.0, usd=10.0, display="$10.00")
    status = ready().status
    assert steady(status.model_copy(update={"cost": moved})) == \
        steady(status.model_copy(update={"cost": Cost(running_since=at(0))}))


def test_operator_prices_parse_or_stop_the_operator() -> None:
    settings = Settings(instance_prices="ml.p5.48xlarge=98.32, ml.g5.xlarge=1.408")
    assert settings.price("ml.p5.48xlarge") == 98.32 and settings.price("ml.p4d.24xlarge") is None
    for bad in ("ml.p5.48xlarge", "ml.p5.48xlarge=cheap", "=3", "x=-1"):
        with pytest.raises(ValueError, match="MTRL_INSTANCE_PRICES"):
            Settings(instance_prices=bad)
