"""Properties of `decide` over generated observations (hypothesis), beside the examples in
test_reconcile.py: what must hold whatever the world looks like.

- Nothing is ensured while the run is being deleted, is finished, or is suspended.
- Teardown goes in cost order: the trainer, then the workers, then the queues; the finalizer
  only once nothing is left.
- The GPU trainer is created only once queues are ready and enough workers are, and each
  launch of it gets a new number.
- A run becomes Succeeded only on the current launch's own report of success: its outcome,
  every step played and at least one that trained.
- The same observation always gives the same decision.
- Applying the decisions to a simulated world converges: a deleted run releases its finalizer,
  a finished or suspended one holds no compute, and a live one stops asking for anything,
  each within a few reconciles.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from mtrl_api.run import LauncherKind, MultiTurnRLRunSpec, MultiTurnRLRunStatus, Phase
from mtrl_operator.reconcile.draft import TrainerReport
from mtrl_operator.reconcile.run import Act, Decision, Observed, TrainerObserved, TrainerState, decide

NOW = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
ENSURE = {Act.ENSURE_QUEUES, Act.ENSURE_WORKERS, Act.ENSURE_TRAINER}


def _spec(suspend: bool, backoff: int, deadline: int | None, ttl: int | None,
          launcher: LauncherKind, min_workers: int) -> MultiTurnRLRunSpec:
    return MultiTurnRLRunSpec.model_validate({
        "model": {"name": "m"}, "rollout": {"environment": "wordle"},
        "dataset": {"inline": {"train": [{"secret": "crane"}]}},
        "output": {"s3Uri": "s3://bucket/out"},
        "trainer": {"launcher": launcher.value},
        "workers": {"minReplicas": min_workers, "maxReplicas": 3},
        "lifecycle": {"suspend": suspend, "backoffLimit": backoff,
                      "activeDeadlineSeconds": deadline, "ttlSecondsAfterFinished": ttl},
    })


specs = st.builds(_spec, st.booleans(), st.integers(0, 3),
                  st.one_of(st.none(), st.integers(1, 7200)),
                  st.one_of(st.none(), st.integers(0, 600)),
                  st.sampled_from(list(LauncherKind)), st.integers(1, 3))


@st.composite
def statuses(draw: st.DrawFn) -> MultiTurnRLRunStatus:
    phase = draw(st.sampled_from(list(Phase)))
    started = phase != Phase.PENDING or draw(st.booleans())
    attempts = draw(st.integers(1, 4)) if started else 0
    return MultiTurnRLRunStatus(
        phase=phase, attempts=attempts,
        start_time=NOW - dt.timedelta(seconds=draw(st.integers(0, 9000))) if started else None,
        completion_time=NOW - dt.timedelta(seconds=draw(st.integers(0, 900)))
        if phase.finished else None,
        launched_attempt=draw(st.integers(0, attempts)),
        observed_attempt=draw(st.integers(0, attempts)),
        trainer_launch=draw(st.integers(0, attempts + 2)))


reports = st.one_of(st.none(), st.builds(
    TrainerReport, launch=st.one_of(st.none(), st.integers(0, 6)),
    attempt=st.one_of(st.none(), st.integers(1, 4)),
    outcome=st.sampled_from([None, "Succeeded"]), step=st.integers(0, 200),
    total_steps=st.just(100), trained_steps=st.one_of(st.none(), st.integers(0, 3))))


@st.composite
def observations(draw: st.DrawFn) -> Observed:
    spec = draw(st.one_of(specs, st.none()))
    status = draw(statuses())
    queues_exist = draw(st.booleans())
    workers_exist = draw(st.booleans())
    trainer = draw(st.one_of(st.none(), st.builds(
        TrainerObserved, st.integers(1, 4), st.sampled_from(list(TrainerState)))))
    # As the controller observes: a spec that cannot be read always comes with its error.
    error = ("InvalidSpec", "spec.x: bad") if spec is None else draw(
        st.one_of(st.none(), st.just(("NoSubnets", "backend ecs-fargate needs subnets"))))
    return Observed(
        now=NOW, generation=draw(st.integers(1, 5)), deleting=draw(st.booleans()),
        spec=spec, spec_error=error,
        status=status, queues_exist=queues_exist,
        queues_ready=queues_exist and draw(st.booleans()),
        workers_exist=workers_exist,
        workers_desired=draw(st.integers(0, 3)) if workers_exist else 0,
        workers_ready=draw(st.integers(0, 3)) if workers_exist else 0,
        trainer=trainer, trainers_exist=trainer is not None or draw(st.booleans()),
        namespace=draw(st.sampled_from(["team-a", "kubeflow", "hyperpod-ns-a"])),
        report=draw(reports))


def _proven(obs: Observed) -> bool:
    """The current launch's own report of success: the outcome, every step, a trained one."""
    r, spec = obs.report, obs.spec
    return (r is not None and spec is not None and bool(obs.status.trainer_launch)
            and r.launch == obs.status.trainer_launch and r.outcome == "Succeeded"
            and r.step >= spec.grpo.max_steps and (r.trained_steps or 0) >= 1)


