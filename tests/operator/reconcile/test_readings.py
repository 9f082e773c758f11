"""Pure readings of observed objects: the trainer workload's state (through its launcher), the
trainer's own report,
and the spec checks the schema cannot express."""

from __future__ import annotations

import json
from typing import Any

import pytest

from mtrl_api.environments import known
from mtrl_api.run import GeneratedDataset, MultiTurnRLRunSpec, WorkerBackend
from mtrl_operator.launchers import observe as trainer_state
from mtrl_operator.launchers.conditions import newest_true_condition
from mtrl_operator.reconcile.draft import TrainerReport
from mtrl_operator.reconcile.readings import (
    queue_hold,
    spec_problem,
    trainer_report,
    with_cause,
    with_pods,
)
from mtrl_operator.reconcile.run import TrainerObserved, TrainerState
from mtrl_operator.settings import Settings


def job(*conditions: tuple[str, str, str | None]) -> dict[str, Any]:
    """(type, status, lastTransitionTime) in list order."""
    return {"status": {"conditions": [
        {"type": t, "status": s, **({"lastTransitionTime": at} if at else {}),
         "message": f"{t} message"} for t, s, at in conditions]}}


@pytest.mark.parametrize("kind", ["PyTorchJob", "HyperPodPyTorchJob"])
def test_a_stale_failed_does_not_outrank_a_newer_running(kind: str) -> None:
    """HyperPod recovered from a fault: its Failed stays True in the list, below a newer
    Running. The newest condition rules, as AWS's own launcher reads it."""
    recovered = job(("Created", "True", "2026-11-30T10:00:00Z"),
                    ("Failed", "True", "2026-11-30T10:05:00Z"),
                    ("Running", "True", "2026-11-30T10:07:00Z"))
    assert trainer_state(kind, recovered, 1).state == TrainerState.RUNNING
    # Order in the list does not matter, time does.
    shuffled = {"status": {"conditions": list(reversed(recovered["status"]["conditions"]))}}
    assert trainer_state(kind, shuffled, 1).state == TrainerState.RUNNING
    failed_later = job(("Running", "True", "2026-11-30T10:07:00Z"),
                       ("Failed", "True", "2026-11-30T10:09:00Z"))
    observed = trainer_state(kind, failed_later, 1)
    assert observed.state == TrainerState.FAILED and observed.message == "Failed message"


def test_ties_go_to_the_later_in_the_list_and_timeless_ones_sort_first() -> None:
    tie = job(("Running", "True", "2026-11-30T10:00:00Z"),
              ("Completed", "True", "2026-11-30T10:00:00Z"))
    assert newest_true_condition(tie)["type"] == "Completed"
    untimed = job(("Completed", "True", None), ("Running", "True", "2026-11-30T10:00:00Z"))
    assert newest_true_condition(untimed)["type"] == "Running"
    assert newest_true_condition(job(("Running", "False", "2026-11-30T10:00:00Z"))) is None


def test_created_or_unknown_newest_conditions_are_pending() -> None:
    assert trainer_state("HyperPodPyTorchJob", job(("Created", "True", "2026-11-30T10:00:00Z")),
                         1).state == TrainerState.PENDING
    assert trainer_state("HyperPodPyTorchJob", job(("Running", "True", "2026-11-30T10:00:00Z"),
                                                   ("Fault", "True", "2026-11-30T10:01:00Z")),
                         1).state == TrainerState.PENDING
    assert trainer_state("PyTorchJob", {}, 1).state == TrainerState.PENDING


def configmap(body: Any) -> dict[str, Any]:
    return {"data": {"progress.json": body if isinstance(body, str) else json.dumps(body)}}


def test_trainer_report_reads_launch_attempt_outcome_and_steps_and_ignores_junk() -> None:
    report = trainer_report(configmap({"step": 20, "totalSteps": 20, "trainedSteps": 17,
                                       "attempt": 2, "launch": 3, "outcome": "Succeeded"}))
    assert report == TrainerReport(launch=3, attempt=2, outcome="Succeeded", step=20,
                                   total_steps=20, trained_steps=17)
    assert trainer_report(configmap({"step": 3})) == TrainerReport(step=3)
    assert trainer_report(configmap("{half")) is None
    assert trainer_report(configmap([1])) is None
    assert trainer_report(configmap({"attempt": True, "outcome": 1, "launch": "3",
                                     "trainedSteps": -1})) == TrainerReport()
    assert trainer_report({}) is None


