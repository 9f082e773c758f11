"""The Helm chart: lint, schema, rendered objects valid, and a real install/uninstall in
namespaces that enforce the "restricted" Pod Security Standard, in which the operator runs with
nothing but the chart's RBAC and admission policy."""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from mtrl_api import crdgen
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
CUSTOM_KINDS = {"ServiceMonitor"}
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted",
              "pod-security.kubernetes.io/enforce-version": "latest"}


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(tools_bin() / "helm"), *args], capture_output=True, text=True,
                          check=check)


def render(*sets: str) -> list[dict[str, Any]]:
    """The chart's objects as `helm template` renders them, with helm's own idea of the
    Kubernetes version (no --kube-version): the chart's kubeVersion check must pass with it."""
    args = ["template", "mtrl", str(CHART), "-n", "mtrl-system"]
    for s in sets:
        args += ["--set-json", s]
    return [d for d in yaml.safe_load_all(helm(*args).stdout) if d]


def only(docs: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"].endswith(name_suffix)]
    return doc


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(only(docs, "Deployment")["spec"]["template"]["spec"])


def env_of(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom"))
            for e in pod_spec(docs)["containers"][0]["env"]}


def test_helm_reports_its_release_and_kubernetes_version() -> None:
    """helm built from Go modules reports v3.19.5 and assumes the Kubernetes of its client-go
    (1.34), not v1.20: `helm template` passes the chart's kubeVersion >=1.30 by itself."""
    assert helm("version", "--template", "{{ .Version }}").stdout == "v3.19.5"
    out = helm("template", "mtrl", str(CHART), check=False)
    assert out.returncode == 0, out.stderr


def test_lint_is_clean() -> None:
    out = helm("lint", "--strict", str(CHART), "--set-json", 'watchNamespaces=["a","b"]')
    assert "0 chart(s) failed" in out.stdout


@pytest.mark.parametrize("values", [[], ['watchNamespaces=["team-a","team-b"]'],
                                    ['metrics={"port":8080,"serviceMonitor":{"enabled":true}}']],
                         ids=["cluster-wide", "namespaced", "servicemonitor"])
def test_rendered_objects_match_the_kubernetes_schemas(values: list[str]) -> None:
    docs = render(*values)
    assert {"Deployment", "ServiceAccount", "ValidatingAdmissionPolicy",
            "PodDisruptionBudget"} <= {d["kind"] for d in docs}
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
    bound = {b["roleRef"]["name"] for b in docs if b["kind"] == "ClusterRoleBinding"}
    cluster_rules = [r for d in docs if d["kind"] == "ClusterRole" for r in d["rules"]
                     if d["metadata"]["name"] in bound and "pre-delete" not in d["metadata"].get(
                         "annotations", {}).get("helm.sh/hook", "")]
    assert {g for r in cluster_rules for g in r["apiGroups"]} == {"apiextensions.k8s.io", ""}
    assert all(set(r["verbs"]) <= {"get", "list", "watch"} for r in cluster_rules)
    policy = only(docs, "ValidatingAdmissionPolicy")
    assert '["team-a","team-b"]' in policy["spec"]["validations"][0]["expression"]


def test_leader_election_is_wired_to_the_lease_contract() -> None:
    docs = render()
    env = env_of(docs)
    assert env["MTRL_LEADER_ELECT"] == "true"
    assert (env["MTRL_LEASE_DURATION_SECONDS"], env["MTRL_RENEW_DEADLINE_SECONDS"],
            env["MTRL_RETRY_PERIOD_SECONDS"]) == ("15", "10", "2")
    assert env["MTRL_LEASE_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["MTRL_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert "MTRL_PEERING" not in env
    assert not [d for d in docs if "kopf" in json.dumps(d)]
    role = only(docs, "Role", "-leader-election")
    assert role["metadata"]["namespace"] == "mtrl-system"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
         "resourceNames": ["mtrl-operator-default"], "verbs": ["get", "update"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]}]
    # The Lease is the release's, so `helm uninstall` deletes it: no holder until a replica
    # takes it, and the release's labels (which the operator's renewals keep).
    lease = only(docs, "Lease")
    assert (lease["metadata"]["name"], lease["metadata"]["namespace"]) == (
        "mtrl-operator-default", "mtrl-system")
    assert lease["metadata"]["labels"]["app.kubernetes.io/instance"] == "mtrl"
    assert lease["spec"] == {}
    off = render('leaderElection={"enabled":false}')
    assert env_of(off)["MTRL_LEADER_ELECT"] == "false"
    assert not [d for d in off if d["metadata"]["name"].endswith("-leader-election")]
    assert not [d for d in off if d["kind"] == "Lease"]
    out = helm("template", "mtrl", str(CHART), "--set-json", 'operator={"id":"Team_A"}',
               check=False)
    assert out.returncode != 0 and "not a valid object name" in out.stderr