def _teardown_in_cost_order(obs: Observed, d: Decision) -> bool:
    acts = set(d.actions)
    if Act.DELETE_WORKERS in acts and obs.trainers_exist:
        return False
    if Act.DELETE_QUEUES in acts and (obs.trainers_exist or obs.workers_exist):
        return False
    return Act.REMOVE_FINALIZER not in acts or not (
        obs.trainers_exist or obs.workers_exist or obs.queues_exist)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(observations())
def test_invariants_hold_for_any_observation(obs: Observed) -> None:
    d = decide(obs)
    acts = set(d.actions)
    if obs.deleting:
        assert not acts & ENSURE, d.actions
        assert d.status.phase == Phase.TERMINATING
    if obs.status.phase.finished or obs.spec is None:
        assert not acts & ENSURE, d.actions
    if d.status.phase.finished:
        assert not acts & ENSURE, d.actions
    if obs.spec is not None and obs.spec.lifecycle.suspend:
        assert not acts & ENSURE, d.actions
    assert _teardown_in_cost_order(obs, d)
    if Act.ENSURE_TRAINER in acts:
        assert obs.spec is not None and obs.queues_ready
        assert obs.workers_ready >= obs.spec.workers.min_replicas
        assert not obs.trainers_exist, "one attempt at a time"
        assert d.attempt == d.status.attempts == d.status.launched_attempt
    if Act.REMOVE_FINALIZER in acts:
        assert obs.deleting
    if d.status.phase == Phase.SUCCEEDED and obs.status.phase != Phase.SUCCEEDED:
        assert _proven(obs), "Succeeded only on the current launch's own evidence"
    assert d.status.trainer_launch >= obs.status.trainer_launch
    if d.status.launched_attempt > obs.status.launched_attempt:
        assert d.status.trainer_launch == obs.status.trainer_launch + 1, "a new launch number"
    if d.requeue_after is not None:
        assert d.requeue_after >= 0


@settings(max_examples=200, deadline=None, derandomize=True)
@given(observations())
def test_the_same_observation_gives_the_same_decision(obs: Observed) -> None:
    first, second = decide(obs), decide(obs)
    assert first.actions == second.actions and first.attempt == second.attempt
    assert first.status == second.status and first.events == second.events
    assert first.requeue_after == second.requeue_after


@dataclass
class World:
    """What the actions do to the cloud and the cluster, in the simplest faithful way: an
    ensured thing exists (workers ready, a trainer running), a deleted thing is gone."""

    obs: Observed
    released: bool = False

    def apply(self, d: Decision) -> None:
        o = replace(self.obs, status=d.status)
        for act in d.actions:
            if act == Act.ENSURE_QUEUES:
                o = replace(o, queues_exist=True, queues_ready=True)
            elif act == Act.ENSURE_WORKERS:
                assert o.spec is not None
                n = o.spec.workers.max_replicas
                o = replace(o, workers_exist=True, workers_desired=n, workers_ready=n)
            elif act == Act.ENSURE_TRAINER:
                o = replace(o, trainers_exist=True,
                            trainer=TrainerObserved(d.attempt, TrainerState.RUNNING))
            elif act == Act.DELETE_TRAINER:
                o = replace(o, trainers_exist=False, trainer=None)
            elif act == Act.DELETE_WORKERS:
                o = replace(o, workers_exist=False, workers_desired=0, workers_ready=0)
            elif act == Act.DELETE_QUEUES:
                o = replace(o, queues_exist=False, queues_ready=False)
            elif act in (Act.REMOVE_FINALIZER, Act.DELETE_RUN):
                self.released = True
        self.obs = o


def _run(obs: Observed, steps: int = 12) -> tuple[World, Decision]:
    """Reconcile until the finalizer is released or two reconciles in a row ask for nothing
    (a decision without actions may still move the status on, e.g. to Failed)."""
    world, idle = World(obs), 0
    d = decide(obs)
    for _ in range(steps):
        world.apply(d)
        idle = 0 if d.actions else idle + 1
        if world.released or idle == 2:
            break
        d = decide(world.obs)
    return world, d


@settings(max_examples=300, deadline=None, derandomize=True)
@given(observations())
def test_applying_the_decisions_converges(obs: Observed) -> None:
    world, last = _run(obs)
    if obs.deleting:
        assert world.released, "a deleted run releases its finalizer"
        assert not (world.obs.trainers_exist or world.obs.workers_exist or
                    world.obs.queues_exist)
        return
    assert world.released or not last.actions, f"still acting: {last.actions}"
    final = decide(world.obs)
    if world.released:
        return
    assert not final.actions, "a settled world asks for nothing more"
    if final.status.phase.finished or (obs.spec and obs.spec.lifecycle.suspend):
        assert not (world.obs.trainers_exist or world.obs.workers_exist), "compute is gone"
