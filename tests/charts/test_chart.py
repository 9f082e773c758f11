"""The Helm chart: lint, schema, rendered objects valid, and a real install/uninstall in which
the operator runs with nothing but the chart's RBAC."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from mtrl_operator.api import crdgen
from mtrl_testbed.cluster import LocalCluster, tools_bin
from tests.operator.runs import (
    HANG,
    apply,
    aws_leftovers,
    get,
    k8s_leftovers,
    names_of,
    run_manifest,
    wait_for,
    wait_phase,
)
from tests.operator.triggers import (
    get_trigger,
    new_bucket,
    notification_ids,
    queue_exists,
    runs_of,
    trigger_manifest,
    upload,
    wait_reason,
)
from tests.operator.triggers import names_of as trigger_names_of

CHART = Path(__file__).resolve().parents[2] / "charts" / "mtrl-operator"
CUSTOM_KINDS = {"ClusterKopfPeering", "KopfPeering", "ServiceMonitor"}
KUBE_VERSION = ["--kube-version", "1.34.4"]  # helm template assumes an old one otherwise


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tools_bin() / "helm"), *args], capture_output=True, text=True,
                          check=check)


def render(*sets: str) -> list[dict]:
    args = ["template", "mtrl", str(CHART), "-n", "mtrl-system", *KUBE_VERSION]
    for s in sets:
        args += ["--set-json", s]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def test_lint_is_clean() -> None:
    out = helm("lint", "--strict", str(CHART), "--set-json", 'watchNamespaces=["a","b"]')
    assert "0 chart(s) failed" in out.stdout


@pytest.mark.parametrize("values", [[], ['watchNamespaces=["team-a","team-b"]'],
                                    ['metrics={"port":8080,"serviceMonitor":{"enabled":true}}']],
                         ids=["cluster-wide", "namespaced", "servicemonitor"])
def test_rendered_objects_match_the_kubernetes_schemas(values: list[str]) -> None:
    docs = render(*values)
    assert {"Deployment", "ServiceAccount"} <= {d["kind"] for d in docs}
    for doc in docs:
        if doc["kind"] in CUSTOM_KINDS:
            continue
        kubernetes_validate.validate(doc, "1.34.0", strict=True)


def test_rbac_has_no_wildcards_and_no_secrets() -> None:
    for values in ([], ['watchNamespaces=["team-a"]']):
        for doc in render(*values):
            for rule in doc.get("rules", []):
                assert "*" not in rule["verbs"] and "*" not in rule["resources"], rule
                assert "secrets" not in rule["resources"], rule


def test_namespaced_mode_grants_only_listed_namespaces() -> None:
    docs = render('watchNamespaces=["team-a","team-b"]')
    roles = [(d["kind"], d["metadata"].get("namespace")) for d in docs
             if d["kind"] in ("Role", "ClusterRole")]
    assert ("Role", "team-a") in roles and ("Role", "team-b") in roles
    cluster_rules = [r for d in docs if d["kind"] == "ClusterRole" for r in d["rules"]
                     if "pre-delete" not in d["metadata"].get("annotations", {}).get(
                         "helm.sh/hook", "")]
    assert {g for r in cluster_rules for g in r["apiGroups"]} == {"apiextensions.k8s.io", ""}


def test_operator_pod_is_locked_down() -> None:
    (dep,) = [d for d in render() if d["kind"] == "Deployment"]
    pod = dep["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["resources"]["requests"] and container["livenessProbe"]
    assert container["readinessProbe"]


@pytest.mark.parametrize(("values", "message"), [
    ('replicas="two"', "/replicas"),
    ('watchNamespaces="team-a"', "/watchNamespaces"),
    ('aws={"subnets":["10.0.0.0/24"]}', "/aws/subnets/0"),
    ('metrics={"port":70000}', "/metrics/port"),
    ('operatr={"id":"x"}', "operatr"),
])
def test_wrong_values_fail_at_install_with_a_clear_message(values: str, message: str) -> None:
    out = helm("template", "mtrl", str(CHART), *KUBE_VERSION, "--set-json", values, check=False)
    assert out.returncode != 0 and message in out.stderr, out.stderr


def test_chart_crds_are_the_generated_ones() -> None:
    for name in crdgen.all_crds():
        assert (CHART / "crds" / name).read_text() == (crdgen.DESTINATIONS[0] / name).read_text()


@pytest.mark.cluster
@pytest.mark.aws
@pytest.mark.slow
def test_install_run_and_uninstall_with_only_the_charts_rbac(
        cluster: LocalCluster, pods_reach_moto: None, aws_env: dict[str, str]) -> None:
    suffix = uuid.uuid4().hex[:5]
    release_ns, runs_ns = f"mtrl-system-{suffix}", f"chart-{suffix}"
    for ns in (release_ns, runs_ns):
        cluster.kubectl("create", "namespace", ns)
    values = {"replicas": 1, "watchNamespaces": [runs_ns], "operator": {
        "id": f"chart-{suffix}", "resyncSeconds": 3, "sweepIntervalSeconds": 0},
        "metrics": {"port": 19090}, "health": {"port": 19091},
        "cleanupOnUninstall": {"enabled": True, "timeoutSeconds": 120}}
    cluster.helm("install", "mtrl-operator", str(CHART), "-n", release_ns, "--wait", "--timeout",
                 "120s", "--set-json", f"replicas={values['replicas']}",
                 "--set-json", f"watchNamespaces={json.dumps(values['watchNamespaces'])}",
                 "--set-json", f"operator={json.dumps(values['operator'])}",
                 "--set-json", f"metrics={json.dumps(values['metrics'])}",
                 "--set-json", f"health={json.dumps(values['health'])}",
                 "--set-json", f"cleanupOnUninstall={json.dumps(values['cleanupOnUninstall'])}")
    sa = f"system:serviceaccount:{release_ns}:mtrl-operator"

    def can(*args: str) -> bool:
        out = cluster.kubectl("auth", "can-i", f"--as={sa}", *args, check=False)
        return out.stdout.strip() == "yes"

    # Not excessive: no Secrets anywhere, nothing outside the listed namespace.
    assert not can("get", "secrets", "-n", runs_ns)
    assert not can("list", "secrets", "--all-namespaces")
    assert not can("create", "jobs", "-n", "default")
    assert not can("delete", "multiturnrlruns.mtrl.dev", "-n", "default")
    assert not can("watch", "multiturnrltriggers.mtrl.dev", "-n", "default")
    assert can("create", "jobs", "-n", runs_ns)
    assert can("watch", "multiturnrltriggers.mtrl.dev", "-n", runs_ns)

    # Sufficient: the operator pod (run by the node agent with the ServiceAccount's token)
    # takes a run all the way and cleans up.
    apply(cluster, runs_ns, run_manifest("charted"))
    run = wait_phase(cluster, runs_ns, "charted", "Succeeded", timeout=120)
    names = names_of(run, operator_id=f"chart-{suffix}")
    wait_for(lambda: not aws_leftovers(names) and not k8s_leftovers(cluster, runs_ns, names.uid),
             60, "the charted run's resources to go")

    # A trigger works with the chart's RBAC too: it makes its queue, and a run from an upload.
    bucket = new_bucket()
    apply(cluster, runs_ns, trigger_manifest("charted-trigger", bucket))
    trigger = wait_reason(cluster, runs_ns, "charted-trigger", timeout=120)
    upload(bucket, "incoming/charted.jsonl")
    wait_for(lambda: runs_of(cluster, runs_ns, "charted-trigger"), 60, "a run from an upload")

    # Uninstall with a run still training and the trigger in place: the pre-delete hook
    # deletes them, the operator tears them down, and nothing is stranded behind a finalizer.
    apply(cluster, runs_ns, run_manifest("unfinished", trainer={"command": HANG}))
    running = wait_phase(cluster, runs_ns, "unfinished", "Running", timeout=120)
    cluster.helm("uninstall", "mtrl-operator", "-n", release_ns, "--wait", "--timeout", "240s")
    assert get(cluster, runs_ns, "unfinished") is None
    names = names_of(running, operator_id=f"chart-{suffix}")
    assert not aws_leftovers(names)
    assert not k8s_leftovers(cluster, runs_ns, names.uid)
    assert get_trigger(cluster, runs_ns, "charted-trigger") is None
    assert not runs_of(cluster, runs_ns, "charted-trigger")
    trigger_names = trigger_names_of(trigger, operator_id=f"chart-{suffix}")
    assert not queue_exists(trigger_names.queue) and not queue_exists(
        trigger_names.dead_letter_queue)
    assert notification_ids(bucket) == set()
    wait_for(lambda: not cluster.kubectl("get", "all", "-n", release_ns, "-o",
                                         "name").stdout.split(), 60,
             "every object of the release to go (the operator pod terminates gracefully)")