TASKS = {"wordle": {"secret": "crane"}, "coding": {"task_id": "median"},
         "target": {"target": "a"}}


def spec(environment: str, *components: str, image: str | None = None) -> MultiTurnRLRunSpec:
    workers: dict[str, Any] = {"backend": "kubernetes"}
    if image:
        workers["image"] = image
    return MultiTurnRLRunSpec.model_validate({
        "model": {"name": "m"}, "rollout": {"environment": environment},
        "dataset": {"inline": {"train": [TASKS.get(environment, {"secret": "crane"})]}},
        "output": {"s3Uri": "s3://bucket/out"},
        "workers": workers, "reward": {"components": [{"name": c} for c in components]}})


def test_unknown_reward_components_fail_the_run_listing_the_known_ones() -> None:
    settings = Settings()
    problem = spec_problem(spec("wordle", "win", "solved", "guesses_left"), settings)
    assert problem is not None
    reason, message = problem
    assert reason == "UnknownRewardComponent"
    assert "'win', 'guesses_left'" in message
    assert message.endswith("(it has: solved, speed, made_valid_guess, letter_progress, "
                            "invalid_guesses, repeated_guesses)")
    # A custom image that plays a known environment runs this distribution's plug-in.
    assert spec_problem(spec("wordle", "win", image="example.com/w:1"), settings)[0] == \
        "UnknownRewardComponent"
    assert spec_problem(spec("wordle", "solved", "invalid_guesses"), settings) is None
    # An environment only a custom image has: its components are its own business.
    assert spec_problem(spec("chess", "mate", image="example.com/w:1"), settings) is None
    assert known("chess") is None


def test_unknown_environment_arguments_fail_the_run_listing_the_accepted_ones() -> None:
    """The coding example once passed testTimeoutSeconds: every worker crashed at start."""
    bad = spec("coding")
    bad.rollout.environment_args = {"testTimeoutSeconds": "10"}
    assert spec_problem(bad, Settings()) == (
        "InvalidEnvironmentArgs", "spec.rollout.environmentArgs: 'testTimeoutSeconds' is not "
        "an argument of environment 'coding' (it takes: test_timeout_s, memory_mb)")
    bad.rollout.environment_args = {"memory_mb": "512"}
    assert spec_problem(bad, Settings()) is None


@pytest.mark.parametrize(("environment", "args", "said"), [
    ("target", {"turns": "many"}, "turns must be an integer from 1 to 16, not 'many'"),
    ("target", {"turns": "17"}, "turns must be an integer from 1 to 16, not '17'"),
    ("target", {"latency_ms": "-1"}, "latency_ms must be a number from 0 to 60000, not '-1'"),
    ("wordle", {"max_guesses": "0"}, "max_guesses must be an integer from 1 to 6, not '0'"),
    ("coding", {"memory_mb": "lots"}, "memory_mb must be an integer from 32 to 16384, not "
                                      "'lots'"),
    # A bound that hangs on another argument, given or defaulted (6 guesses).
    ("guess", {"max_guesses": "10", "consistent_reward": "0.12"},
     "consistent_reward must be below 0.06 when max_guesses is 10, not 0.12"),
    ("guess", {"consistent_reward": "0.2"},
     "consistent_reward must be below 0.126667 when max_guesses is 6, not 0.2"),
])
def test_argument_values_the_environment_refuses_fail_the_run(
        environment: str, args: dict[str, str], said: str) -> None:
    """What the worker would refuse at start (it converts with the same declarations), refused
    before anything starts: one message per value."""
    bad = spec(environment)
    bad.rollout.environment_args = args
    assert spec_problem(bad, Settings()) == ("InvalidEnvironmentArgs",
                                             f"spec.rollout.environmentArgs: {said}")
    from mtrl_worker.environments.registry import load_environment

    with pytest.raises(ValueError, match=said):  # the worker's own words, the same sentence
        load_environment(environment, args)