def test_two_replicas_get_a_disruption_budget_and_spread_over_nodes() -> None:
    docs = render()
    assert only(docs, "PodDisruptionBudget")["spec"]["maxUnavailable"] == 1
    anti = pod_spec(docs)["affinity"]["podAntiAffinity"]
    (term,) = anti["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    hard = pod_spec(render('podAntiAffinity="hard"'))["affinity"]["podAntiAffinity"]
    assert "requiredDuringSchedulingIgnoredDuringExecution" in hard
    own = {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []},
           "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
               "nodeSelectorTerms": [{"matchExpressions": [
                   {"key": "pool", "operator": "In", "values": ["system"]}]}]}}}
    assert pod_spec(render(f"affinity={json.dumps(own)}"))["affinity"] == own
    single = render("replicas=1")
    assert "affinity" not in pod_spec(single)
    assert not [d for d in single if d["kind"] == "PodDisruptionBudget"]


def test_kuberay_style_values_reach_the_pod() -> None:
    docs = render('nameOverride="rlops"', 'imagePullSecrets=[{"name":"regcred"}]',
                  'priorityClassName="ops-critical"', 'podLabels={"team":"ml"}',
                  'livenessProbe={"periodSeconds":7,"failureThreshold":9}',
                  'readinessProbe={"periodSeconds":3}',
                  'podSecurityContext={"runAsNonRoot":true,"runAsUser":1000,'
                  '"seccompProfile":{"type":"RuntimeDefault"}}')
    dep = only(docs, "Deployment")
    assert dep["metadata"]["name"] == "mtrl-rlops"
    pod = dep["spec"]["template"]
    assert pod["metadata"]["labels"]["team"] == "ml"
    assert dep["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "rlops",
                                                      "app.kubernetes.io/instance": "mtrl"}
    spec = pod["spec"]
    assert spec["imagePullSecrets"] == [{"name": "regcred"}]
    assert spec["priorityClassName"] == "ops-critical"
    assert spec["securityContext"]["runAsUser"] == 1000
    container = spec["containers"][0]
    assert container["livenessProbe"] == {"httpGet": {"path": "/healthz", "port": "health"},
                                          "initialDelaySeconds": 10, "periodSeconds": 7,
                                          "timeoutSeconds": 5, "failureThreshold": 9}
    assert container["readinessProbe"]["periodSeconds"] == 3
    hook = only(docs, "Job")["spec"]["template"]["spec"]
    assert hook["imagePullSecrets"] == [{"name": "regcred"}]
    full = render('fullnameOverride="ops-mtrl"')
    assert {d["metadata"]["name"] for d in full if d["kind"] in ("Deployment", "ServiceAccount",
                                                                 "ClusterRole")} >= {
        "ops-mtrl", "ops-mtrl-discovery"}


def test_namespace_users_with_edit_or_view_get_runs_and_triggers() -> None:
    docs = render()
    view = only(docs, "ClusterRole", "-aggregate-view")
    edit = only(docs, "ClusterRole", "-aggregate-edit")
    assert view["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-view"] == "true"
    assert "rbac.authorization.k8s.io/aggregate-to-view" not in edit["metadata"]["labels"]
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert {"multiturnrlruns", "multiturnrltriggers"} <= set(edit["rules"][0]["resources"])
    assert "create" in edit["rules"][0]["verbs"]
    assert not [d for d in render("createAggregateClusterRoles=false")
                if d["metadata"]["name"].endswith(("-aggregate-view", "-aggregate-edit"))]


def test_operator_pod_is_locked_down() -> None:
    pod = pod_spec(render())
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["resources"]["requests"] and container["livenessProbe"]
    assert container["readinessProbe"]


@pytest.mark.parametrize(("values", "message"), [
    ('replicas="two"', "/replicas"),
    ('watchNamespaces="team-a"', "/watchNamespaces"),
    ('aws={"subnets":["10.0.0.0/24"]}', "/aws/subnets/0"),
    ('metrics={"port":70000}', "/metrics/port"),
    ('operatr={"id":"x"}', "operatr"),
    ('podAntiAffinity="always"', "/podAntiAffinity"),
    ('leaderElection={"enabled":"yes"}', "/leaderElection/enabled"),
    ('admissionPolicy={"protectedNamespaces":["Kube_System"]}',
     "/admissionPolicy/protectedNamespaces/0"),
])
def test_wrong_values_fail_at_install_with_a_clear_message(values: str, message: str) -> None:
    out = helm("template", "mtrl", str(CHART), "--set-json", values, check=False)
    assert out.returncode != 0 and message in out.stderr, out.stderr


def test_chart_crds_are_the_generated_ones() -> None:
    for name in crdgen.all_crds():
        assert (CHART / "crds" / name).read_text() == (CHART.parents[1] / "crds" / name).read_text()


