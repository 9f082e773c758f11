"""`mtrl runs`: the table, and the runs of a namespace or of all, read from the API server."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from mtrl_cli.runs import table
from mtrl_testbed.cluster import LocalCluster
from tests.cli.conftest import Result, make_run

NOW = datetime(2026, 1, 2, 12, 0, tzinfo=UTC)


def _run(namespace: str, name: str, age: timedelta, **status: object) -> dict:
    created = (NOW - age).isoformat().replace("+00:00", "Z")
    return {"metadata": {"namespace": namespace, "name": name, "creationTimestamp": created},
            "spec": {"grpo": {"maxSteps": 100}}, "status": status}


def test_the_table_has_a_row_per_run_and_cuts_the_message_to_the_width() -> None:
    runs = [_run("b", "wordle", timedelta(minutes=36), phase="Running", attempts=2,
                 message="Training: step 42 of 100 " + "x" * 200,
                 progress={"step": 42, "totalSteps": 100, "rewardMean": 0.6123,
                           "successRate": 0.58}),
            _run("a", "new", timedelta(seconds=5))]
    lines = table(runs, NOW, namespaces=False, width=100).splitlines()
    assert lines[0].split() == ["NAME", "PHASE", "STEP", "REWARD", "SUCCESS", "ATTEMPTS", "AGE",
                                "MESSAGE"]
    assert lines[1].split()[:7] == ["new", "Pending", "0/100", "-", "-", "0", "5s"]
    assert lines[2].split()[:8] == ["wordle", "Running", "42/100", "0.612", "58%", "2", "36m",
                                    "Training:"]
    assert len(lines[2]) == 100 and lines[2].endswith("…")
    everywhere = table(runs, NOW, namespaces=True, width=200).splitlines()
    assert everywhere[0].startswith("NAMESPACE") and everywhere[1].startswith("a ")


@pytest.mark.cluster
def test_runs_lists_a_namespace_or_all(cluster: LocalCluster, cli_namespace: str,
                                       mtrl: Callable[..., Result]) -> None:
    make_run(cluster, cli_namespace, "learning", status={
        "phase": "Running", "attempts": 1, "message": "the trainer reports step 2",
        "progress": {"step": 2, "totalSteps": 3, "rewardMean": 0.4567, "successRate": 0.25}})
    make_run(cluster, cli_namespace, "waiting")
    listed = mtrl("runs", "-n", cli_namespace)
    assert listed.code == 0 and listed.err == ""
    rows = [line.split() for line in listed.out.splitlines()]
    assert rows[1][:8] == ["learning", "Running", "2/3", "0.457", "25%", "1", rows[1][6],
                           "the"]
    assert rows[2][:5] == ["waiting", "Pending", "0/3", "-", "-"]
    everywhere = mtrl("runs", "-A")
    assert everywhere.code == 0 and everywhere.out.startswith("NAMESPACE")
    mine = [line.split() for line in everywhere.out.splitlines() if line.startswith(cli_namespace)]
    assert [row[1] for row in mine] == ["learning", "waiting"]


@pytest.mark.cluster
def test_an_empty_namespace_says_so(cluster: LocalCluster, cli_namespace: str,
                                    mtrl: Callable[..., Result]) -> None:
    empty = mtrl("runs", "-n", cli_namespace)
    assert (empty.code, empty.out) == (0, "")
    assert empty.err == f"No runs found in namespace {cli_namespace}.\n"
