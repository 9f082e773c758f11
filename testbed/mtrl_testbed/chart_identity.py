"""The operator's identity as the Helm chart installs it, for operators run as processes.

An operator started with the local cluster's admin certificate may do anything, so a permission
the chart lacks would never fail a test. `install` renders the chart's ServiceAccount, RBAC and
admission policy with the chart's default values (`helm template --show-only`), applies them,
and writes a kubeconfig holding a token of that ServiceAccount (a TokenRequest, as the kubelet
mounts one into the operator's pod). An operator started with it is refused exactly what an
installed one is refused, with one addition: operators started as processes pick their own
operator ids, so each has its own leader-election Lease (mtrl-operator-<id>), where the chart
grants get and update on the one Lease of its operator.id. A Role of the test bed's own grants
those on Leases in the chart's namespace; the chart's admission policy still applies to them.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from mtrl_testbed.cluster import REPO_ROOT, CommandFailed, LocalCluster
from mtrl_testbed.ports import wait_until

CHART = REPO_ROOT / "charts" / "mtrl-operator"
# A release name of its own: tests that `helm install` the chart (release mtrl-operator, as the
# README does) must not meet these cluster-scoped objects (ClusterRoles, the policy) under the
# same names.
RELEASE = "mtrl-testbed"
NAMESPACE = "mtrl-system"
FULLNAME = f"{RELEASE}-mtrl-operator"
"""The chart's full name for this release: its ServiceAccount, ClusterRole, policy prefix."""
SERVICE_ACCOUNT = FULLNAME
USERNAME = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNT}"
"""The user the API server (and its audit log) sees for the operator's requests."""
TEMPLATES = ("serviceaccount.yaml", "rbac.yaml", "admission-policy.yaml")
TOKEN_LIFETIME = "48h"


PROCESS_LEASES = {
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
    "metadata": {"name": "mtrl-testbed-process-leases", "namespace": NAMESPACE},
    "rules": [{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
               "verbs": ["get", "create", "update"]}]}
PROCESS_LEASES_BINDING = {
    "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
    "metadata": {"name": "mtrl-testbed-process-leases", "namespace": NAMESPACE},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                "name": "mtrl-testbed-process-leases"},
    "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": NAMESPACE}]}


@dataclass(frozen=True)
class ChartIdentity:
    token: str
    kubeconfig: Path
    username: str = USERNAME

    @property
    def env(self) -> dict[str, str]:
        """For an operator process: its Lease in the chart's namespace, as in its pod."""
        return {"MTRL_LEASE_NAMESPACE": NAMESPACE}


def install(cluster: LocalCluster, timeout: float = 60) -> ChartIdentity:
    """Apply the chart's ServiceAccount, RBAC and admission policy to `cluster` and return a
    kubeconfig that acts as that ServiceAccount, once the policy is in force."""
    shown = [arg for t in TEMPLATES for arg in ("--show-only", f"templates/{t}")]
    rendered = cluster.helm("template", RELEASE, str(CHART), "-n", NAMESPACE, *shown).stdout
    if cluster.kubectl("get", "namespace", NAMESPACE, check=False).returncode:
        cluster.kubectl("create", "namespace", NAMESPACE)
    cluster.kubectl("apply", "-f", "-", input=rendered)
    cluster.kubectl("apply", "-f", "-", input=yaml.safe_dump_all([PROCESS_LEASES,
                                                                  PROCESS_LEASES_BINDING]))
    token = cluster.kubectl("create", "token", SERVICE_ACCOUNT, "-n", NAMESPACE,
                            "--duration", TOKEN_LIFETIME).stdout.strip()
    kubeconfig = cluster.root / f"{SERVICE_ACCOUNT}.sa.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "mtrl-local", "cluster": {
            "server": cluster.server,
            "certificate-authority": str(cluster.root / "pki" / "ca.crt")}}],
        "users": [{"name": USERNAME, "user": {"token": token}}],
        "contexts": [{"name": "mtrl-local", "context": {"cluster": "mtrl-local",
                                                        "user": USERNAME}}],
        "current-context": "mtrl-local"}))

    def policy_in_force() -> bool:
        """The API server loads a new policy from a watch: until then it lets everything
        through. A dry run of a write the policy forbids tells when it has."""
        try:
            cluster.kubectl("create", "configmap", "mtrl-policy-probe", "-n", "kube-system",
                            "--dry-run=server", kubeconfig=kubeconfig)
        except CommandFailed as exc:
            return "ValidatingAdmissionPolicy" in exc.stderr
        return False

    wait_until(policy_in_force, timeout, "the chart's admission policy in force", interval=0.25)
    return ChartIdentity(token=token, kubeconfig=kubeconfig)