@pytest.mark.parametrize(("environment", "task", "said"), [
    ("target", {"goal": "16"}, "a target task sets exactly one of target_token_id and target"),
    ("target", {"target": "a", "target_token_id": "1"},
     "a target task sets exactly one of target_token_id and target"),
    ("target", {"target_token_id": "seven"}, "target_token_id must be an integer, not 'seven'"),
    ("target", {"target": "ab"}, "target 'ab' does not match (?s)."),
    ("wordle", {"word": "crane"}, "a wordle task needs the field 'secret'"),
    ("coding", {"task_id": "sort"}, "task_id must be one of "),
])
def test_inline_tasks_the_environment_refuses_fail_the_run(
        environment: str, task: dict[str, str], said: str) -> None:
    bad = spec(environment)
    assert bad.dataset.inline is not None
    bad.dataset.inline.validation = [TASKS[environment], task]
    reason, message = spec_problem(bad, Settings()) or ("", "")
    assert reason == "InvalidTask"
    assert message.startswith(f"spec.dataset.inline.validation[1]: {said}"), message
    assert spec_problem(spec(environment), Settings()) is None


@pytest.mark.parametrize(("cpu", "memory", "problem"), [
    (256, 2048, None),
    (8192, 20480, None),
    (256, 1536, "Fargate cpu 256 takes memory one of 512, 1024, 2048 MiB, not 1536"),
    (8192, 18432, "Fargate cpu 8192 takes memory 16384 to 61440 MiB in steps of 4096, not 18432"),
    (300, 1024, "Fargate takes cpu 256, 512, 1024, 2048, 4096, 8192, 16384, not 300"),
])
def test_a_fargate_size_stored_before_the_schema_rule_fails_the_run(
        cpu: int, memory: int, problem: str | None) -> None:
    """The schema refuses these pairs; a run stored before its rules existed fails here."""
    run = spec("wordle", "solved")
    run.workers.backend = WorkerBackend.ECS_FARGATE
    run.workers.cpu, run.workers.memory = cpu, memory
    settings = Settings(ecs_subnets=["subnet-0a1b2c3d"], ecs_security_groups=["sg-0a1b2c3d"],
                        ecs_execution_role_arn="arn:aws:iam::123456789012:role/exec")
    found = spec_problem(run, settings)
    assert found == (None if problem is None else ("InvalidFargateSize", problem))


def test_fargate_workers_without_an_execution_role_fail_the_run() -> None:
    """Fargate refuses a task definition with the awslogs driver and no execution role."""
    run = spec("wordle", "solved")
    run.workers.backend = WorkerBackend.ECS_FARGATE
    settings = Settings(ecs_subnets=["subnet-0a1b2c3d"], ecs_security_groups=["sg-0a1b2c3d"])
    reason, message = spec_problem(run, settings) or ("", "")
    assert reason == "NoExecutionRole" and "spec.workers.ecs.executionRoleArn" in message
    run.workers.ecs.execution_role_arn = "arn:aws:iam::123456789012:role/exec"
    assert spec_problem(run, settings) is None


@pytest.mark.parametrize(("environment", "problem"), [
    ("wordle", None),
    ("coding", ("DatasetNotGenerated", "spec.dataset.generated: environment 'coding' cannot "
                "generate its own tasks; use spec.dataset.inline or spec.dataset.s3")),
    ("target", ("DatasetNotGenerated", "spec.dataset.generated: environment 'target' cannot "
                "generate its own tasks; use spec.dataset.inline or spec.dataset.s3")),
])
def test_a_generated_dataset_needs_an_environment_that_makes_tasks(
        environment: str, problem: tuple[str, str] | None) -> None:
    run = spec(environment)
    run.dataset.inline = None
    run.dataset.generated = GeneratedDataset()
    assert spec_problem(run, Settings()) == problem


