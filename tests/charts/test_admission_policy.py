"""The chart's ValidatingAdmissionPolicy on the local API server: requests made with a token of
the chart's ServiceAccount that RBAC allows but that would take a cluster over (issue 12: the
aws-auth patch that mapped an IAM role to system:masters, deleting coredns, a RoleBinding in
kube-system) are refused, and so is touching what the operator does not own in a run's
namespace; what the operator does is allowed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from mtrl_testbed import chart_identity
from mtrl_testbed.chart_identity import ChartIdentity
from mtrl_testbed.cluster import CommandFailed, LocalCluster

pytestmark = pytest.mark.cluster

POLICY = f"{chart_identity.FULLNAME}-owned-objects-only"
ATTACKER_ROLE = ("- rolearn: arn:aws:iam::111122223333:role/attacker\n"
                 "  username: attacker\n  groups: [system:masters]\n")
OWNED = {"app.kubernetes.io/managed-by": "mtrl-operator"}


def as_operator(cluster: LocalCluster, identity: ChartIdentity, *args: str,
                input: str | None = None) -> CommandFailed | None:
    """Run kubectl with the ServiceAccount's token; the refusal, or None when it succeeded."""
    try:
        cluster.kubectl(*args, input=input, kubeconfig=identity.kubeconfig)
    except CommandFailed as exc:
        return exc
    return None


def can_i(cluster: LocalCluster, *args: str) -> str:
    return cluster.kubectl("auth", "can-i", f"--as={chart_identity.USERNAME}", *args,
                           check=False).stdout.strip()


def refused_by_policy(error: CommandFailed | None) -> str:
    assert error is not None, "the request was allowed"
    assert f"ValidatingAdmissionPolicy '{POLICY}'" in error.stderr, error.stderr
    return error.stderr


def owned(kind: str, name: str, namespace: str, run_uid: str, **body: Any) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": kind,
        "metadata": {"name": name, "namespace": namespace, "labels": OWNED,
                     "ownerReferences": [{"apiVersion": "mtrl.dev/v1alpha1",
                                          "kind": "MultiTurnRLRun", "name": "r",
                                          "uid": run_uid}]},
        **body})


@pytest.fixture(scope="module")
def kube_system(cluster: LocalCluster) -> Iterator[None]:
    """What EKS has in kube-system and the attack went for: aws-auth and coredns."""
    cluster.kubectl("create", "configmap", "aws-auth", "-n", "kube-system",
                    "--from-literal=mapRoles=")
    cluster.kubectl("create", "deployment", "coredns", "-n", "kube-system", "--replicas=0",
                    "--image=registry.k8s.io/coredns/coredns:v1.11.3")
    yield
    cluster.kubectl("delete", "configmap/aws-auth", "deployment/coredns", "-n", "kube-system",
                    check=False)


def test_rbac_alone_would_allow_the_takeover(cluster: LocalCluster,
                                             operator_identity: ChartIdentity) -> None:
    """RBAC has no "except kube-system" and no "only what I created": a cluster-wide operator
    that may patch ConfigMaps and delete Deployments may do so to aws-auth and coredns. This
    is why the policy exists; the tests below show it refusing."""
    assert can_i(cluster, "patch", "configmaps/aws-auth", "-n", "kube-system") == "yes"
    assert can_i(cluster, "delete", "deployments/coredns", "-n", "kube-system") == "yes"
    assert can_i(cluster, "create", "rolebindings", "-n", "kube-system") == "yes"
    # What RBAC does refuse, after the tightening.
    for args in (("get", "secrets", "-A"), ("update", "configmaps", "-n", "kube-system"),
                 ("patch", "deployments", "-n", "kube-system"), ("create", "pods", "-A"),
                 ("create", "clusterrolebindings"), ("bind", "clusterroles"),
                 ("escalate", "roles", "-n", "kube-system"), ("create", "pods/exec", "-A"),
                 ("delete", "configmaps", "-n", "kube-system"),
                 ("create", "leases.coordination.k8s.io", "-n", "kube-system"),
                 ("update", "leases.coordination.k8s.io", "-n", "default")):
        assert can_i(cluster, *args) == "no", args


