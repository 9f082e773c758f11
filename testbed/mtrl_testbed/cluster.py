"""A real Kubernetes control plane from locally built binaries, without Docker.

etcd + kube-apiserver + kube-controller-manager + kube-scheduler run as child processes on
loopback ports, with generated certificates and a kubeconfig that plain `kubectl` and `helm`
use. Pods run through `mtrl_testbed.node_agent`, which registers HyperPod-like nodes and runs
each pod's command as a local process.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from mtrl_testbed import certs, webhooks
from mtrl_testbed.kueue import Kueue
from mtrl_testbed.ports import ServerExited, free_port, wait_until
from mtrl_testbed.training_operator import TrainingOperator

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-tools.sh"
SERVICE_CIDR = "10.0.0.0/24"

# Client identities: file stem -> (user, group).
_CLIENTS = {
    "admin": ("mtrl-admin", "system:masters"),
    "controller-manager": ("system:kube-controller-manager", None),
    "scheduler": ("system:kube-scheduler", None),
    "node-agent": ("mtrl-node-agent", "system:masters"),
}
# The API server's identity towards the node agent's log endpoint (`kubectl logs`).
_KUBELET_CLIENT = {"apiserver-kubelet-client": ("kube-apiserver-kubelet-client", None)}
# Controllers that need clouds, kubelets or node health we do not simulate.
_DISABLED_CONTROLLERS = ("node-ipam-controller", "node-lifecycle-controller",
                         "cloud-node-lifecycle-controller", "service-lb-controller",
                         "node-route-controller", "persistentvolume-attach-detach-controller",
                         "bootstrap-signer-controller", "token-cleaner-controller",
                         "ttl-controller")


class CommandFailed(subprocess.CalledProcessError):
    """A failed kubectl or helm call whose message carries what the tool said."""

    def __init__(self, cmd: list[str], result: subprocess.CompletedProcess[str]) -> None:
        super().__init__(result.returncode, cmd, result.stdout, result.stderr)

    def __str__(self) -> str:
        return f"{' '.join(self.cmd[:1] + self.cmd[3:])} exited {self.returncode}: {self.stderr}"


def tools_bin() -> Path:
    """Directory holding the control-plane binaries, building them on first use."""
    if env := os.environ.get("MTRL_TOOLS_BIN"):
        return Path(env)
    out = subprocess.run(["bash", str(BUILD_SCRIPT)], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


@dataclass
class LocalCluster:
    """The control plane's processes and files under `root`."""

    root: Path
    bin_dir: Path = field(default_factory=tools_bin)
    nodes: int = 2
    etcd_port: int = field(default_factory=free_port)
    etcd_peer_port: int = field(default_factory=free_port)
    api_port: int = field(default_factory=free_port)
    kubelet_port: int = field(default_factory=free_port)
    """The node agent's log endpoint (the kubelet's port), registered in every Node."""
    audit_users: tuple[str, ...] = ()
    """Users whose requests the API server writes to `audit_log` (one line per request)."""
    training_operator: bool = False
    """Run Kubeflow's training operator (PyTorchJob), the real one, with its webhook."""
    kueue: bool = False
    """Run Kueue, the real one, with its webhooks (for Jobs and, with the training operator,
    PyTorchJobs)."""
    node_ip: str | None = None
    """The machine's own address, for a real node (`kubelet_node`): the API server then also
    listens there and publishes it as the `kubernetes` Service's endpoint, so pods reach it at
    `kubernetes.default` through kube-proxy. None: loopback only, no endpoint (node agent)."""
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Kubeconfigs name certificate files by path, and client-go reads a relative one
        # relative to the kubeconfig's folder: `make dev-up` passes `.cluster`.
        self.root = Path(self.root).resolve()

    # ------------------------------------------------------------------ paths and clients

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def audit_log(self) -> Path:
        return self.root / "logs" / "audit.jsonl"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    def env(self) -> dict[str, str]:
        """Environment for kubectl, helm and the operator: KUBECONFIG and PATH with the tools."""
        return {"KUBECONFIG": str(self.kubeconfig),
                "PATH": f"{self.bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin_dir / "kubectl"), "--kubeconfig", str(kubeconfig or self.kubeconfig),
               *args]
        result = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise CommandFailed(cmd, result)
        return result

    def identity(self) -> str:
        """The UID of the kube-system namespace: an operator's default cluster identity, in
        the `mtrl.dev/cluster-id` tag of everything it makes in AWS."""
        return self.kubectl("get", "namespace", "kube-system", "-o",
                            "jsonpath={.metadata.uid}").stdout.strip()

    @contextlib.contextmanager
    def namespace(self, name: str) -> Iterator[str]:
        """A namespace for the duration of a `with` block (deleted without waiting)."""
        self.kubectl("create", "namespace", name)
        try:
            yield name
        finally:
            self.kubectl("delete", "namespace", name, "--wait=false", check=False)

    def helm(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin_dir / "helm"), "--kubeconfig", str(self.kubeconfig), *args]
        env = {**os.environ, "HELM_CACHE_HOME": str(self.root / "helm" / "cache"),
               "HELM_CONFIG_HOME": str(self.root / "helm" / "config"),
               "HELM_DATA_HOME": str(self.root / "helm" / "data")}
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
        if check and result.returncode != 0:
            raise CommandFailed(cmd, result)
        return result

    def install_crds(self, path: Path, timeout: float = 60) -> list[str]:
        """Apply the CRDs in `path` (file or folder) and wait until each is served."""
        out = self.kubectl("apply", "--server-side", "--force-conflicts", "-o", "name",
                           "-f", str(path))
        names = [line.split("/", 1)[1] for line in out.stdout.split() if "/" in line]

        def served() -> bool:
            """Established, and listable: right after that the API server may still answer
            429 "storage is (re)initializing" while its watch cache fills."""
            for name in names:
                cond = self.kubectl("get", "crd", name, "-o", "jsonpath={.status.conditions["
                                    "?(@.type=='Established')].status}", check=False).stdout
                if cond.strip() != "True" or self.kubectl(
                        "get", name, "--all-namespaces", "-o", "name", check=False).returncode:
                    return False
            return True

        wait_until(served, timeout, f"CRDs {names} served", interval=0.25)
        return names

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 120) -> LocalCluster:
        for stale in ("etcd", "pods", "logs"):  # a fresh cluster every start
            shutil.rmtree(self.root / stale, ignore_errors=True)
        (self.root / "logs").mkdir(parents=True)
        pki = certs.generate(self.root / "pki", clients={**_CLIENTS, **_KUBELET_CLIENT},
                             apiserver_ips=(self.node_ip,) if self.node_ip else ())
        for stem in _CLIENTS:
            self._write_kubeconfig(self.root / f"{stem}.kubeconfig", pki, stem)
        shutil.copy(self.root / "admin.kubeconfig", self.kubeconfig)
        try:
            self._start_etcd(timeout)
            self._start_apiserver(pki, timeout)
            self._spawn("kube-controller-manager", [
                "--kubeconfig", str(self.root / "controller-manager.kubeconfig"),
                "--authentication-skip-lookup=true",
                "--leader-elect=false",
                "--secure-port=0",
                "--service-account-private-key-file", str(pki.path("sa.key")),
                "--root-ca-file", str(pki.ca_cert),
                "--cluster-signing-cert-file", str(pki.ca_cert),
                "--cluster-signing-key-file", str(pki.path("ca.key")),
                "--use-service-account-credentials=true",
                "--controllers", ",".join(["*", *(f"-{c}" for c in self._disabled_controllers())]),
                "--concurrent-gc-syncs=5",
            ])
            self._spawn("kube-scheduler", [
                "--kubeconfig", str(self.root / "scheduler.kubeconfig"),
                "--authentication-skip-lookup=true",
                "--leader-elect=false",
                "--secure-port=0",
            ])
            self._spawn("node-agent", [
                "--kubeconfig", str(self.root / "node-agent.kubeconfig"),
                "--nodes", str(self.nodes), "--work-dir", str(self.root / "pods"),
                "--kubelet-port", str(self.kubelet_port),
                "--tls-cert-file", str(pki.path("kubelet.crt")),
                "--tls-private-key-file", str(pki.path("kubelet.key")),
                "--client-ca-file", str(pki.ca_cert),
            ], python_module="mtrl_testbed.node_agent")
            wait_until(self._default_service_account_exists, timeout,
                       "kube-controller-manager (default ServiceAccount)", interval=0.5)
            wait_until(self._nodes_ready, timeout, "node agent (Ready nodes)", interval=0.5)
            if self.training_operator:
                self._start_training_operator(timeout)
            if self.kueue:
                self._start_kueue(timeout)
        except Exception:
            self.stop()
            raise
        self._write_state()
        return self

    def stop(self) -> None:
        for name in reversed(list(self._procs)):
            proc = self._procs.pop(name)
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        state = self.root / "state.json"
        if state.exists():
            state.unlink()

    def pids(self, names: tuple[str, ...]) -> dict[str, int]:
        return {name: self._procs[name].pid for name in names}

    def processes_alive(self) -> dict[str, bool]:
        return {name: proc.poll() is None for name, proc in self._procs.items()}

    def restart_apiserver(self, grace: float = 3, timeout: float = 120) -> float:
        """Stop kube-apiserver and start it again on the same port with the same flags and
        certificates; etcd keeps the data. Returns the seconds it was not serving.

        SIGTERM stops the listener at once, but the process then waits for open watch
        streams to end (minutes); after `grace` seconds it is killed, as a supervisor would."""
        order = list(self._procs)
        proc = self._procs.pop("kube-apiserver")
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        self._start_apiserver(certs.Pki(self.root / "pki"), timeout)
        self._procs = {name: self._procs[name] for name in order}  # stop() keeps its order
        if (self.root / "state.json").exists():
            self._write_state()
        return time.monotonic() - began

    # ------------------------------------------------------------------ internals

    def _spawn(self, name: str, args: list[str], python_module: str | None = None,
               binary: Path | None = None, env: dict[str, str] | None = None) -> None:
        log = open(self.root / "logs" / f"{name}.log", "ab")  # noqa: SIM115 (owned by the child)
        cmd = ([sys.executable, "-m", python_module, *args] if python_module
               else [str(binary or self.bin_dir / name), *args])
        self._procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True,
                                             env={**os.environ, **(env or {})})

    def _start_kueue(self, timeout: float) -> None:
        kueue = Kueue(self.root / "kueue")
        pki = kueue.prepare(self.kubectl)
        # Its rotator is ready once it has put its CA into these (conversion CRDs included).
        webhooks.apply(self.kubectl, *kueue.crds(pki), *kueue.webhook_configurations(pki))
        self._run_controller("kueue", kueue, kueue.args(),
                             {"KUBECONFIG": str(self.kubeconfig)}, timeout)

    def _start_training_operator(self, timeout: float) -> None:
        to = TrainingOperator(self.root / "training-operator")
        self.install_crds(to.crd)
        pki = to.prepare(self.kubectl)
        # Its cert rotator is ready only once it has put the CA into this configuration.
        webhooks.apply(self.kubectl, to.webhook_configuration(pki))
        self._run_controller("training-operator", to, to.args(self.kubeconfig), to.env(),
                             timeout)

    def _run_controller(self, name: str, controller: webhooks.Controller, args: list[str],
                        env: dict[str, str], timeout: float) -> None:
        """Start a third-party controller and wait for its /readyz."""
        self._spawn(name, args, binary=controller.binary, env=env)

        def ready() -> bool:
            self._check_alive(name)
            return controller.ready()

        wait_until(ready, timeout, f"{name} (/readyz)", interval=0.25)

    def _start_etcd(self, timeout: float) -> None:
        self._spawn("etcd", [
            "--name", "mtrl-local",
            "--data-dir", str(self.root / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{self.etcd_peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{self.etcd_peer_port}",
            "--initial-cluster", f"mtrl-local=http://127.0.0.1:{self.etcd_peer_port}",
            "--unsafe-no-fsync",  # a throwaway test store; fsync only costs time here
            "--quota-backend-bytes", str(2 * 1024**3),
            "--log-level", "warn",
        ])

        def healthy() -> bool:
            self._check_alive("etcd")
            url = f"http://127.0.0.1:{self.etcd_port}/health"
            with urllib.request.urlopen(url, timeout=2) as resp:
                return json.load(resp).get("health") == "true"

        wait_until(healthy, timeout, "etcd")

    def _start_apiserver(self, pki: certs.Pki, timeout: float) -> None:
        self._spawn("kube-apiserver", [
            "--etcd-servers", f"http://127.0.0.1:{self.etcd_port}",
            *self._address_flags(),
            "--secure-port", str(self.api_port),
            "--tls-cert-file", str(pki.path("apiserver.crt")),
            "--tls-private-key-file", str(pki.path("apiserver.key")),
            "--client-ca-file", str(pki.ca_cert),
            "--service-account-key-file", str(pki.path("sa.pub")),
            "--service-account-signing-key-file", str(pki.path("sa.key")),
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--api-audiences", "https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range", SERVICE_CIDR,
            "--authorization-mode", "RBAC",
            "--allow-privileged=true",
            "--profiling=false",
            "--watch-cache=true",
            "--max-requests-inflight", "2000",
            "--max-mutating-requests-inflight", "1000",
            # pods/log: to each Node's InternalIP (loopback) and kubelet port, as this client;
            # without --kubelet-certificate-authority it does not verify the serving cert.
            "--kubelet-preferred-address-types", "InternalIP",
            "--kubelet-client-certificate", str(pki.path("apiserver-kubelet-client.crt")),
            "--kubelet-client-key", str(pki.path("apiserver-kubelet-client.key")),
            *self._audit_flags(),
        ])
        ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
        ctx.load_cert_chain(str(pki.path("admin.crt")), str(pki.path("admin.key")))

        def ready() -> bool:
            self._check_alive("kube-apiserver")
            with urllib.request.urlopen(f"{self.server}/readyz", context=ctx, timeout=2) as r:
                return r.status == 200

        wait_until(ready, timeout, "kube-apiserver", interval=0.25)

    def _disabled_controllers(self) -> tuple[str, ...]:
        """A real kubelet registers its Node with the `node.kubernetes.io/not-ready:NoSchedule`
        taint, which only the node lifecycle controller removes once the Node is Ready; the node
        agent's Nodes never carry it (and send no heartbeats the controller would judge)."""
        if self.node_ip is None:
            return _DISABLED_CONTROLLERS
        return tuple(c for c in _DISABLED_CONTROLLERS if c != "node-lifecycle-controller")

    def _address_flags(self) -> list[str]:
        if self.node_ip is None:
            return ["--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1",
                    "--endpoint-reconciler-type", "none"]
        # Every address (loopback for the kubeconfigs, the machine's for pods), the machine's
        # in the `kubernetes` Service's endpoints (the lease reconciler, the default).
        return ["--bind-address", "0.0.0.0", "--advertise-address", self.node_ip]

    def _audit_flags(self) -> list[str]:
        if not self.audit_users:
            return []
        policy = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy",
                  # One line per request, written when it completes.
                  "omitStages": ["RequestReceived", "ResponseStarted"],
                  "rules": [{"level": "Metadata", "users": list(self.audit_users)},
                            {"level": "None"}]}
        path = self.root / "audit-policy.yaml"
        path.write_text(yaml.safe_dump(policy))
        return ["--audit-policy-file", str(path), "--audit-log-path", str(self.audit_log),
                "--audit-log-format", "json", "--audit-log-mode", "batch",
                "--audit-log-batch-max-wait", "1s"]

    def _check_alive(self, name: str) -> None:
        proc = self._procs[name]
        if proc.poll() is not None:
            log = (self.root / "logs" / f"{name}.log").read_text(errors="replace")[-3000:]
            raise ServerExited(f"{name} exited with {proc.returncode}:\n{log}")

    def _default_service_account_exists(self) -> bool:
        self._check_alive("kube-controller-manager")
        return self.kubectl("get", "serviceaccount", "default", "-n", "default",
                            check=False).returncode == 0

    def _nodes_ready(self) -> bool:
        self._check_alive("node-agent")
        out = self.kubectl("get", "nodes", "-o", "json", check=False)
        if out.returncode != 0:
            return False
        items = json.loads(out.stdout)["items"]
        return len(items) >= self.nodes

    def _write_kubeconfig(self, path: Path, pki: certs.Pki, stem: str) -> None:
        user = _CLIENTS[stem][0]
        config = {
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "mtrl-local", "cluster": {
                "server": self.server, "certificate-authority": str(pki.ca_cert)}}],
            "users": [{"name": user, "user": {
                "client-certificate": str(pki.path(f"{stem}.crt")),
                "client-key": str(pki.path(f"{stem}.key"))}}],
            "contexts": [{"name": "mtrl-local", "context": {"cluster": "mtrl-local",
                                                            "user": user}}],
            "current-context": "mtrl-local",
        }
        path.write_text(yaml.safe_dump(config))

    def _write_state(self) -> None:
        state = {"pids": {n: p.pid for n, p in self._procs.items()},
                 "kubeconfig": str(self.kubeconfig), "server": self.server,
                 "bin_dir": str(self.bin_dir), "started": time.time()}
        (self.root / "state.json").write_text(json.dumps(state, indent=2))


def adopt_detached(root: Path, name: str, pid: int) -> None:
    """Have `stop_detached` stop one more process (a session leader) with the cluster."""
    state_file = root / "state.json"
    state = json.loads(state_file.read_text())
    state["pids"][name] = pid
    state_file.write_text(json.dumps(state, indent=2))


def stop_detached(root: Path) -> bool:
    """Stop a cluster started by `python -m mtrl_testbed up` (which outlives its launcher)."""
    state_file = root / "state.json"
    if not state_file.exists():
        return False
    pids = json.loads(state_file.read_text())["pids"]
    for pid in reversed(list(pids.values())):
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
    deadline = time.monotonic() + 15
    for pid in pids.values():
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)
    state_file.unlink()
    return True