def pod(*containers: tuple[int | None, str]) -> dict[str, Any]:
    """A pod whose containers ended with (exit code, termination message); None: running."""
    return {"status": {"containerStatuses": [
        {"name": f"c{i}", "state": {"running": {}} if code is None else {
            "terminated": {"exitCode": code, "message": message}}}
        for i, (code, message) in enumerate(containers)]}}


JOB_FAILED = TrainerObserved(1, TrainerState.FAILED, "Job has reached the specified backoff limit")


@pytest.mark.parametrize(("pods", "message", "config_error"), [
    # the trainer's own line, exit code 2
    ([pod((2, "configuration error: MTRL_CONFIG: cannot read /etc/mtrl/run.json\n"))],
     "configuration error: MTRL_CONFIG: cannot read /etc/mtrl/run.json (exit code 2); "
     "Job has reached the specified backoff limit", True),
    # torchrun exits 1 whatever its child did: the words say it
    ([pod((1, "configuration error: spec.output.resumeFrom: no committed checkpoint"))],
     "configuration error: spec.output.resumeFrom: no committed checkpoint (exit code 1); "
     "Job has reached the specified backoff limit", True),
    # FallbackToLogsOnError: the log's tail, of which the last line is told
    ([pod((0, ""), (None, "")), pod((137, "step 3\nloading shard 2\nKilled\n\n"))],
     "Killed (exit code 137); Job has reached the specified backoff limit", False),
    ([pod((1, ""))], "exit code 1; Job has reached the specified backoff limit", False),
    ([pod((None, ""))], "Job has reached the specified backoff limit", False),
    ([], "Job has reached the specified backoff limit", False),
])
def test_a_failed_trainer_is_told_in_its_own_words(
        pods: list[dict[str, Any]], message: str, config_error: bool) -> None:
    told = with_cause(JOB_FAILED, pods)
    assert (told.message, told.config_error) == (message, config_error)
    assert (told.attempt, told.state) == (1, TrainerState.FAILED)


UNSCHEDULABLE = {"status": {"phase": "Pending", "conditions": [
    {"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
     "message": "0/12 nodes are available: 12 Insufficient nvidia.com/gpu. preemption: 0/12 "
                "nodes are available: 12 No preemption victims found for incoming pod."}]}}


def test_a_pending_trainer_the_scheduler_cannot_place_says_why() -> None:
    pending = TrainerObserved(1, TrainerState.PENDING, "waiting for trainer pods")
    told = with_pods(pending, [{"status": {"phase": "Pending"}}, UNSCHEDULABLE])
    assert told.unschedulable and told.state == TrainerState.PENDING and not told.bound
    assert told.message.startswith("its pod cannot be scheduled: 0/12 nodes are available: 12 "
                                   "Insufficient nvidia.com/gpu.")
    scheduled = {"status": {"conditions": [{"type": "PodScheduled", "status": "True"}]}}
    assert with_pods(pending, [scheduled]) == pending
    assert with_pods(pending, []) == pending


def bound_pod(name: str, waiting: dict[str, str] | None = None,
              phase: str = "Pending") -> dict[str, Any]:
    state = {"waiting": waiting} if waiting else {"running": {}}
    return {"metadata": {"name": name}, "spec": {"nodeName": "p5-1"},
            "status": {"phase": phase, "containerStatuses": [{"name": "trainer",
                                                              "state": state}]}}


@pytest.mark.parametrize("reason", ["ImagePullBackOff", "ErrImagePull",
                                    "CreateContainerConfigError"])
def test_a_trainer_pod_bound_to_a_node_that_cannot_start_says_why_in_the_kubelets_words(
        reason: str) -> None:
    """It holds its node (bound: billed) and says what the kubelet says, where before it was
    "waiting for trainer pods" at $0 for ever."""
    pending = TrainerObserved(1, TrainerState.PENDING, "waiting for trainer pods")
    said = 'Back-off pulling image "registry.example/mtrl-trainer:0.1.0"'
    told = with_pods(pending, [bound_pod("t1-0-abcde", {"reason": reason, "message": said})])
    assert told.bound and told.state == TrainerState.PENDING
    assert told.waiting == told.message == (f"pod t1-0-abcde cannot start its container "
                                            f"({reason}): {said}")
    # Bound and creating its container: it holds the node, and nothing is wrong yet.
    creating = with_pods(pending, [bound_pod("t1-0-abcde", {"reason": "ContainerCreating"})])
    assert creating.bound and not creating.waiting
    # A finished pod holds no node.
    assert not with_pods(pending, [bound_pod("t1-0-abcde", phase="Failed")]).bound