def test_the_eks_takeover_requests_are_refused(cluster: LocalCluster, kube_system: None,
                                               operator_identity: ChartIdentity) -> None:
    patch = json.dumps({"data": {"mapRoles": ATTACKER_ROLE}})
    refused_by_policy(as_operator(cluster, operator_identity, "patch", "configmap", "aws-auth",
                                  "-n", "kube-system", "--type=merge", "-p", patch))
    refused_by_policy(as_operator(cluster, operator_identity, "delete", "deployment",
                                  "coredns", "-n", "kube-system"))
    # A binding of permissions the ServiceAccount holds passes RBAC's escalation check; the
    # policy refuses it. cluster-admin is refused by RBAC itself.
    refused_by_policy(as_operator(cluster, operator_identity, "create", "rolebinding",
                                  "takeover", "-n", "kube-system",
                                  f"--clusterrole={chart_identity.FULLNAME}",
                                  "--user=attacker"))
    error = as_operator(cluster, operator_identity, "create", "rolebinding", "takeover", "-n",
                        "kube-system", "--clusterrole=cluster-admin", "--user=attacker")
    assert error is not None and "forbidden" in error.stderr
    # Nothing changed.
    assert cluster.kubectl("get", "configmap", "aws-auth", "-n", "kube-system", "-o",
                           "jsonpath={.data.mapRoles}").stdout == ""
    assert cluster.kubectl("get", "deployment", "coredns", "-n", "kube-system", "-o",
                           "name").stdout.strip() == "deployment.apps/coredns"
    assert cluster.kubectl("get", "rolebindings", "-n", "kube-system", "-o",
                           "name").stdout.count("takeover") == 0


def test_in_a_runs_namespace_only_what_the_operator_owns(
        cluster: LocalCluster, namespace: str, operator_identity: ChartIdentity) -> None:
    ns, uid = namespace, "00000000-0000-0000-0000-000000000001"
    cluster.kubectl("create", "configmap", "team-settings", "-n", ns, "--from-literal=a=b")
    for app in ("team-app", "team-labelled"):
        cluster.kubectl("create", "deployment", app, "-n", ns, "--replicas=0",
                        "--image=example.com/app:1")
    cluster.kubectl("label", "deployment", "team-labelled", "-n", ns,
                    "app.kubernetes.io/managed-by=mtrl-operator")  # a user's own label
    op = (cluster, operator_identity)

    refused_by_policy(as_operator(*op, "patch", "configmap", "team-settings", "-n", ns,
                                  "--type=merge", "-p", '{"data":{"a":"c"}}'))
    refused_by_policy(as_operator(*op, "delete", "deployment", "team-app", "-n", ns))
    # Labelled like ours but owned by no run: not created by the operator, not ours to make.
    refused_by_policy(as_operator(*op, "create", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "unowned", "namespace": ns, "labels": OWNED}})))
    refused_by_policy(as_operator(*op, "create", "configmap", "unlabelled", "-n", ns))
    # A Role that grants more than the progress channel's get/patch on one ConfigMap.
    refused_by_policy(as_operator(*op, "create", "-f", "-", input=owned(
        "Role", "r-progress-writer", ns, uid, apiVersion="rbac.authorization.k8s.io/v1",
        rules=[{"apiGroups": [""], "resources": ["configmaps"],
                "resourceNames": ["team-settings"], "verbs": ["get", "patch"]}])))
    refused_by_policy(as_operator(*op, "create", "-f", "-", input=owned(
        "RoleBinding", "r-progress-writer", ns, uid, apiVersion="rbac.authorization.k8s.io/v1",
        roleRef={"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                 "name": chart_identity.FULLNAME},
        subjects=[{"kind": "ServiceAccount", "name": "default", "namespace": ns}])))
    refused_by_policy(as_operator(*op, "create", "-f", "-", input=json.dumps({
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": "forged", "namespace": ns},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": "x", "namespace": ns},
        "reason": "Forged", "message": "x", "type": "Normal"})))
    # The operator's own writes pass (server-side dry runs: the policy runs on those too).
    assert as_operator(*op, "create", "--dry-run=server", "-f", "-", input=owned(
        "ConfigMap", "r-progress", ns, uid, data={"progress.json": "{}"})) is None
    assert as_operator(*op, "create", "--dry-run=server", "-f", "-", input=owned(
        "Role", "r-progress-writer", ns, uid, apiVersion="rbac.authorization.k8s.io/v1",
        rules=[{"apiGroups": [""], "resources": ["configmaps"],
                "resourceNames": ["r-progress"], "verbs": ["get", "patch"]}])) is None
    assert as_operator(*op, "delete", "--dry-run=server", "deployment", "team-labelled",
                       "-n", ns) is None  # labelled ours: the label is the boundary


def test_only_its_own_lease_in_its_own_namespace(cluster: LocalCluster,
                                                 operator_identity: ChartIdentity) -> None:
    def lease(name: str, namespace: str = chart_identity.NAMESPACE) -> str:
        return json.dumps({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                           "metadata": {"name": name, "namespace": namespace},
                           "spec": {"holderIdentity": "x", "leaseDurationSeconds": 15}})

    op = (cluster, operator_identity)
    assert as_operator(*op, "create", "--dry-run=server", "-f", "-",
                       input=lease("mtrl-operator-default")) is None
    refused_by_policy(as_operator(*op, "create", "-f", "-", input=lease("kube-controller-manager")))
    error = as_operator(*op, "create", "-f", "-", input=lease("mtrl-operator-default",
                                                              "kube-system"))
    assert error is not None and "forbidden" in error.stderr