@pytest.mark.cluster
@pytest.mark.aws
@pytest.mark.slow
def test_install_run_and_uninstall_in_restricted_namespaces_with_only_the_charts_rbac(
        cluster: LocalCluster, pods_reach_moto: None, aws_env: dict[str, str]) -> None:
    """Both namespaces enforce the "restricted" Pod Security Standard: the operator's pod, the
    run's worker and trainer pods and the uninstall hook's pod must all be admitted. The
    release has a name of its own: the session's operators use the chart's cluster-wide
    objects under the default one."""
    suffix = uuid.uuid4().hex[:5]
    release, release_ns, runs_ns = f"mtrl-{suffix}", f"mtrl-system-{suffix}", f"chart-{suffix}"
    for ns in (release_ns, runs_ns):
        cluster.kubectl("create", "namespace", ns)
        cluster.kubectl("label", "namespace", ns, *(f"{k}={v}" for k, v in RESTRICTED.items()))
    # The chart's defaults (two replicas, one leading) but for the scope, fast loops, and ports
    # of its own: operator pods are processes on the test bed's one host.
    values = {"watchNamespaces": [runs_ns], "operator": {
        "id": f"chart-{suffix}", "resyncSeconds": 3, "sweepIntervalSeconds": 0},
        "metrics": {"port": 19090}, "health": {"port": 19091},
        "cleanupOnUninstall": {"enabled": True, "timeoutSeconds": 120}}
    sets = [arg for key, value in values.items()
            for arg in ("--set-json", f"{key}={json.dumps(value)}")]
    out = cluster.helm("install", release, str(CHART), "-n", release_ns, "--wait", "--timeout",
                       "120s", *sets).stdout
    notes = out[out.index("NOTES:"):]
    for line in ("kubectl get mtrlruns", "kubectl explain mtrlrun.spec", "manifests/examples/",
                 f"get lease mtrl-operator-chart-{suffix}", f"watching {runs_ns}"):
        assert line in notes, notes
    sa = f"system:serviceaccount:{release_ns}:{release}-mtrl-operator"
    wait_for(lambda: cluster.kubectl(
        "get", "lease", f"mtrl-operator-chart-{suffix}", "-n", release_ns, "-o",
        "jsonpath={.spec.holderIdentity}", check=False).stdout.startswith(
        f"{release}-mtrl-operator-"), 60, "one of the two replicas to hold the Lease")

    def lease() -> dict[str, Any]:
        return dict(json.loads(cluster.kubectl("get", "lease", f"mtrl-operator-chart-{suffix}",
                                               "-n", release_ns, "-o", "json").stdout))

    # The Lease is the release's, and the leader's renewals keep its labels and Helm's
    # annotations; an upgrade leaves the held Lease alone (the template's spec is empty and
    # unchanged, so helm's three-way merge has nothing to patch there).
    held = lease()
    assert held["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm", held
    assert held["metadata"]["annotations"]["meta.helm.sh/release-name"] == release, held
    cluster.helm("upgrade", release, str(CHART), "-n", release_ns, "--reuse-values", "--wait",
                 "--timeout", "120s")
    after = lease()
    assert after["spec"]["holderIdentity"] == held["spec"]["holderIdentity"], (held, after)
    assert after["spec"].get("leaseTransitions") == held["spec"].get("leaseTransitions")
    assert after["metadata"]["labels"] == held["metadata"]["labels"], (held, after)

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
    refused = cluster.kubectl("get", "events", "-n", runs_ns, "--field-selector",
                              "reason=FailedCreate", "-o", "jsonpath={.items[*].message}").stdout
    assert not refused, refused  # a ReplicaSet or Job whose pods Pod Security refused

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
    cluster.helm("uninstall", release, "-n", release_ns, "--wait", "--timeout", "240s")
    assert get(cluster, runs_ns, "unfinished") is None
    names = names_of(running, operator_id=f"chart-{suffix}")
    assert not aws_leftovers(names)
    # The workers' Deployment went in the background: its pods drain (up to one long poll)
    # and go within their grace period.
    wait_for(lambda: not k8s_leftovers(cluster, runs_ns, names.uid), 60,
             "the unfinished run's pods to finish terminating")
    assert get_trigger(cluster, runs_ns, "charted-trigger") is None
    assert not runs_of(cluster, runs_ns, "charted-trigger")
    trigger_names = trigger_names_of(trigger, operator_id=f"chart-{suffix}")
    assert not queue_exists(trigger_names.queue) and not queue_exists(
        trigger_names.dead_letter_queue)
    assert notification_ids(bucket) == set()
    wait_for(lambda: not cluster.kubectl("get", "all", "-n", release_ns, "-o",
                                         "name").stdout.split(), 60,
             "every object of the release to go (the operator pod terminates gracefully)")
    # The Lease too: the chart's, deleted with the release, not left naming the old leader.
    lease = cluster.kubectl("get", "lease", f"mtrl-operator-chart-{suffix}", "-n", release_ns,
                            check=False)
    assert "NotFound" in lease.stderr, lease.stdout + lease.stderr
