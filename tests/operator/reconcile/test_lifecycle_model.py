"""A stateful model check of the run's lifecycle: Hypothesis drives `decide` and a simulated
world through random interleavings of what users, trainers, workers, AWS and the operator
itself do, and checks the lifecycle's promises after every step.

The world is the simplest faithful one: ECS places tasks while Fargate has capacity and
answers a shortfall the way RunTask does; tasks stop on their own; trainer workloads go
Pending, Running, Succeeded or Failed, vanish (a HyperPodPyTorchJob's TTL), are evicted,
hang (no step while time passes), sit on a node without ever starting (an image that cannot
be pulled), exit 0 without reporting an outcome, or finish having trained nothing; the
trainer's report outlives its workload, so a resumed launch finds its predecessor's there;
the operator's pricing changes under a running run (a helm upgrade); AWS calls fail after
the status was written (the controller writes status before it acts); the operator restarts,
and rebuilds everything from the stored status and what it observes, as the real one does.

Invariants (each names the promise it keeps):
- no trainer before minReplicas workers are ready;
- teardown in cost order: the trainer, then the workers, then the queues, then the finalizer;
- nothing is ensured while the run is deleting, finished or suspended;
- a trainer that finished ends the run (Succeeded, unless the run was deleted first);
- Succeeded only for work done, on evidence: the current launch's own report of its outcome,
  every step played and at least one that trained (an exit code of 0, a report of an earlier
  launch of the same attempt, or a report that trained nothing is not evidence);
- a trainer pod bound to a node costs from that moment, running or not, and one that never
  starts is a failed attempt once startupTimeoutSeconds have passed;
- the price a run started with is the one it is metered at, whatever pricing says later;
- attempts that failed count only trainer failures: suspending, resuming and evictions never
  spend the backoff limit, and a suspension never fails a run;
- each phase transition is announced once (one Event per change), each worker problem once;
- a deleted run releases its finalizer with nothing left; a finished or suspended one holds
  no compute once it settles;
- a live run always says what it is doing (its message is never blank once started);
- never an orphan: workers run only in the cluster the spec names, so an edit of spec.workers
  the API server accepts (`workers_may_exist`, the CEL rule's mirror) never leaves a task
  unseen, and every task stops once the run is released, finished or suspended;
- re-asks never start extra tasks: fleets of more than 100 tasks are listed page by page
  (ECS answers 100 a page; `all_pages` is the adapter's own loop), and no more than
  maxReplicas tasks ever run;
- a sweeper touches only its own: two installs share the AWS account (the chart's default
  operator id in both, another cluster id), with an older operator's untagged leftovers; each
  sweeper (`plan_sweep`) deletes only what its own operator and cluster made for runs that
  are gone, and only after the minimum age.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass, replace

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from mtrl_api.run import (
    WORKERS_EDITABLE_WHILE_RUNNING,
    MultiTurnRLRunSpec,
    MultiTurnRLRunStatus,
    Phase,
    Progress,
    workers_may_exist,
)
from mtrl_operator.adapters.aws import all_pages
from mtrl_operator.reconcile.draft import EcsTask, Event, Placement, TrainerReport
from mtrl_operator.reconcile.run import (
    Act,
    Decision,
    Observed,
    TrainerObserved,
    TrainerState,
    decide,
)
from mtrl_operator.reconcile.sweep import Owner, Tagged, plan_sweep
from mtrl_rollout.queues import TAG_RUN_UID, resource_tags

T0 = dt.datetime(2026, 12, 1, 12, 0, tzinfo=dt.UTC)
PHASES = {p.value for p in Phase}
# Reasons a run may fail for, given what was injected.
FAILURE_REASONS = {"BackoffLimitExceeded", "TrainerFailed", "TrainerHung", "TrainerStartTimeout",
                   "WorkersUnavailable", "NothingTrained"}
# Model runs: CI runs the default; MTRL_MODEL_EXAMPLES=10000 is the longer local run.
EXAMPLES = int(os.environ.get("MTRL_MODEL_EXAMPLES", "1000"))
REACTIONS = st.integers(0, 3)  # reconciles after an event
ECS_PAGE = 100  # tasks ListTasks answers a page
OURS, THEIRS = Owner("default", "cluster-a"), Owner("default", "cluster-b")  # chart defaults
SWEEP_MIN_AGE_S = 600.0


@dataclass
class Task:
    arn: str
    cluster: str = "default"
    ready: bool = False
    stopped: bool = False
    by_operator: bool = False


@dataclass
class Workload:
    attempt: int
    launch: int  # the MTRL_LAUNCH it was created with, which its trainer echoes
    state: TrainerState = TrainerState.PENDING
    disrupted: bool = False
    deleting: bool = False  # asked to go; its pods take their grace period
    bound: bool = False  # its pod holds a node
    stuck: bool = False  # ... and cannot start its container (ImagePullBackOff)


def _spec(launcher: str, minimum: int, maximum: int, backoff: int, suspend: bool) -> MultiTurnRLRunSpec:
    return MultiTurnRLRunSpec.model_validate({
        "model": {"name": "m"}, "rollout": {"environment": "target"},
        "dataset": {"inline": {"train": [{"target": "a"}]}},
        "output": {"s3Uri": "s3://bucket/out"},
        "trainer": {"launcher": launcher},
        "workers": {"minReplicas": minimum, "maxReplicas": maximum,
                    "readyTimeoutSeconds": 600},
        "lifecycle": {"backoffLimit": backoff, "suspend": suspend,
                      "progressTimeoutSeconds": 1800, "startupTimeoutSeconds": 1200},
    })


class Lifecycle(RuleBasedStateMachine):
    """One run, its world, and the operator reconciling it."""

    @initialize(launcher=st.sampled_from(["Job", "HyperPodPyTorchJob"]),
                minimum=st.integers(0, 2), extra=st.integers(0, 2),
                backoff=st.integers(0, 2), capacity=st.one_of(st.none(), st.integers(0, 4)),
                fleet=st.sampled_from([0, 0, 0, 101, 150]))
    def create(self, launcher: str, minimum: int, extra: int, backoff: int,
               capacity: int | None, fleet: int) -> None:
        """`fleet`: now and then a run of more than a page of workers."""
        self.spec = _spec(launcher, minimum, fleet or max(minimum, 1) + extra, backoff, False)
        self.status = MultiTurnRLRunStatus()
        self.now = T0
        self.deleting = False
        self.released = False
        self.queues = False
        self.definition = False
        self.tasks: list[Task] = []
        self.capacity = capacity  # tasks Fargate can still place (None: no limit)
        self.workloads: dict[int, Workload] = {}
        self.step = 0
        self.report: TrainerReport | None = None  # the progress ConfigMap: outlives workloads
        self.trained = 0  # steps whose update trained, over every launch (in the checkpoint)
        self.price: float | None = 98.32  # the operator's pricing now
        self.price_at_start: float | None = None
        self.failures_injected = 0  # trainer failures the world produced (hangs included)
        self.hung: set[int] = set()  # attempts that hung
        self.stuck_counted: set[int] = set()  # launches that never started, counted
        self.nothing_trained = False  # a trainer reported success with no trained step
        self.trainer_finished = False
        self.next_arn = 0
        self.last: Decision | None = None
        self.last_failed_attempts = 0
        # The shared AWS account, beside this run's own queues and tasks: an orphan of ours
        # (a run deleted while the operator was away), the other install's resources (its run
        # alive), and an older operator's, tagged without a cluster id.
        self.account: dict[str, dict[str, str]] = {
            "arn:ours-orphan": resource_tags("gone", "team-a", "x", "queue", "default",
                                             OURS.cluster_id),
            "arn:theirs-live": resource_tags("theirs", "team-a", "run", "queue", "default",
                                             THEIRS.cluster_id),
            "arn:theirs-orphan": resource_tags("theirs-gone", "team-a", "y", "queue",
                                               "default", THEIRS.cluster_id),
            "arn:older-operator": resource_tags("older", "team-a", "z", "queue", "default")}
        self.sightings: dict[Owner, dict[str, float]] = {OURS: {}, THEIRS: {}}
        self.swept: dict[Owner, list[str]] = {OURS: [], THEIRS: []}

    # ------------------------------------------------------------------ observing

    def _list_tasks(self, nextToken: str | None = None) -> dict[str, object]:
        """ECS ListTasks in the spec's cluster (the only one the operator looks in), a page of
        at most 100 at a time."""
        listed = [t for t in self.tasks if t.cluster == self._cluster()]
        start = int(nextToken or 0)
        page: dict[str, object] = {"taskArns": [t.arn for t in listed[start:start + ECS_PAGE]]}
        if start + ECS_PAGE < len(listed):
            page["nextToken"] = str(start + ECS_PAGE)
        return page

    def _cluster(self) -> str:
        return self.spec.workers.ecs.cluster or "default"

    def _seen_tasks(self) -> list[Task]:
        by_arn = {t.arn: t for t in self.tasks}
        return [by_arn[arn] for arn in all_pages(self._list_tasks, "taskArns", "nextToken",
                                                 "nextToken")]

    def observe(self, placement: Placement | None = None) -> Observed:
        current = self.workloads.get(self.status.attempts)
        trainer = None
        if current is not None:
            trainer = TrainerObserved(
                current.attempt, current.state, disrupted="Evicted" if current.disrupted else "",
                bound=current.bound, waiting="pod t-0 cannot start its container "
                "(ImagePullBackOff): Back-off pulling image" if current.stuck else "")
        seen = self._seen_tasks()
        live = [t for t in seen if not t.stopped]
        return Observed(
            now=self.now, generation=1, deleting=self.deleting, spec=self.spec,
            spec_error=None, status=self.status, queues_ready=self.queues,
            queues_exist=self.queues, workers_exist=bool(live) or self.definition,
            workers_desired=len(live), workers_ready=sum(t.ready for t in live),
            trainer=trainer, trainers_exist=bool(self.workloads),
            trainer_workloads=tuple(("Job", f"t{a}") for a in self.workloads),
            progress=Progress(step=self.step) if self.report else None,
            namespace="team-a", name="run", uid="uid", report=self.report, price=self.price,
            workers_stopped=sum(t.stopped and not t.by_operator for t in seen),
            placement=placement,
            ecs_tasks=tuple(EcsTask(t.arn, "STOPPED" if t.stopped else "RUNNING",
                                    "STOPPED" if t.stopped else "RUNNING") for t in seen))

    # ------------------------------------------------------------------ the operator

    @precondition(lambda self: not self.released)
    @rule(actions_fail=st.booleans())
    def reconcile(self, actions_fail: bool) -> None:
        """One reconcile: decide, write status, act (unless AWS fails the actions), and, when
        RunTask was called, decide again knowing its answer (as the controller does)."""
        self._count_a_hang()
        self._count_a_stuck_start()
        obs = self.observe()
        d = decide(obs)
        self._check(obs, d)
        self.status = d.status
        if actions_fail:
            return
        placement = self._act(d)
        if placement is not None:  # as the controller does: from the status just written
            again = replace(obs, status=d.status, placement=placement)
            d2 = decide(again)
            self._check(again, d2)
            self._announced_once(d.events + d2.events)
            self.status = d2.status

    def _count_a_hang(self) -> None:
        """A running trainer with no step for progressTimeoutSeconds (from the newest of its
        last step and its start, as the status records them) is a failure, once."""
        current = self._current()
        marks = [t for t in (self.status.progress.last_step_time,
                             self.status.trainer_running_time) if t]
        if current and current.state == TrainerState.RUNNING and marks and \
                current.attempt not in self.hung and \
                (self.now - max(marks)).total_seconds() >= \
                self.spec.lifecycle.progress_timeout_seconds:
            self.hung.add(current.attempt)
            self.failures_injected += 1

    def _count_a_stuck_start(self) -> None:
        """A trainer pod bound to a node that never starts is a failure once
        startupTimeoutSeconds have passed since the operator saw it bound, once a launch."""
        current, since = self._current(), self.status.trainer_bound_time
        if current and current.stuck and current.state == TrainerState.PENDING and since and \
                current.launch not in self.stuck_counted and \
                (self.now - since).total_seconds() >= \
                self.spec.lifecycle.startup_timeout_seconds:
            self.stuck_counted.add(current.launch)
            self.failures_injected += 1

    def _act(self, d: Decision) -> Placement | None:
        placement = None
        for act in d.actions:
            if act == Act.ENSURE_QUEUES:
                self.queues = True
            elif act == Act.ENSURE_WORKERS:
                self.definition = True
                # As RunActions: what is missing from what the observation listed.
                missing = self.spec.workers.max_replicas - sum(not t.stopped
                                                               for t in self._seen_tasks())
                placed = max(0, missing if self.capacity is None else min(missing, self.capacity))
                if self.capacity is not None:
                    self.capacity -= placed
                for _ in range(placed):
                    self.next_arn += 1
                    self.tasks.append(Task(f"arn:task/{self.next_arn}", self._cluster()))
                assert sum(not t.stopped for t in self.tasks) <= self.spec.workers.max_replicas, \
                    "more tasks than maxReplicas: a re-ask started extra ones"
                placement = Placement(missing, placed, ("Capacity is unavailable",) *
                                      (missing - placed))
            elif act == Act.ENSURE_TRAINER:
                assert d.attempt not in self.workloads, "a workload of this attempt exists"
                self.workloads[d.attempt] = Workload(d.attempt, d.status.trainer_launch)
            elif act == Act.DELETE_TRAINER:
                for workload in self.workloads.values():
                    workload.deleting = True
            elif act == Act.DELETE_WORKERS:
                for t in self._seen_tasks():  # the spec's cluster: RunActions stops those
                    if not t.stopped:
                        t.stopped = t.by_operator = True
                self.definition = False
            elif act == Act.DELETE_QUEUES:
                self.queues = False
            elif act in (Act.REMOVE_FINALIZER, Act.DELETE_RUN):
                assert not (self.workloads or self.queues or any(not t.stopped
                                                                 for t in self.tasks)), \
                    "released with something left"
                self.released = True
        return placement

    def _check(self, obs: Observed, d: Decision) -> None:
        acts, before, after = set(d.actions), obs.status, d.status
        ensure = {Act.ENSURE_QUEUES, Act.ENSURE_WORKERS, Act.ENSURE_TRAINER}
        # No trainer before minReplicas workers.
        if Act.ENSURE_TRAINER in acts:
            assert obs.workers_ready >= self.spec.workers.min_replicas, "trainer before workers"
            assert not obs.trainers_exist, "one attempt at a time"
        # Teardown in cost order.
        if Act.DELETE_WORKERS in acts:
            assert not obs.trainers_exist, "workers deleted before the trainer"
        if Act.DELETE_QUEUES in acts:
            assert not obs.trainers_exist and not obs.workers_exist, "queues too early"
        if Act.REMOVE_FINALIZER in acts:
            assert obs.deleting and not (obs.trainers_exist or obs.workers_exist or
                                         obs.queues_exist)
        # Nothing ensured while deleting, finished or suspended.
        if obs.deleting or after.phase.finished or self.spec.lifecycle.suspend:
            assert not acts & ensure, (after.phase, d.actions)
        # A trainer that finished ends the run.
        if self.trainer_finished and not obs.deleting and not before.phase.finished \
                and not self.spec.lifecycle.suspend and before.phase != Phase.SUSPENDING \
                and obs.trainer is not None and obs.trainer.state == TrainerState.SUCCEEDED:
            assert after.phase == Phase.SUCCEEDED, (after.phase, after.message)
        # Succeeded only for work done, on the current launch's own evidence.
        if after.phase == Phase.SUCCEEDED:
            assert self.trainer_finished, "Succeeded without a finished trainer"
        if after.phase == Phase.SUCCEEDED and not before.phase.finished:
            r = obs.report
            assert r is not None and r.launch == before.trainer_launch and \
                r.outcome == "Succeeded" and r.step >= self.spec.grpo.max_steps and \
                (r.trained_steps or 0) >= 1, f"Succeeded without evidence: {r}"
        # A trainer pod that holds a node costs, running or not.
        if obs.trainer is not None and (obs.trainer.bound or obs.trainer.state in (
                TrainerState.RUNNING, TrainerState.RESTARTING)) and not obs.deleting \
                and not before.phase.finished and obs.trainer.attempt == after.attempts:
            assert after.cost.running_since is not None, "a bound trainer pod costs nothing"
        # The price a run started with is its price to the end.
        if before.start_time is None and after.start_time is not None:
            self.price_at_start = obs.price
        if after.start_time is not None and self.price_at_start is not None:
            assert after.cost.price == self.price_at_start, (after.cost.price,
                                                             self.price_at_start)
        if after.phase == Phase.FAILED and not before.phase.finished:
            reason = next(c.reason for c in after.conditions if c.type == "Failed")
            assert reason in FAILURE_REASONS, reason
            if reason == "NothingTrained":
                assert self.nothing_trained, "NothingTrained without a trainer that said so"
            elif reason != "WorkersUnavailable":
                assert self.failures_injected, f"{reason} without a trainer failure"
        # Only failures count.
        assert after.failed_attempts <= self.failures_injected, (after.failed_attempts,
                                                                 self.failures_injected)
        # Each phase transition announced once, each worker problem once.
        for event in d.events:
            if event.reason in PHASES:
                assert before.phase.value != event.reason, f"{event.reason} announced again"
        problems = [e for e in d.events if e.reason in ("CapacityUnavailable", "TaskStopped")]
        assert len(problems) <= 1
        if problems:
            assert before.workers.problem is None or \
                before.workers.problem.message != problems[0].message
        # A live run says what it does.
        if after.start_time is not None and not obs.deleting:
            assert after.message, (after.phase, d.actions)

    @staticmethod
    def _announced_once(events: list[Event]) -> None:
        """What one reconcile publishes (both decisions when RunTask was called) names each
        transition and each worker problem once."""
        said = [(e.reason, e.message) for e in events]
        assert len(said) == len(set(said)), f"announced twice in one reconcile: {said}"

    def _react(self, reconciles: int) -> None:
        """The operator reacts to an event (a watch, a resync) with some reconciles, some of
        whose actions AWS refuses."""
        for i in range(reconciles):
            if not self.released:
                self.reconcile(actions_fail=i == 1 and self.next_arn % 3 == 0)

    @precondition(lambda self: not self.released)
    @rule()
    def operator_restarts(self) -> None:
        """Nothing in memory survives: the next reconcile rebuilds from status and world
        alone (the model keeps nothing else, so a restart is this plus a reconcile)."""
        self.reconcile(actions_fail=False)

    # ------------------------------------------------------------------ users

    @precondition(lambda self: not self.deleting)
    @rule(then=REACTIONS)
    def suspend(self, then: int) -> None:
        self.spec = self.spec.model_copy(update={"lifecycle": self.spec.lifecycle.model_copy(
            update={"suspend": True})})
        self._react(then)

    @precondition(lambda self: self.spec.lifecycle.suspend)
    @rule(then=REACTIONS)
    def resume(self, then: int) -> None:
        self.spec = self.spec.model_copy(update={"lifecycle": self.spec.lifecycle.model_copy(
            update={"suspend": False})})
        self._react(then)

    @rule(chance=st.integers(0, 3), then=REACTIONS)
    def delete(self, chance: int, then: int) -> None:
        """Rarer than the rest, so that runs live long enough to go wrong in many ways."""
        self.deleting = self.deleting or chance == 0
        self._react(then)

    @precondition(lambda self: not self.deleting)
    @rule(field=st.sampled_from(["max_replicas", "min_replicas", "ready_timeout_seconds",
                                 "image", "cluster"]),
          value=st.integers(1, 4), then=REACTIONS)
    def edit_workers(self, field: str, value: int, then: int) -> None:
        """A user edits spec.workers; the API server refuses what the CEL rule refuses (any
        field but minReplicas and readyTimeoutSeconds while workers may exist). Moving the
        tasks to another ECS cluster mid-run left the old ones running, unseen, for good."""
        if workers_may_exist(self.status) and field not in WORKERS_EDITABLE_WHILE_RUNNING:
            self._react(then)
            return
        workers = self.spec.workers
        if field == "cluster":
            ecs = workers.ecs.model_copy(update={"cluster": f"cluster-{value}"})
            workers = workers.model_copy(update={"ecs": ecs})
        elif field == "image":
            workers = workers.model_copy(update={"image": f"worker:{value}"})
        elif field == "min_replicas":
            workers = workers.model_copy(update={"min_replicas": min(value,
                                                                     workers.max_replicas)})
        elif field == "max_replicas":
            workers = workers.model_copy(update={"max_replicas": max(value,
                                                                     workers.min_replicas)})
        else:
            workers = workers.model_copy(update={"ready_timeout_seconds": 300 * value})
        self.spec = self.spec.model_copy(update={"workers": workers})
        self._react(then)

    # ------------------------------------------------------------------ the shared account

    def _tagged(self) -> list[Tagged]:
        """What the tagging API lists: the account's resources and this run's queues and
        tasks (all of them, in every cluster), tagged as the operator tags them."""
        ours = resource_tags("uid", "team-a", "run", "worker-task", "default", OURS.cluster_id)
        run = [(f"arn:queue/{role}", ours) for role in ("rollout", "dlq") if self.queues]
        run += [(t.arn, ours) for t in self.tasks if not t.stopped]
        return [*self.account.items(), *run]

    @rule(theirs=st.booleans(), seconds=st.sampled_from([0, 300, 700]))
    def a_sweeper_sweeps(self, theirs: bool, seconds: int) -> None:
        """One install's sweeper passes over the shared account: its runs are what its API
        server lists (ours: this run until it is released; theirs: their live run)."""
        owner = THEIRS if theirs else OURS
        known = {"theirs"} if theirs else (set() if self.released else {"uid"})
        clock = (self.now - T0).total_seconds() + seconds
        plan = plan_sweep(self._tagged(), owner=owner, uid_tag=TAG_RUN_UID, known=known,
                          watches=lambda namespace: True, first_seen=self.sightings[owner],
                          now=clock, min_age=SWEEP_MIN_AGE_S)
        for arn, tags in plan.delete:
            assert owner.made(tags) and tags[TAG_RUN_UID] not in known, \
                f"{owner} swept {arn}, not its own orphan"
            assert clock - self.sightings[owner].get(arn, clock) >= SWEEP_MIN_AGE_S, \
                f"{owner} swept {arn} younger than the minimum age"
            assert not arn.startswith(("arn:queue/", "arn:task/")) or self.released, \
                f"{owner} swept a resource of a live run: {arn}"
            self.account.pop(arn, None)
            self.swept[owner].append(arn)
        self.sightings[owner] = plan.first_seen

    # ------------------------------------------------------------------ trainers

    def _current(self) -> Workload | None:
        return self.workloads.get(self.status.attempts)

    @precondition(lambda self: any(w.deleting for w in self.workloads.values()))
    @rule(then=REACTIONS)
    def deletions_finish(self, then: int) -> None:
        """A deleted workload's pods finish their grace period, and it is gone."""
        self.workloads = {a: w for a, w in self.workloads.items() if not w.deleting}
        self._react(then)

    @precondition(lambda self: (w := self._current()) and w.state == TrainerState.PENDING)
    @rule(then=REACTIONS)
    def trainer_runs(self, then: int) -> None:
        workload = self.workloads[self.status.attempts]
        workload.state, workload.bound, workload.stuck = TrainerState.RUNNING, True, False
        self._react(then)

    @precondition(lambda self: (w := self._current()) and w.state == TrainerState.PENDING
                  and not w.bound)
    @rule(then=REACTIONS)
    def trainer_pod_is_bound_and_cannot_start(self, then: int) -> None:
        """Its pod holds a P5 node, and its image cannot be pulled: it never starts."""
        workload = self.workloads[self.status.attempts]
        workload.bound = workload.stuck = True
        self._react(then)

    def _report(self, workload: Workload, outcome: str | None = None) -> None:
        total = self.spec.grpo.max_steps
        self.report = TrainerReport(launch=workload.launch, attempt=workload.attempt,
                                    outcome=outcome, step=total if outcome else self.step,
                                    total_steps=total, trained_steps=self.trained)

    @precondition(lambda self: (w := self._current()) and w.state == TrainerState.RUNNING)
    @rule(trains=st.booleans(), then=REACTIONS)
    def trainer_reports_a_step(self, trains: bool, then: int) -> None:
        self.step += 1
        self.trained += trains
        self._report(self.workloads[self.status.attempts])
        self._react(then)

    @precondition(lambda self: (w := self._current()) and w.state == TrainerState.RUNNING)
    @rule(then=REACTIONS)
    def trainer_succeeds(self, then: int) -> None:
        """A trainer that finishes after its run ended (one stopped as hung that completes in
        its grace period) does not reopen the run: an ended run stays ended. It reports its
        outcome (with at least one trained step), then its workload completes."""
        workload = self.workloads[self.status.attempts]
        self.trained = max(self.trained, 1)
        self._report(workload, "Succeeded")
        workload.state = TrainerState.SUCCEEDED
        self.trainer_finished = self.trainer_finished or not self.status.phase.finished
        self._react(then)

    @precondition(lambda self: (w := self._current()) and w.state == TrainerState.RUNNING)
    @rule(then=REACTIONS)
    def trainer_exits_0_without_an_outcome(self, then: int) -> None:
        """A broken trainer (or a command that is not one) exits 0 without reporting success:
        its workload completes; that is a failed attempt, never a Succeeded run."""
        self.workloads[self.status.attempts].state = TrainerState.SUCCEEDED
        self.failures_injected += 1
        self._react(then)

    @precondition(lambda self: (w := self._current()) and w.state == TrainerState.RUNNING
                  and self.trained == 0)
    @rule(then=REACTIONS)
    def trainer_finishes_having_trained_nothing(self, then: int) -> None:
        """Every step's groups scored alike: an outcome with no trained step (a trainer that
        says so instead exits with its words, which the readings test covers)."""
        workload = self.workloads[self.status.attempts]
        self._report(workload, "Succeeded")
        workload.state = TrainerState.SUCCEEDED
        self.nothing_trained = self.nothing_trained or not self.status.phase.finished
        self._react(then)

    @precondition(lambda self: hasattr(self, "price"))
    @rule(price=st.sampled_from([None, 50.0, 98.32, 120.0]), then=REACTIONS)
    def pricing_changes(self, price: float | None, then: int) -> None:
        """A helm upgrade changes the operator's pricing under a running run."""
        self.price = price
        self._react(then)

    @precondition(lambda self: (w := self._current()) and w.state in (TrainerState.PENDING,
                                                                     TrainerState.RUNNING))
    @rule(then=REACTIONS)
    def trainer_fails(self, then: int) -> None:
        self.workloads[self.status.attempts].state = TrainerState.FAILED
        self.failures_injected += 1
        self._react(then)

    @precondition(lambda self: (w := self._current()) and w.state == TrainerState.RUNNING)
    @rule(then=REACTIONS)
    def trainer_is_evicted(self, then: int) -> None:
        workload = self.workloads[self.status.attempts]
        workload.state, workload.disrupted = TrainerState.FAILED, True
        self._react(then)

    @precondition(lambda self: self._current() is not None and not self.trainer_finished)
    @rule(then=REACTIONS)
    def trainer_vanishes(self, then: int) -> None:
        """Deleted from outside before its outcome was seen: counted as a failed attempt."""
        del self.workloads[self.status.attempts]
        self.failures_injected += 1
        self._react(then)

    @rule(seconds=st.sampled_from([1, 30, 700, 2000]), then=REACTIONS)
    def time_passes(self, seconds: int, then: int) -> None:
        """Long enough, a running trainer without a step is hung."""
        self.now += dt.timedelta(seconds=seconds)
        self._react(then)

    # ------------------------------------------------------------------ workers

    @precondition(lambda self: any(not t.stopped and not t.ready for t in self.tasks))
    @rule(then=REACTIONS)
    def tasks_become_ready(self, then: int) -> None:
        for t in self.tasks:
            t.ready = not t.stopped
        self._react(then)

    @precondition(lambda self: any(not t.stopped for t in self.tasks))
    @rule(index=st.integers(0, 3), then=REACTIONS)
    def a_task_stops(self, index: int, then: int) -> None:
        live = [t for t in self.tasks if not t.stopped]
        live[index % len(live)].stopped = True
        self._react(then)

    @rule(capacity=st.one_of(st.none(), st.integers(0, 3)), then=REACTIONS)
    def capacity_changes(self, capacity: int | None, then: int) -> None:
        self.capacity = capacity
        self._react(then)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def released_means_nothing_left(self) -> None:
        if getattr(self, "released", False):
            assert not self.workloads and not self.queues
            assert all(t.stopped for t in self.tasks), "a task left running: an orphan"

    @invariant()
    def a_sweeper_touches_only_its_own(self) -> None:
        if not hasattr(self, "swept"):
            return
        assert set(self.swept[OURS]) <= {"arn:ours-orphan"}, self.swept[OURS]
        assert set(self.swept[THEIRS]) <= {"arn:theirs-orphan"}, self.swept[THEIRS]

    @invariant()
    def suspension_never_fails_a_run_nor_spends_attempts(self) -> None:
        if not hasattr(self, "status"):
            return
        if self.failures_injected == 0:
            assert self.status.failed_attempts == 0
            if self.status.phase == Phase.FAILED:
                reason = next(c.reason for c in self.status.conditions if c.type == "Failed")
                assert reason == "WorkersUnavailable" or (
                    reason == "NothingTrained" and self.nothing_trained), reason

    def teardown(self) -> None:
        """Left alone (no more events, time moving on), the run settles: deleted runs are
        released with nothing left; finished or suspended ones hold no compute; a live one
        waits for something it names."""
        if not hasattr(self, "status") or self.released:
            return
        for _ in range(40):
            if self.released:
                break
            self.reconcile(actions_fail=False)
            self.workloads = {a: w for a, w in self.workloads.items() if not w.deleting}
            self.now += dt.timedelta(seconds=30)
        if self.deleting:
            assert self.released, "a deleted run releases its finalizer"
            return
        if self.trainer_finished and not self.spec.lifecycle.suspend:
            assert self.status.phase == Phase.SUCCEEDED, "a finished trainer ends the run"
        elif self.status.phase.finished or self.status.phase == Phase.SUSPENDED:
            assert not self.workloads and all(t.stopped for t in self.tasks), \
                "a finished or suspended run holds no compute"
        else:
            assert self.status.message, "a live run says what it waits for"


Lifecycle.TestCase.settings = settings(
    max_examples=EXAMPLES, stateful_step_count=40, deadline=None, derandomize=True,
    report_multiple_bugs=False, suppress_health_check=[HealthCheck.too_slow])
TestLifecycle = Lifecycle.TestCase
