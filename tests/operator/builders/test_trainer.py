"""Trainer workloads as pure functions: what each launcher renders, checked against what the
systems that run them expect (docs/hyperpod.md cites the sources)."""

from __future__ import annotations

import argparse
import logging
import re
from pathlib import Path
from typing import Any

import pytest

from mtrl_api.run import MultiTurnRLRunSpec
from mtrl_operator import launchers
from mtrl_operator.builders.trainer import (
    ELASTIC_AGENT_PORT,
    STEP_LOG_PATTERN,
    pod_template,
)
from mtrl_operator.naming import RunNames
from mtrl_rollout import logs

REPO = Path(__file__).resolve().parents[3]
OWNER = {"apiVersion": "mtrl.dev/v1alpha1", "kind": "MultiTurnRLRun", "name": "wordle",
         "uid": "uid-1", "controller": True, "blockOwnerDeletion": True}


def spec(launcher: str, nodes: int = 2, **extra: Any) -> MultiTurnRLRunSpec:
    return MultiTurnRLRunSpec.model_validate({
        "model": {"name": "Qwen/Qwen3-8B"}, "rollout": {"environment": "wordle"},
        "dataset": {"generated": {}}, "output": {"s3Uri": "s3://bucket/runs/wordle"},
        "trainer": {"launcher": launcher, "nodes": nodes, "autoResumeMaxRetries": 2},
        **extra})


def render(launcher: str, namespace: str = "team-a", **kw: Any) -> dict[str, Any]:
    names = RunNames(namespace, "wordle", "uid-1")
    return launchers.build(names, spec(launcher, **kw), {"MTRL_RUN_ID": "uid-1"}, 1, OWNER)[-1]


def container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    return pod_spec["containers"][0]


def env(pod_spec: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container(pod_spec)["env"]}


# --------------------------------------------------------------------------- HyperPodPyTorchJob


def test_hyperpod_pods_run_the_elastic_agent_as_pid_1_on_its_port() -> None:
    job = render("HyperPodPyTorchJob")
    pod = job["spec"]["replicaSpecs"][0]["template"]["spec"]
    command = container(pod)["command"]
    assert command[0] == "hyperpodrun"  # exec form: no shell in between to swallow SIGTERM
    assert "--nnodes=2" in command and "--nproc-per-node=8" in command
    assert not any(a.startswith(("--rdzv-endpoint", "--rdzv-backend")) for a in command)
    assert {"name": "elastic-agent", "containerPort": ELASTIC_AGENT_PORT} in \
        container(pod)["ports"]
    assert ELASTIC_AGENT_PORT == 8080
    assert env(pod)["NNODES"] == "2"  # the agent's rendezvous backend reads it at start
    assert job["spec"]["nprocPerNode"] == "8"


def hyperpodrun_parser() -> argparse.ArgumentParser:
    """torchrun's own parser plus the arguments the HyperPod elastic agent's README adds: the
    agent "supports all of the original arguments" of torchrun."""
    run = pytest.importorskip("torch.distributed.run")
    parser = run.get_args_parser()
    for flag in ("--shutdown-signal", "--shutdown-timeout", "--server-host", "--server-port",
                 "--server-log-level", "--server-shutdown-timeout", "--pre-train-script",
                 "--pre-train-args", "--post-train-script", "--post-train-args",
                 "--inprocess-timeout"):
        if flag not in parser._option_string_actions:  # newer torchrun has some of them
            parser.add_argument(flag)
    parser.add_argument("--inprocess-restart", action="store_true")
    return parser


def test_the_hyperpodrun_command_line_parses_as_the_agent_parses_it() -> None:
    job = render("HyperPodPyTorchJob")
    command = container(job["spec"]["replicaSpecs"][0]["template"]["spec"])["command"]
    args = hyperpodrun_parser().parse_args(command[1:])
    assert (args.nnodes, args.nproc_per_node, args.server_port) == ("2", "8", "8080")
    assert args.module and args.training_script == "mtrl_trainer"
    assert (args.redirects, args.tee) == ("3", "3") and args.log_dir == "/tmp/hyperpod"


