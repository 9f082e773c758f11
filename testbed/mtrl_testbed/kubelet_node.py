"""A real node for the local control plane: the kubelet on containerd with real CNI.

The node agent (`node_agent`) runs a pod's command as a local process: fast, but it ignores the
image and enforces no securityContext. This node runs the real images the way a cluster does
(docs/kubelet.md):

- containerd (Debian's `containerd`, which comes with `docker.io`) with its own config, root,
  state and socket, and `restrict_oom_score_adj = true` in its CRI plugin: these machines lack
  `CAP_SYS_RESOURCE`, and a sandbox given -998 fails to start (`can't get final child's PID from
  pipe: EOF`). Its root (images and layers) is kept in `~/.cache/mtrl/node/containerd`, so a
  warm machine imports nothing; containers never outlive the node.
- CNI from Debian's `containernetworking-plugins` (bridge, host-local, loopback, portmap);
- a pause image made from Debian's static busybox;
- the images named, from the project's Docker engine (`docker save | ctr import`), into
  containerd's `k8s.io` namespace;
- `kubelet` (and, when the pods need Service ClusterIPs such as `kubernetes.default`,
  `kube-proxy`) built by hack/build-tools.sh, registered on the machine's own address: the
  kubelet refuses a loopback node IP, and the API server reaches it there for `kubectl logs`.

Only root can run it (namespaces, cgroups, mounts, bridges, iptables).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from mtrl_testbed import certs
from mtrl_testbed.cluster import REPO_ROOT, LocalCluster
from mtrl_testbed.ports import ServerExited, free_port, wait_until

CACHE = Path(os.environ.get("MTRL_NODE_CACHE", Path.home() / ".cache" / "mtrl" / "node"))
CNI_BIN = Path("/usr/lib/cni")
BUSYBOX = Path("/bin/busybox")
PAUSE_IMAGE = "mtrl.local/pause:busybox"
POD_CIDR = "10.88.0.0/16"
CNI_BRIDGE = "mtrl-cni0"
NS = "k8s.io"  # containerd's namespace for the CRI
DNS_SERVICE_IP = "10.0.0.10"  # in the test bed's service range, as kubeadm puts kube-dns


def machine_ip() -> str:
    """The machine's own (non-loopback) IPv4 address: the kubelet refuses a loopback node IP."""
    if ip := os.environ.get("MTRL_NODE_IP"):
        return ip
    out = subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"],
                         capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        fields = line.split()
        addr = fields[fields.index("inet") + 1].split("/")[0]
        if not addr.startswith(("127.", "10.88.")) and "docker" not in fields[1]:
            return addr
    raise RuntimeError(f"no non-loopback IPv4 address on this machine:\n{out}")


def why_not() -> str | None:
    """Why this machine cannot run a real node, or None. hack/node.sh installs what Debian
    packages (containerd, runc, CNI plug-ins, busybox) when run as root."""
    if os.geteuid() != 0:
        return "not root: a kubelet and containerd need namespaces, cgroups, mounts and bridges"
    if not (Path("/sys/fs/cgroup").exists()):
        return "no /sys/fs/cgroup"
    missing = [p for p in ("containerd", "ctr", "runc") if shutil.which(p) is None]
    missing += [str(p) for p in (CNI_BIN / "bridge", CNI_BIN / "host-local", BUSYBOX)
                if not p.exists()]
    if missing and shutil.which("apt-get") is None:
        return f"missing {', '.join(missing)} and no apt-get to install them"
    return None


def install() -> None:
    """Install what the node needs from Debian's packages (hack/node.sh), if it is missing."""
    subprocess.run(["bash", str(REPO_ROOT / "hack" / "node.sh"), "install"], check=True)


