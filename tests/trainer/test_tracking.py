"""spec.output.mlflow against a real MLflow tracking server: the run's params and every step's
metrics, read back through MLflow's own client, with either engine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("mlflow")

from mlflow import MlflowClient

from mtrl_testbed.mlflow_server import MlflowServer
from mtrl_trainer.tracking import UID_TAG, flat_params, step_metrics

from .conftest import TrainingRun, on_engine, run_spec
from .test_learning import train


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    server = MlflowServer(Path(tmp_path_factory.mktemp("mlflow"))).start()
    yield server
    server.stop()


def test_the_spec_flattens_to_params_and_a_report_to_metrics() -> None:
    params = dict(flat_params({"grpo": {"groupSize": 8, "lossType": "dapo"},
                               "dataset": {"evalPassAtK": [1, 4], "inline": {}}}))
    assert params == {"grpo.groupSize": "8", "grpo.lossType": "dapo",
                      "dataset.evalPassAtK": "[1, 4]", "dataset.inline": "{}"}
    metrics = step_metrics({"step": 3, "totalSteps": 8, "rewardMean": 0.5, "rewardStd": None,
                            "policyVersion": 3, "episodeError": "", "engine": "trl",
                            "validationPassAtK": [{"k": 4, "value": 0.25}],
                            "components": [{"name": "solved", "mean": 0.5, "std": 0.1,
                                            "zeroVarianceFraction": 0.0}]})
    assert metrics == {"rewardMean": 0.5, "policyVersion": 3.0, "validationPassAt4": 0.25,
                       "reward/solved": 0.5}


@pytest.mark.slow
@pytest.mark.aws
@pytest.mark.parametrize("engine", ["mtrl", "trl"])
def test_a_run_logs_its_params_and_every_step_to_mlflow(
        training_run: TrainingRun, mlflow_server: MlflowServer, engine: str) -> None:
    spec = on_engine(run_spec(training_run.bucket, maxSteps=4), engine)
    spec["dataset"]["evalIntervalSteps"] = 2
    spec["output"]["mlflow"] = {"trackingUri": mlflow_server.uri, "experimentName": "trainers"}
    train(training_run, spec)

    client = MlflowClient(tracking_uri=mlflow_server.uri)
    experiment = client.get_experiment_by_name("trainers")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id],
                              filter_string=f"tags.`{UID_TAG}` = '{training_run.run_id}'")
    assert len(runs) == 1
    run = runs[0]
    assert run.info.run_name == training_run.name and run.info.status == "FINISHED"
    params = run.data.params
    assert params["run.uid"] == training_run.run_id
    assert params["run.namespace"] == training_run.namespace
    assert (params["grpo.groupSize"], params["trainer.engine"]) == ("8", engine)
    assert params["output.mlflow.trackingUri"] == mlflow_server.uri
    reward = client.get_metric_history(run.info.run_id, "rewardMean")
    assert [m.step for m in reward] == [1, 2, 3, 4]
    logged = {m.step: m.value for m in reward}
    assert logged == {m["step"]: m["rewardMean"] for m in training_run.metrics(spec)}
    validation = client.get_metric_history(run.info.run_id, "validationSuccessRate")
    assert sorted(m.step for m in validation) == [2, 4]