def test_hyperpod_run_policy_sets_ttl_retries_and_hang_detection() -> None:
    policy = render("HyperPodPyTorchJob")["spec"]["runPolicy"]
    # The CLI model's default 0 would delete a finished job at once.
    assert policy["ttlSecondsAfterFinished"] > 0
    assert policy["jobMaxRetryCount"] == 2
    assert policy["restartPolicy"]["maxFullJobRestarts"] == 2
    assert policy["restartPolicy"]["numRestartBeforeFullJobRestart"] == 2
    assert policy["restartPolicy"]["evalPeriodSeconds"] > 0
    [rule] = policy["logMonitoringConfiguration"]
    assert rule["expectedRecurringFrequencyInSeconds"] == 1800
    assert rule["expectedStartCutOffInSeconds"] == 1800
    assert rule["logPattern"] == STEP_LOG_PATTERN


def _source_strings(path: str, pattern: str) -> list[str]:
    return re.findall(pattern, (REPO / path).read_text())


def test_the_step_pattern_matches_every_ranks_step_line() -> None:
    """The trainer's log format and step messages (these read from its source), formatted as
    its logging prints them: every rank's line must match HyperPod's rule."""
    messages = [(module, message) for module in ("loop", "trl_engine") for message in
                _source_strings(f"trainer/mtrl_trainer/{module}.py",
                                r'log\.info\("(step %d/%d[^"]*)"')]
    # the reference trainer's leader and followers, TRL's engine
    assert [module for module, _ in messages] == ["loop", "loop", "trl_engine"], messages
    formatter = logging.Formatter(logs.FORMAT)
    for module, message in messages:
        args = tuple(1.5 if spec_ == "%.4f" or spec_ == "%.1f" else 3 if spec_ == "%d" else "x"
                     for spec_ in re.findall(r"%[.\d]*[dfs]", message))
        record = logging.LogRecord(f"mtrl_trainer.{module}", logging.INFO, f"{module}.py", 1,
                                   message, args, None)
        line = formatter.format(record)
        match = re.fullmatch(STEP_LOG_PATTERN, line)
        assert match and match.group(1) == "3", line
    assert not re.fullmatch(STEP_LOG_PATTERN, "INFO mtrl_trainer: training finished at step 3")


def test_hyperpod_kueue_labels_and_topology_go_on_the_job_and_the_pod_template() -> None:
    job = render("HyperPodPyTorchJob", scheduling={
        "queueName": "hyperpod-ns-research-localqueue", "priorityClass": "training-priority",
        "requiredTopology": "topology.k8s.aws/network-node-layer-3"})
    template = job["spec"]["replicaSpecs"][0]["template"]
    for meta in (job["metadata"], template["metadata"]):
        assert meta["labels"]["kueue.x-k8s.io/queue-name"] == "hyperpod-ns-research-localqueue"
        assert meta["labels"]["kueue.x-k8s.io/priority-class"] == "training-priority"
        assert meta["annotations"] == {
            "kueue.x-k8s.io/podset-required-topology": "topology.k8s.aws/network-node-layer-3"}


@pytest.mark.parametrize("launcher", ["Job", "PyTorchJob", "HyperPodPyTorchJob"])
def test_every_launcher_prefers_nodes_whose_deep_health_check_passed(launcher: str) -> None:
    names = RunNames("team-a", "wordle", "uid-1")
    affinity = pod_template(names, spec(launcher), {}, 1)["spec"]["affinity"]["nodeAffinity"]
    assert affinity["preferredDuringSchedulingIgnoredDuringExecution"] == [
        {"weight": 100, "preference": {"matchExpressions": [
            {"key": "sagemaker.amazonaws.com/deep-health-check-status", "operator": "In",
             "values": ["Passed"]}]}}]
    required = affinity["requiredDuringSchedulingIgnoredDuringExecution"]
    assert {"key": "sagemaker.amazonaws.com/node-health-status", "operator": "In",
            "values": ["Schedulable"]} in required["nodeSelectorTerms"][0]["matchExpressions"]