def test_a_workload_kueue_suspended_is_held_not_failed_nor_running() -> None:
    """Kueue creates a queued Job or PyTorchJob suspended and suspends it again to evict it
    (its controller then says Suspended, and Running turns False)."""
    queued_job = {"spec": {"suspend": True}, "status": {}}
    held = trainer_state("Job", queued_job, 1)
    assert held.state == TrainerState.PENDING and held.held
    queued = {"spec": {"runPolicy": {"suspend": True}}, **job(
        ("Created", "True", "2026-11-30T10:00:00Z"), ("Running", "False", "2026-11-30T10:05:00Z"),
        ("Suspended", "True", "2026-11-30T10:05:00Z"))}
    held = trainer_state("PyTorchJob", queued, 2)
    assert held.state == TrainerState.PENDING and held.held and held.attempt == 2
    admitted = {"spec": {"runPolicy": {"suspend": False}}, **job(
        ("Created", "True", "2026-11-30T10:00:00Z"), ("Running", "True", "2026-11-30T10:06:00Z"))}
    assert trainer_state("PyTorchJob", admitted, 2).state == TrainerState.RUNNING
    # A finished job stays finished, suspended or not.
    done = {"spec": {"suspend": True}, "status": {"conditions": [
        {"type": "Complete", "status": "True"}]}}
    assert trainer_state("Job", done, 1).state == TrainerState.SUCCEEDED


def _workload(created: str, *conditions: tuple[str, str, str, str]) -> dict[str, Any]:
    return {"metadata": {"creationTimestamp": created}, "status": {"conditions": [
        {"type": t, "status": s, "reason": r, "message": m} for t, s, r, m in conditions]}}


def test_the_queue_hold_is_told_in_kueues_words() -> None:
    quota = ("couldn't assign flavors to pod set master: insufficient quota for cpu in flavor "
             "default, previously considered podsets requests (0) + current podset request (2) "
             "> maximum capacity (1)")
    pending = _workload("2026-11-30T10:00:00Z", ("QuotaReserved", "False", "Pending", quota))
    assert queue_hold("hyperpod-ns-a-localqueue", [pending]) == \
        f"waiting for Kueue admission in queue hyperpod-ns-a-localqueue: {quota}"
    preempted = _workload(
        "2026-11-30T10:00:00Z", ("QuotaReserved", "False", "Pending", "waiting"),
        ("Evicted", "True", "Preempted", "Preempted to accommodate a workload (UID: 1) due to "
                                         "prioritization in the ClusterQueue"))
    assert queue_hold("q", [preempted]) == (
        "waiting for Kueue admission in queue q: evicted (Preempted): Preempted to accommodate "
        "a workload (UID: 1) due to prioritization in the ClusterQueue")
    assert queue_hold("q", []) == "waiting for Kueue admission in queue q"
    assert queue_hold("", []) == "suspended, waiting to be admitted"


def test_a_trainer_that_diverged_is_told_so() -> None:
    line = ("training diverged: the gradient norm of step 3/10 is nan; its update was not "
            "applied, so the weights and the last checkpoint hold the last good policy")
    told = with_cause(JOB_FAILED, [pod((1, f"step 2/10\n{line}\n"))])
    assert told.diverged and not told.config_error and not told.episodes_failed
    assert told.message.startswith(f"{line} (exit code 1)")
    assert not with_cause(JOB_FAILED, [pod((1, "Killed"))]).diverged


def test_a_failed_trainer_that_trained_nothing_is_told_so() -> None:
    told = with_cause(JOB_FAILED, [pod((1, "nothing trained: the run played 3 steps and made "
                                           "no optimizer update"))])
    assert told.nothing_trained and not told.episodes_failed
