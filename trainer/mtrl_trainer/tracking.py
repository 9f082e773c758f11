"""spec.output.mlflow: every step's report as MLflow metrics, with either engine.

One MLflow run per MultiTurnRLRun, found again by its UID tag, so a retry or a resumed attempt
continues the same run (a step trained again is logged again at the same step). Params are the
run's name, UID and namespace and its spec, flattened (`grpo.groupSize`). Like every progress
sink, a failing server never stops training (`Progress._send` logs and goes on).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping
from itertools import islice
from typing import Any

from mtrl_api.run import MlflowSpec

UID_TAG = "mtrl.dev/run-uid"
MAX_PARAM_VALUE = 6000  # MLflow 3's limit on a param's value
BATCH = 100  # params per log_batch request, MLflow's limit


def flat_params(spec: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """`{"grpo": {"groupSize": 8}}` as ("grpo.groupSize", "8"); lists as JSON."""
    for key, value in spec.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            yield from flat_params(value, f"{name}.")
        else:
            text = value if isinstance(value, str) else json.dumps(value)
            yield name, text[:MAX_PARAM_VALUE]


def step_metrics(body: Mapping[str, Any]) -> dict[str, float]:
    """The numbers of one progress report, by the names metrics.jsonl gives them (pass@k as
    validationPassAt<k>, reward components as reward/<name>)."""
    out = {k: float(v) for k, v in body.items()
           if isinstance(v, int | float) and not isinstance(v, bool)
           and k not in ("step", "totalSteps", "attempt")}
    for entry in body.get("validationPassAtK") or []:
        out[f"validationPassAt{entry['k']}"] = float(entry["value"])
    for component in body.get("components") or []:
        out[f"reward/{component['name']}"] = float(component["mean"])
    return out


class MlflowSink:
    def __init__(self, spec: MlflowSpec, *, uid: str, name: str, namespace: str,
                 run_spec: Mapping[str, Any]) -> None:
        from mlflow import MlflowClient
        from mlflow.entities import Param, RunTag

        self._client = client = MlflowClient(tracking_uri=spec.tracking_uri)
        experiment = spec.experiment_name or namespace
        found = client.get_experiment_by_name(experiment)
        experiment_id = found.experiment_id if found else client.create_experiment(experiment)
        runs = client.search_runs([experiment_id], filter_string=f"tags.`{UID_TAG}` = '{uid}'",
                                  max_results=1)
        if runs:
            self.run_id = runs[0].info.run_id
            client.update_run(self.run_id, status="RUNNING")
        else:
            self.run_id = client.create_run(experiment_id, run_name=name, tags={
                UID_TAG: uid, "mtrl.dev/namespace": namespace,
                "mtrl.dev/engine": run_spec.get("trainer", {}).get("engine", "mtrl")}
            ).info.run_id
            params = iter([("run.name", name), ("run.uid", uid), ("run.namespace", namespace),
                           *flat_params(run_spec)])
            while chunk := list(islice(params, BATCH)):
                client.log_batch(self.run_id, params=[Param(k, v) for k, v in chunk],
                                 tags=[RunTag("mtrl.dev/params", "logged")])
        self._logged_step = -1

    def report(self, body: dict[str, Any]) -> None:
        from mlflow.entities import Metric

        step = int(body.get("step") or 0)
        if step != self._logged_step:  # a report sent again (a checkpoint named) is not new
            now = int(time.time() * 1000)
            metrics = [Metric(k, v, now, step) for k, v in step_metrics(body).items()]
            for start in range(0, len(metrics), 1000):
                self._client.log_batch(self.run_id, metrics=metrics[start:start + 1000])
            self._logged_step = step
        if body.get("outcome") == "Succeeded":
            self._client.set_terminated(self.run_id, status="FINISHED")