# --------------------------------------------------------------------------- PyTorchJob


def test_a_multi_node_pytorchjob_rendezvous_at_the_master_kubeflow_names() -> None:
    job = render("PyTorchJob")
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        pod = replica["template"]["spec"]
        command = container(pod)["command"]
        assert command[:4] == ["mtrl", "torchrun", "--nnodes=2", "--nproc-per-node=8"]
        assert {"--node-rank=$(PET_NODE_RANK)", "--master-addr=$(MASTER_ADDR)",
                "--master-port=$(MASTER_PORT)"} <= set(command)
        assert container(pod)["name"] == "pytorch"  # Kubeflow looks for this container...
        assert container(pod)["ports"][0]["name"] == "pytorchjob-port"  # ...and this port


@pytest.mark.parametrize(("launcher", "nodes"), [("Job", 1), ("Job", 2), ("PyTorchJob", 1),
                                                ("PyTorchJob", 2)])
def test_torchrun_runs_under_the_launcher_that_exits_143_after_sigterm(launcher: str,
                                                                      nodes: int) -> None:
    """torchrun exits 1 after passing SIGTERM on, whatever its ranks did; `mtrl torchrun`
    (mtrl_trainer.launch) exits 143 then, which the Job's podFailurePolicy ignores. What follows
    it is torchrun's own command line."""
    run = pytest.importorskip("torch.distributed.run")
    pod = pod_template(RunNames("team-a", "wordle", "uid-1"), spec(launcher, nodes), {}, 1,
                       rendezvous="wordle-t1-0.wordle-t1:29500" if launcher == "Job" else None,
                       container_name="trainer")["spec"]
    command = container(pod)["command"]
    assert command[:2] == ["mtrl", "torchrun"]
    # The kubelet expands Kubeflow's variables (a PyTorchJob's rendezvous) before it starts.
    kubeflow = {"PET_NODE_RANK": "1", "MASTER_ADDR": "wordle-t1-master-0", "MASTER_PORT": "23456"}
    args = run.get_args_parser().parse_args(
        [re.sub(r"\$\((\w+)\)", lambda m: kubeflow[m.group(1)], arg) for arg in command[2:]])
    assert args.nnodes in (str(nodes), f"{nodes}:{nodes}") and args.nproc_per_node == "8"
    assert args.module and args.training_script == "mtrl_trainer"
    assert args.standalone == (nodes == 1)


def test_one_process_and_hyperpod_keep_their_own_commands() -> None:
    """One process is the trainer itself (it exits 143 on SIGTERM); HyperPod's elastic agent
    stays PID 1, as its README requires, and HyperPod's operator reads its exit."""
    names = RunNames("team-a", "wordle", "uid-1")
    one = spec("Job", 1, trainer={"launcher": "Job", "nodes": 1, "gpusPerNode": 1})
    assert container(pod_template(names, one, {}, 1)["spec"])["command"] == ["mtrl", "trainer"]
    hyperpod = container(pod_template(names, spec("HyperPodPyTorchJob"), {}, 1)["spec"])
    assert hyperpod["command"][0] == "hyperpodrun"


def test_the_job_launchers_rendezvous_is_its_first_pod() -> None:
    job = render("Job")
    command = container(job["spec"]["template"]["spec"])["command"]
    assert "--rdzv-endpoint=wordle-t1-0.wordle-t1:29500" in command


# --------------------------------------------------------------------------- who retries