@dataclass
class RealNode:
    """containerd, CNI, the kubelet (and kube-proxy) joined to `cluster` as node `name`."""

    cluster: LocalCluster
    name: str = "mtrl-kubelet"
    images: tuple[str, ...] = ()
    """Images to load from the Docker engine at `docker_host` (with `docker`, its client)."""
    docker: str = "docker"
    docker_host: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    kube_proxy: bool = False
    """kube-proxy and cluster DNS (CoreDNS behind the `kube-dns` Service): pods then reach
    Services by ClusterIP and by name (`kubernetes.default.svc`, as kopf's in-cluster login
    does)."""
    node_ip: str = field(default_factory=machine_ip)
    kubelet_port: int = field(default_factory=free_port)
    healthz_port: int = field(default_factory=free_port)
    _dir: Path | None = None
    _root_lock: int | None = None
    _root: Path | None = None
    _procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    # ------------------------------------------------------------------ paths

    @property
    def dir(self) -> Path:
        assert self._dir is not None, "not started"
        return self._dir

    @property
    def sock(self) -> Path:
        return self.dir / "containerd.sock"

    @property
    def logs(self) -> Path:
        return self.cluster.root / "logs"

    def ctr(self, *args: str, input: bytes | None = None, stdin: int | None = None,
            check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[bytes]:
        result = subprocess.run(["ctr", "--address", str(self.sock), "-n", NS, *args],
                                input=input, stdin=stdin, capture_output=True, timeout=timeout)
        if check and result.returncode:
            raise RuntimeError(f"ctr {' '.join(args)} exited {result.returncode}: "
                               f"{result.stderr.decode(errors='replace')}")
        return result

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 120) -> RealNode:
        # Unix socket paths are short (108 bytes): the node's state lives under /tmp.
        self._dir = Path(tempfile.mkdtemp(prefix="mtrl-node-"))
        try:
            self._start_containerd(timeout)
            self._load_images()
            self._write_cni()
            if self.kube_proxy:
                self._start_coredns(timeout)
            self._start_kubelet(timeout)
            if self.kube_proxy:
                self._start_kube_proxy(timeout)
        except Exception:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Every pod's containers stopped and removed, then the kubelet, kube-proxy and
        containerd stopped, their mounts undone and their state removed."""
        if self._dir is None:
            return
        if "kubelet" in self._procs and self._procs["kubelet"].poll() is None:
            # An API server too loaded to answer (seen on a loaded machine): the containers
            # are removed below all the same.
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._drain()
        proxied = "kube-proxy" in self._procs
        for name in ("kube-proxy", "kubelet", "coredns"):
            self._terminate(name)
        self._remove_iptables_rules(proxied)
        if "containerd" in self._procs and self._procs["containerd"].poll() is None:
            self._remove_containers()
        self._terminate("containerd")
        self._unmount_under(self.dir)
        subprocess.run(["ip", "link", "del", CNI_BRIDGE], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)
        if self._root_lock is not None:
            os.close(self._root_lock)
            self._root_lock = None
        self._dir = None

    def check_alive(self) -> None:
        for name, proc in self._procs.items():
            if proc.poll() is not None:
                tail = (self.logs / f"{name}.log").read_text(errors="replace")[-3000:]
                raise ServerExited(f"{name} exited with {proc.returncode}:\n{tail}")

    # ------------------------------------------------------------------ containerd

    def _containerd_root(self) -> Path:
        """The cached root (images survive the node), unless another node holds it now."""
        root = CACHE / "containerd"
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(CACHE / "containerd.lock", os.O_CREAT | os.O_RDWR, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return self.dir / "containerd-root"  # a node beside ours: import afresh
        self._root_lock = fd
        return root

    def _start_containerd(self, timeout: float) -> None:
        root = self._root = self._containerd_root()
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        config = f"""version = 2
root = "{root}"
state = "{self.dir / 'containerd-state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper"]
[grpc]
  address = "{self.sock}"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{self.dir / 'opt'}"
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  # No CAP_SYS_RESOURCE here: a sandbox's oom_score_adj of -998 would fail every pod.
  restrict_oom_score_adj = true
  [{cri}.cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{self.dir / 'cni'}"
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [{cri}.containerd.runtimes.runc.options]
        SystemdCgroup = false
"""
        path = self.dir / "containerd.toml"
        path.write_text(config)
        (self.dir / "cni").mkdir()
        self._spawn("containerd", ["containerd", "--config", str(path)])

        def answers() -> bool:
            self.check_alive()
            return self.ctr("version", check=False, timeout=10).returncode == 0

        wait_until(answers, timeout, "containerd", interval=0.2)
        # Containers a killed node left in the cached root: the kubelet would adopt them.
        self._remove_containers()

    def _remove_containers(self) -> None:
        for task in self._ids("tasks", "ls", "-q"):
            self.ctr("tasks", "kill", "--signal", "SIGKILL", task, check=False)
            self.ctr("tasks", "delete", "--force", task, check=False)
        for container in self._ids("containers", "ls", "-q"):
            self.ctr("containers", "delete", container, check=False)

    def _ids(self, *args: str) -> list[str]:
        out = self.ctr(*args, check=False, timeout=60)
        return out.stdout.decode().split() if out.returncode == 0 else []

    def _load_images(self) -> None:
        """The pause image and `images`, each imported once per cached root (by image id)."""
        root = self._root
        assert root is not None
        stamp = root.parent / f"{root.name}.imported.json"
        imported: dict[str, str] = json.loads(stamp.read_text()) if stamp.exists() else {}
        present = set(self._ids("images", "ls", "-q"))

        def docker(*args: str, **kw: object) -> subprocess.CompletedProcess[bytes]:
            return subprocess.run([self.docker, *args], check=True, capture_output=True,
                                  env={**os.environ, "DOCKER_HOST": self.docker_host},
                                  **kw)  # type: ignore[call-overload]

        pause_key = f"busybox {BUSYBOX.stat().st_size} {BUSYBOX.stat().st_mtime_ns}"
        if PAUSE_IMAGE not in present or imported.get(PAUSE_IMAGE) != pause_key:
            self.ctr("images", "import", "-", input=_pause_image_tar())
            imported[PAUSE_IMAGE] = pause_key
        for ref in self.images:
            image_id = docker("image", "inspect", "-f", "{{.Id}}", ref).stdout.decode().strip()
            if ref in present and imported.get(ref) == image_id:
                continue
            save = subprocess.Popen([self.docker, "save", ref], stdout=subprocess.PIPE,
                                    env={**os.environ, "DOCKER_HOST": self.docker_host})
            assert save.stdout is not None
            self.ctr("images", "import", "-", stdin=save.stdout.fileno())
            save.stdout.close()
            if save.wait():
                raise RuntimeError(f"docker save {ref} exited {save.returncode}")
            imported[ref] = image_id
        stamp.write_text(json.dumps(imported, indent=1))

    def _write_cni(self) -> None:
        conf = {"cniVersion": "0.4.0", "name": "mtrl-pods", "plugins": [
            {"type": "bridge", "bridge": CNI_BRIDGE, "isGateway": True, "ipMasq": True,
             "hairpinMode": True,
             "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]],
                      "routes": [{"dst": "0.0.0.0/0"}],
                      "dataDir": str(self.dir / "cni-ipam")}},
            {"type": "portmap", "capabilities": {"portMappings": True}}]}
        (self.dir / "cni" / "10-mtrl.conflist").write_text(json.dumps(conf, indent=1))

    # ------------------------------------------------------------------ kubelet

    def _start_kubelet(self, timeout: float) -> None:
        cluster = self.cluster
        pki = certs.Pki(cluster.root / "pki")
        user = f"system:node:{self.name}"
        certs.issue(pki, f"kubelet-{self.name}-client", user, "system:nodes")
        certs.issue(pki, f"kubelet-{self.name}-serving", self.name,
                    server_ips=[self.node_ip, "127.0.0.1"], server_names=[self.name])
        # The kubelet's rights are the built-in system:node role's (no Node authorizer here).
        cluster.kubectl("create", "clusterrolebinding", f"mtrl-node-{self.name}",
                        "--clusterrole", "system:node", "--user", user, check=False)
        kubeconfig = self.dir / "kubelet.kubeconfig"
        kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "mtrl-local", "cluster": {
                "server": cluster.server, "certificate-authority": str(pki.ca_cert)}}],
            "users": [{"name": user, "user": {
                "client-certificate": str(pki.path(f"kubelet-{self.name}-client.crt")),
                "client-key": str(pki.path(f"kubelet-{self.name}-client.key"))}}],
            "contexts": [{"name": "node", "context": {"cluster": "mtrl-local", "user": user}}],
            "current-context": "node"}))
        endpoint = f"unix://{self.sock}"
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "containerRuntimeEndpoint": endpoint, "imageServiceEndpoint": endpoint,
            "cgroupDriver": "cgroupfs", "failSwapOn": False, "failCgroupV1": False,
            "address": self.node_ip, "port": self.kubelet_port, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": self.healthz_port,
            "tlsCertFile": str(pki.path(f"kubelet-{self.name}-serving.crt")),
            "tlsPrivateKeyFile": str(pki.path(f"kubelet-{self.name}-serving.key")),
            # The API server (`kubectl logs`, `exec`) presents its kubelet-client certificate.
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(pki.ca_cert)}},
            "authorization": {"mode": "AlwaysAllow"},
            # A shared test machine's disk: never evict pods or collect the loaded images.
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "serializeImagePulls": False,
            "clusterDomain": "cluster.local",
            **({"clusterDNS": [DNS_SERVICE_IP]} if self.kube_proxy else {}),
            "resolvConf": "/etc/resolv.conf",
            "staticPodPath": "",
            "syncFrequency": "10s",
            "fileCheckFrequency": "10s",
            "nodeStatusReportFrequency": "10s",
        }
        path = self.dir / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        labels = ",".join(f"{k}={v}" for k, v in self.labels.items())
        self._spawn("kubelet", [
            str(cluster.bin_dir / "kubelet"), "--config", str(path),
            "--kubeconfig", str(kubeconfig), "--hostname-override", self.name,
            "--node-ip", self.node_ip, "--root-dir", str(self.dir / "kubelet"),
            *(["--node-labels", labels] if labels else []), "--v=1"])

        def ready() -> bool:
            self.check_alive()
            out = cluster.kubectl("get", "node", self.name, "-o", "jsonpath={.status."
                                  "conditions[?(@.type=='Ready')].status}", check=False)
            return out.stdout.strip() == "True"

        wait_until(ready, timeout, f"the kubelet (node {self.name} Ready)", interval=0.5)

    def _start_coredns(self, timeout: float) -> None:
        """CoreDNS (built by hack/build-tools.sh) as a process of the node, on a free port of
        the node's address, behind the `kube-dns` Service (10.0.0.10:53, an EndpointSlice of
        our own): a cluster runs it as pods behind the same Service; here no CoreDNS image
        can be pulled."""
        cluster = self.cluster
        port, health, ready = free_port(), free_port(), free_port()
        corefile = self.dir / "Corefile"
        corefile.write_text(f""".:{port} {{
    errors
    health 127.0.0.1:{health}
    ready 127.0.0.1:{ready}
    kubernetes cluster.local in-addr.arpa ip6.arpa {{
        kubeconfig {cluster.root / 'admin.kubeconfig'} mtrl-local
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }}
    forward . /etc/resolv.conf
    cache 5
}}
""")
        self._spawn("coredns", [str(cluster.bin_dir / "coredns"), "-conf", str(corefile)])
        service = {"apiVersion": "v1", "kind": "Service", "metadata": {
            "name": "kube-dns", "namespace": "kube-system",
            "labels": {"k8s-app": "kube-dns", "kubernetes.io/name": "CoreDNS"}},
            "spec": {"clusterIP": DNS_SERVICE_IP, "ports": [
                {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": port},
                {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": port}]}}
        slice_ = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "metadata": {
            "name": "kube-dns-node", "namespace": "kube-system",
            "labels": {"kubernetes.io/service-name": "kube-dns",
                       "endpointslice.kubernetes.io/managed-by": "mtrl-testbed"}},
            "addressType": "IPv4",
            "endpoints": [{"addresses": [self.node_ip], "conditions": {"ready": True}}],
            "ports": [{"name": "dns", "port": port, "protocol": "UDP"},
                      {"name": "dns-tcp", "port": port, "protocol": "TCP"}]}
        cluster.kubectl("apply", "-f", "-", input=json.dumps(
            {"apiVersion": "v1", "kind": "List", "items": [service, slice_]}))

        def serving() -> bool:
            self.check_alive()
            import urllib.request
            with urllib.request.urlopen(f"http://127.0.0.1:{ready}/ready", timeout=2) as r:
                return r.status == 200

        wait_until(serving, timeout, "CoreDNS (/ready)", interval=0.3)

    def _start_kube_proxy(self, timeout: float) -> None:
        cluster = self.cluster
        config = {
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(cluster.root / "admin.kubeconfig")},
            "mode": "iptables", "hostnameOverride": self.name,
            "clusterCIDR": POD_CIDR,
            "bindAddress": "0.0.0.0",
            "healthzBindAddress": f"127.0.0.1:{free_port()}",
            "metricsBindAddress": f"127.0.0.1:{free_port()}",
            # Leave the machine's conntrack settings alone (and need no rights to change them).
            "conntrack": {"maxPerCore": 0, "min": 0, "tcpEstablishedTimeout": "0s",
                          "tcpCloseWaitTimeout": "0s"},
        }
        path = self.dir / "kube-proxy.yaml"
        path.write_text(yaml.safe_dump(config))
        self._spawn("kube-proxy", [str(cluster.bin_dir / "kube-proxy"), "--config", str(path),
                                   "--v=1"])
        port = int(config["healthzBindAddress"].rsplit(":", 1)[1])  # type: ignore[union-attr]

        def healthy() -> bool:
            self.check_alive()
            import urllib.request
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
                return r.status == 200

        wait_until(healthy, timeout, "kube-proxy (/healthz)", interval=0.5)

    # ------------------------------------------------------------------ internals

    def _spawn(self, name: str, cmd: list[str]) -> None:
        self.logs.mkdir(parents=True, exist_ok=True)
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 (owned by the child)
        self._procs[name] = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                             start_new_session=True)

    def _terminate(self, name: str) -> None:
        proc = self._procs.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _drain(self, timeout: float = 60) -> None:
        """Delete the pods on this node, as the kubelet stops them (their network torn down,
        their sandboxes removed), before the node goes."""
        cluster = self.cluster
        # Cordoned first: a controller's replacement pods stay Pending instead of starting here.
        cluster.kubectl("cordon", self.name, check=False)
        cluster.kubectl("delete", "pods", "--all-namespaces", "--field-selector",
                        f"spec.nodeName={self.name}", "--grace-period=5", "--wait=false",
                        check=False)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            left = cluster.kubectl("get", "pods", "--all-namespaces", "--field-selector",
                                   f"spec.nodeName={self.name}", "-o", "name", check=False)
            if left.returncode == 0 and not left.stdout.strip():
                break
            time.sleep(0.5)
        # The kubelet stops a deleted pod's sandbox (its network torn down) as the pod goes;
        # it removes the stopped sandbox only later, in its garbage collection.
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and self._running_tasks():
            time.sleep(0.5)

    def _running_tasks(self) -> list[str]:
        out = self.ctr("tasks", "ls", check=False, timeout=60)
        lines = out.stdout.decode().splitlines()[1:] if out.returncode == 0 else []
        return [line.split()[0] for line in lines if "RUNNING" in line.split()]

    def _remove_iptables_rules(self, proxied: bool) -> None:
        """What kube-proxy (`--cleanup`) and the kubelet (its KUBE-FIREWALL and canary chains)
        leave in the machine's iptables when they exit."""
        if proxied:
            subprocess.run([str(self.cluster.bin_dir / "kube-proxy"), "--cleanup"],
                           capture_output=True, timeout=60)
        # A sandbox removed without the kubelet (a node stopped mid-run) keeps its CNI
        # masquerade rule and chain, tagged with our network's name.
        rules = subprocess.run(["iptables-save", "-t", "nat"], capture_output=True,
                               text=True).stdout.splitlines()
        ours = [r for r in rules if r.startswith("-A POSTROUTING") and 'mtrl-pods' in r]
        for rule in ours:
            subprocess.run(["iptables", "-t", "nat", *shlex.split(rule.replace("-A", "-D", 1))],
                           capture_output=True)
            chain = rule.rsplit("-j ", 1)[1].strip()
            subprocess.run(["iptables", "-t", "nat", "-F", chain], capture_output=True)
            subprocess.run(["iptables", "-t", "nat", "-X", chain], capture_output=True)
        for tool in ("iptables", "ip6tables"):
            for table, chain in (("filter", "INPUT"), ("filter", "OUTPUT")):
                while subprocess.run([tool, "-t", table, "-D", chain, "-j", "KUBE-FIREWALL"],
                                     capture_output=True).returncode == 0:
                    pass
            for table in ("filter", "nat", "mangle"):
                for kube in ("KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT"):
                    subprocess.run([tool, "-t", table, "-F", kube], capture_output=True)
                    subprocess.run([tool, "-t", table, "-X", kube], capture_output=True)

    @staticmethod
    def _unmount_under(path: Path) -> None:
        prefix = str(path) + "/"
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True)


def _pause_image_tar() -> bytes:
    """A Docker-archive image whose only file is a static busybox and whose command sleeps:
    the pod sandbox's process (registry.k8s.io/pause cannot be pulled here)."""
    import hashlib
    import io
    import tarfile

    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as tar:
        info = tar.gettarinfo(str(BUSYBOX), arcname="bin/busybox")
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        with BUSYBOX.open("rb") as f:
            tar.addfile(info, f)
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": ["/bin/busybox", "sleep", "2147483647"],
                   "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]}}).encode()
    config_name = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [PAUSE_IMAGE],
                            "Layers": ["layer.tar"]}]).encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, data in ((config_name, config), ("layer.tar", layer_bytes),
                           ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mtime = int(time.time())
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()

