"""An operator that cannot work never looks healthy: a configuration it cannot load, or a
Lease its ServiceAccount may not hold, ends the process with one line naming it (as
controller-runtime's GetConfigOrDie does); an API server it cannot reach makes it not ready,
while it stays alive to try again."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.operator import OperatorProcess
from mtrl_testbed.ports import free_port, wait_until

pytestmark = [pytest.mark.cluster]


def _probe(proc: OperatorProcess, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{proc.health_port}{path}",
                                    timeout=2) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _said(proc: OperatorProcess) -> str:
    return proc.log_path.read_text(errors="replace")


def test_a_kubeconfig_that_does_not_exist_stops_the_operator_with_one_line(
        operator_factory: Callable[..., OperatorProcess], tmp_path: Path) -> None:
    proc = operator_factory(kubeconfig=tmp_path / "nope.kubeconfig", MTRL_OPERATOR_ID="nocfg")
    assert proc.wait(60) == 2
    assert f"mtrl operator: no usable Kubernetes configuration (in-cluster or KUBECONFIG=" \
           f"'{tmp_path / 'nope.kubeconfig'}'): Configuration file {tmp_path / 'nope.kubeconfig'}" \
           f" not found" in _said(proc), _said(proc)[-2000:]


def test_a_lease_the_service_account_may_not_hold_stops_the_operator(
        operator_factory: Callable[..., OperatorProcess]) -> None:
    """The chart's ServiceAccount may hold Leases in its own namespace only."""
    proc = operator_factory(MTRL_OPERATOR_ID="nolease", MTRL_LEASE_NAMESPACE="default")
    assert proc.wait(60) == 2
    assert "mtrl operator: the operator may not get its Lease default/mtrl-operator-nolease " \
           "(403 Forbidden" in _said(proc), _said(proc)[-2000:]


def test_an_api_server_out_of_reach_makes_the_operator_unready_not_dead(
        cluster: LocalCluster, operator_factory: Callable[..., OperatorProcess],
        tmp_path: Path) -> None:
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    away = tmp_path / "away.kubeconfig"
    away.write_text(yaml.safe_dump(config))
    proc = operator_factory(kubeconfig=away, MTRL_OPERATOR_ID="away")
    wait_until(lambda: _probe(proc, "/readyz")[1]["error"], 60, "readyz to say why")
    status, body = _probe(proc, "/readyz")
    assert status == 503 and body["status"] == "unavailable", body
    assert "ConnectError" in body["error"], body
    assert _probe(proc, "/healthz")[0] == 200 and proc.alive
