"""Helpers for lifecycle tests: make runs, wait for phases, count what a run left in AWS."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from typing import Any

from mtrl_operator.naming import RunNames
from mtrl_testbed import census
from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.standin_trainer import finished_report

# The real trainer's contract without a model: every step reported, then the outcome.
SUCCEED = ["python", "-m", "mtrl_testbed.standin_trainer", "--step-seconds", "0.2"]
# Exits 0 after its steps without reporting an outcome: no evidence it trained.
EXITS_0_SILENTLY = [*SUCCEED, "--no-outcome"]
FAIL = ["python", "-c", "raise SystemExit(3)"]
HANG = ["python", "-c", "import time; time.sleep(600)"]

BASE_SPEC: dict[str, Any] = {
    "model": {"name": "random:tiny-qwen2", "dtype": "float32"},
    "trainer": {"gpusPerNode": 0, "efaPerNode": 0, "command": SUCCEED},
    "grpo": {"maxSteps": 3},
    "rollout": {"environment": "target"},
    "workers": {"backend": "kubernetes", "cpu": 256, "memory": 512, "minReplicas": 1,
                "maxReplicas": 1},
    "dataset": {"inline": {"train": [{"target": "a"}]}},
    "output": {"s3Uri": "s3://mtrl-test-outputs/runs"},
}


def run_manifest(name: str, **overrides: Any) -> dict[str, Any]:
    spec = copy.deepcopy(BASE_SPEC)
    for section, value in overrides.items():
        if isinstance(value, dict) and isinstance(spec.get(section), dict):
            spec[section] = {**spec[section], **value}
        else:
            spec[section] = value
    return {"apiVersion": "mtrl.dev/v1alpha1", "kind": "MultiTurnRLRun",
            "metadata": {"name": name}, "spec": spec}


def apply(cluster: LocalCluster, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
    out = cluster.kubectl("apply", "-n", namespace, "-o", "json", "-f", "-",
                          input=json.dumps(manifest))
    return json.loads(out.stdout)


def get(cluster: LocalCluster, namespace: str, name: str) -> dict[str, Any] | None:
    out = cluster.kubectl("get", "mtrlrun", name, "-n", namespace, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def wait_for(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.5) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last: {last!r}")


def wait_phase(cluster: LocalCluster, namespace: str, name: str, phase: str,
               timeout: float = 90) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    def check() -> dict[str, Any] | None:
        run = get(cluster, namespace, name)
        status = (run or {}).get("status") or {}
        seen.update(phase=status.get("phase"), message=status.get("message"))
        return run if status.get("phase") == phase else None

    try:
        return wait_for(check, timeout, f"{namespace}/{name} to reach {phase}")
    except AssertionError as exc:  # say where the run is instead
        raise AssertionError(f"{exc} (phase {seen.get('phase')!r}: {seen.get('message')!r})") from None


def names_of(run: dict[str, Any], operator_id: str = "shared") -> RunNames:
    meta = run["metadata"]
    return RunNames(meta["namespace"], meta["name"], meta["uid"], operator_id)


def aws_leftovers(names: RunNames) -> dict[str, list[str]]:
    """Everything in AWS that still belongs to the run (`mtrl_testbed.census`)."""
    return census.run_aws(names)


def k8s_leftovers(cluster: LocalCluster, namespace: str, uid: str,
                  kinds: tuple[str, ...] = census.COMPUTE) -> dict[str, list[str]]:
    """The run's objects still in the cluster: by default those that cost money, which go
    when the run finishes; `census.KINDS` once the run itself is deleted."""
    return census.run_k8s(cluster, namespace, uid, kinds)


def wait_clean(cluster: LocalCluster, names: RunNames, timeout: float = 60) -> None:
    wait_for(lambda: not aws_leftovers(names) and not k8s_leftovers(
        cluster, names.namespace, names.uid), timeout,
        f"no resources left for {names.name}", interval=1)


def condition(run: dict[str, Any], type_: str) -> dict[str, Any] | None:
    return next((c for c in (run.get("status") or {}).get("conditions", [])
                 if c["type"] == type_), None)


def report_outcome(cluster: LocalCluster, namespace: str, name: str,
                   trained: int | None = None) -> None:
    """What the trainer of the run's current launch writes when it finishes, for tests that
    play the training operator's part by hand: without it, a workload marked Completed is no
    evidence that anything trained."""
    run = get(cluster, namespace, name)
    assert run is not None, name
    status, total = run["status"], run["spec"].get("grpo", {}).get("maxSteps", 100)
    env = {"MTRL_ATTEMPT": str(status["attempts"]), "MTRL_LAUNCH": str(status["trainerLaunch"]),
           "MTRL_PROGRESS_CONFIGMAP": names_of(run).progress_config_map}
    configmap, patch = finished_report(env, total, trained)
    cluster.kubectl("patch", "configmap", configmap, "-n", namespace, "--type", "merge", "-p",
                    json.dumps(patch))
