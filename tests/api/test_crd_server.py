"""The CRD against the real kube-apiserver: examples accepted, explain, printer columns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtrl_testbed.cluster import LocalCluster

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "manifests" / "examples").glob("*.yaml"))

pytestmark = pytest.mark.cluster


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_is_accepted(cluster: LocalCluster, namespace: str, path: Path) -> None:
    out = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-f", "-",
                          input=path.read_text().replace("namespace: hyperpod-ns-research",
                                                         f"namespace: {namespace}"))
    assert "created (server dry run)" in out.stdout


def test_explain_teaches_the_grpo_fields(cluster: LocalCluster) -> None:
    out = cluster.kubectl("explain", "mtrlrun.spec.grpo").stdout
    assert "epsilonHigh" in out and "clip-higher" in out
    assert "Default 8." in out  # groupSize


def test_printer_columns_and_short_names(cluster: LocalCluster, namespace: str) -> None:
    tiny = (REPO / "manifests" / "examples" / "tiny-cpu.yaml").read_text()
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=tiny)
    cluster.kubectl("patch", "mtrlrun", "tiny-target", "-n", namespace, "--subresource=status",
                    "--type=merge", "-p", json.dumps({"status": {
                        "phase": "Running", "attempts": 2, "startTime": "2026-01-01T00:00:00Z",
                        "progress": {"display": "3/20", "rewardMean": 0.6254166666,
                                     "rewardDisplay": "0.625"},
                        "workers": {"display": "2/2"}, "cost": {"display": "$1,234.56"}}}))
    # The category "mtrl" spans runs and triggers, so kubectl names the kind there.
    for resource, name in (("mtrlruns", "tiny-target"), ("mtrlrun", "tiny-target"),
                           ("multiturnrlruns", "tiny-target"),
                           ("mtrl", "multiturnrlrun.mtrl.dev/tiny-target")):
        out = cluster.kubectl("get", resource, "-n", namespace).stdout.splitlines()
        assert out[0].split() == ["NAME", "PHASE", "STEP", "REWARD", "WORKERS", "ATTEMPTS",
                                  "COST", "START", "END", "AGE"], resource
        row = out[1].split()
        assert row[:7] == [name, "Running", "3/20", "0.625", "2/2", "2", "$1,234.56"], resource
        # Started long ago; END is blank while the run goes on (kubectl prints nothing there).
        assert row[7].endswith("d") and len(row) == 9, row


def test_defaults_are_applied_by_the_server(cluster: LocalCluster, namespace: str) -> None:
    tiny = (REPO / "manifests" / "examples" / "tiny-cpu.yaml").read_text()
    out = cluster.kubectl("apply", "--dry-run=server", "-n", namespace, "-o", "json", "-f", "-",
                          input=tiny).stdout
    spec = json.loads(out)["spec"]
    assert spec["grpo"]["epsilonHigh"] == 0.28
    assert spec["queues"]["maxReceiveCount"] == 5
    assert spec["trainer"]["launcher"] == "Job"
    assert spec["model"]["lora"]["targetModules"][0] == "q_proj"
    assert spec["grpo"]["scaleRewards"] == "group"