def test_auto_resume_owns_pytorchjob_retries_in_its_namespaces() -> None:
    job = render("PyTorchJob", namespace="hyperpod-ns-research")
    assert job["metadata"]["annotations"] == {
        "sagemaker.amazonaws.com/enable-job-auto-resume": "true",
        "sagemaker.amazonaws.com/job-max-retry-count": "2"}
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        # AWS: auto-resume needs OnFailure; backoffLimit 0 hands the first failure to it.
        # Set once, on the replica: the controller copies it into the pods.
        assert replica["restartPolicy"] == "OnFailure"
        assert "restartPolicy" not in replica["template"]["spec"]
    assert job["spec"]["runPolicy"]["backoffLimit"] == 0


def test_the_operator_owns_pytorchjob_retries_elsewhere() -> None:
    job = render("PyTorchJob", namespace="team-a")
    assert "annotations" not in job["metadata"]
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        assert replica["restartPolicy"] == "Never"
        assert "restartPolicy" not in replica["template"]["spec"]
    # No backoffLimit: with one, Kubeflow's controller deletes every pod of a failed job before
    # marking it Failed, and the trainer's words go with them. cleanPodPolicy Running keeps the
    # finished pods and deletes those still running.
    assert job["spec"]["runPolicy"] == {"cleanPodPolicy": "Running"}


def test_the_job_launcher_never_retries_by_itself() -> None:
    job = render("Job")
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["template"]["spec"]["restartPolicy"] == "Never"


@pytest.mark.parametrize("launcher", ["Job", "PyTorchJob", "HyperPodPyTorchJob"])
def test_every_launchers_trainer_leaves_its_cause_as_the_termination_message(
        launcher: str) -> None:
    names = RunNames("team-a", "wordle", "uid-1")
    trainer = container(pod_template(names, spec(launcher), {}, 1)["spec"])
    assert trainer["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert trainer["terminationMessagePath"] == "/dev/termination-log"
    assert env({"containers": [trainer]})["MTRL_TERMINATION_MESSAGE_PATH"] == \
        "/dev/termination-log"


def test_a_disrupted_pod_is_replaced_without_failing_the_job_and_any_failure_fails_it() -> None:
    """backoffLimit 0: any failed pod fails the Job (the operator retries, and reads a
    configuration error from the termination message: torchrun exits 1 whatever its child's
    code, and `mtrl torchrun` passes that on); an evicted or preempted pod (DisruptionTarget)
    is the Job's to replace, and its trainer had SIGTERM's grace period to save a checkpoint."""
    job = render("Job")
    assert job["spec"]["backoffLimit"] == 0
    assert job["spec"]["podFailurePolicy"] == {"rules": [
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        # A pod deleted outright: the trainer saved a checkpoint on SIGTERM and exited 143
        # (several processes: `mtrl torchrun` exits 143 once torchrun stopped after SIGTERM).
        {"action": "Ignore", "onExitCodes": {"containerName": "trainer", "operator": "In",
                                             "values": [143]}}]}
    assert job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == 180


def test_a_kept_log_is_the_tail_owned_by_the_run() -> None:
    from mtrl_operator.builders.trainer import KEPT_LOG_BYTES, kept_log
    from mtrl_operator.naming import RunNames

    names = RunNames("ns", "run", "0f9e8d7c-1111-2222-3333-444455556666")
    owner = {"apiVersion": "mtrl.dev/v1alpha1", "kind": "MultiTurnRLRun", "name": "run",
             "uid": names.uid}
    text = "".join(f"line {i}\n" for i in range(20000)) + "MemoryError: the end\n"
    kept = kept_log(names, 3, "run-t3-0-x", "trainer", text, owner)
    log = kept["data"]["log"]
    assert len(log.encode()) <= KEPT_LOG_BYTES and log.endswith("MemoryError: the end\n")
    assert kept["metadata"]["name"] == "run-t3-log" and kept["metadata"]["ownerReferences"] == [owner]
    assert kept["metadata"]["labels"]["mtrl.dev/attempt"] == "3"
