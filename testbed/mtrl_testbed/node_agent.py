"""A test-only node agent: registers HyperPod-like nodes and runs pods as local processes.

It stands in for the kubelet on the local control plane so that the end-to-end tests and the
demo run the real trainer and workers. What it does, and where it differs from a kubelet:

- Registers `--nodes` Ready nodes labelled like ml.p5.48xlarge HyperPod nodes (8 GPUs, 32 EFA
  interfaces), so the scheduler's placement (affinity, resources, tolerations) is real.
- Runs each container's `command + args` as a process; the image is ignored. `python`,
  `python3` and `mtrl` resolve to this Python's environment.
- Gives each pod its own loopback address as its pod IP, from a 127.N.0.0/16 range that no
  other agent on the machine holds, so pods can bind the same port and readiness probes
  (httpGet, tcpSocket) are real. A Python process's wildcard bind (0.0.0.0) becomes a bind to
  its pod IP (`podnet/sitecustomize.py`), as in a pod's own network namespace.
- Answers Service and pod host names as the cluster DNS would (`cluster_dns`): each container
  runs in mount and UTS namespaces of its own, with the pod's hostname and a hosts file (the
  kubelet's, then its namespace's DNS answers) over /etc/hosts; `nslookup` (what an image's
  init container waits with) reads it (`podnet/bin`).
- Expands `$(NAME)` in commands, arguments and env values as the kubelet does (`expand`).
- Materialises ConfigMap and Secret volumes (their keys as files) and emptyDir volumes (an empty
  folder) under the pod's directory, and rewrites mount paths found in env values and
  arguments to that directory. Other volumes, projected ones included, are empty folders.
- Replaces in-cluster credentials with a kubeconfig holding a token for the pod's
  ServiceAccount (TokenRequest), so pods act with their own RBAC.
- Passes the variables in `<work-dir>/../pod-env.json` (e.g. the moto endpoint) to every pod.
- A container that exits under restartPolicy Always (or OnFailure, failed) is restarted after
  a back-off, reported as the kubelet does: `waiting: CrashLoopBackOff` during the back-off,
  `lastState.terminated` with its exit code and termination message, `restartCount`. The
  back-off is shorter than the kubelet's (10 s doubling to 5 minutes): a quarter-second
  doubling to 10 s, so tests see a crash loop quickly.
- On deletion: SIGTERM, the grace period, SIGKILL; then, as the kubelet does for a deleted
  pod, its terminal phase and containers' exit codes (128 + signal for a killed process) are
  reported, so the Job controller can judge it by its podFailurePolicy (a DisruptionTarget
  condition the API server set on an evicted pod stays); then the pod object is removed.
- An image whose registry is in the `.invalid` domain (RFC 2606: it never resolves) is never
  pulled: its pod stays Pending on its node with `waiting: ErrImagePull`, then
  `ImagePullBackOff`, in the kubelet's words, until it is deleted. Every other image is taken
  as pulled.
- Serves the kubelet's container-log endpoint (`container_logs`) on `--kubelet-port`, and
  registers that port and the InternalIP 127.0.0.1 in each Node's status, so `kubectl logs`
  reaches a container's `<pod folder>/<container>.log` through the API server.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import datetime as dt
import fcntl
import functools
import itertools
import json
import logging
import os
import signal
import ssl
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx
import yaml
from lightkube import AsyncClient, KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.models.authentication_v1 import TokenRequestSpec
from lightkube.models.meta_v1 import ObjectMeta
from lightkube.resources.core_v1 import ConfigMap, Node, Pod, Secret, Service, ServiceAccount
from lightkube.types import PatchType

from mtrl_testbed import container_logs
from mtrl_testbed.cluster_dns import ClusterDNS, PodHost, PodRecord, ServiceRecord, pod_hostname
from mtrl_testbed.container_logs import ContainerLog

log = logging.getLogger("mtrl.node-agent")

NODE_CAPACITY = {"cpu": "192", "memory": "2048Gi", "pods": "500", "ephemeral-storage": "1Ti",
                 "nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32", "hugepages-2Mi": "0"}
NODE_LABELS = {"node.kubernetes.io/instance-type": "ml.p5.48xlarge",
               "sagemaker.amazonaws.com/node-health-status": "Schedulable",
               "sagemaker.amazonaws.com/compute-type": "hyperpod",
               "topology.kubernetes.io/zone": "us-west-2a",
               "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
POD_NETWORK = Path(__file__).resolve().parent / "podnet"
IP_RANGE_LOCKS = Path(os.environ.get("MTRL_IP_RANGE_LOCKS", "/tmp/mtrl-testbed-ip-ranges"))


def claim_ip_range() -> tuple[int, int]:
    """A loopback /16 (127.N.0.0) no other node agent on this machine holds, and the open file
    whose lock holds it until this process exits: two test beds side by side (CI next to a
    developer's demo) would otherwise give pods the same address and port."""
    IP_RANGE_LOCKS.mkdir(parents=True, exist_ok=True)
    for octet in range(10, 250):
        fd = os.open(IP_RANGE_LOCKS / f"127.{octet}.lock", os.O_CREAT | os.O_RDWR, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return octet, fd
    raise RuntimeError(f"every loopback range 127.10-249.x.x is held (locks in {IP_RANGE_LOCKS})")


def ip_pool(octet: int) -> Iterator[str]:
    return (f"127.{octet}.{b}.{c}" for b, c in itertools.product(range(256), range(2, 255)))


async def _through_restarts(call: Callable[[], Awaitable[Any]], within: float = 120) -> Any:
    """Retry a call the API server could not take (down, restarting), as a kubelet retries
    status updates: a pod that ends while the API server is away still reports its end."""
    deadline = time.monotonic() + within
    while True:
        try:
            return await call()
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


def cannot_pull(image: str) -> str:
    """What the container runtime says of an image whose registry can never be reached, or
    "": a host in the `.invalid` top-level domain, which RFC 2606 reserves so that it never
    resolves (containerd's words, as the kubelet's ErrImagePull message carries them). Every
    other image is taken as pulled: the agent runs commands, not images."""
    host = image.split("/", 1)[0] if "/" in image else ""
    if not (host == "invalid" or host.endswith(".invalid")):
        return ""
    return (f'rpc error: code = Unknown desc = failed to pull and unpack image "{image}": '
            f'failed to resolve reference "{image}": failed to do request: Head '
            f'"https://{host}/v2/": dial tcp: lookup {host}: no such host')


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _resolve_argv(argv: list[str]) -> list[str]:
    exe_dir = Path(sys.executable).parent
    head = argv[0]
    if head in ("python", "python3"):
        return [sys.executable, *argv[1:]]
    if "/" not in head and (exe_dir / head).exists():
        return [str(exe_dir / head), *argv[1:]]
    return argv


@dataclass
class PodProcess:
    """The processes of one pod and what the agent knows about them."""

    uid: str
    namespace: str
    name: str
    ip: str
    root: Path
    procs: dict[str, asyncio.subprocess.Process] = field(default_factory=dict)
    restarts: dict[str, int] = field(default_factory=dict)
    started: dict[str, str] = field(default_factory=dict)
    ready: dict[str, bool] = field(default_factory=dict)
    waiting: dict[str, dict[str, str]] = field(default_factory=dict)  # in a restart back-off
    last_terminated: dict[str, dict[str, Any]] = field(default_factory=dict)
    logs: dict[str, ContainerLog] = field(default_factory=dict)
    terminating: bool = False
    task: asyncio.Task[None] | None = None
    reaper: asyncio.Task[None] | None = None


class NodeAgent:
    def __init__(self, kubeconfig: Path, nodes: int, work_dir: Path, kubelet_port: int = 0,
                 tls: ssl.SSLContext | None = None) -> None:
        self.kubeconfig_path = kubeconfig
        self.kubelet_port, self.tls = kubelet_port, tls
        self.config = KubeConfig.from_file(str(kubeconfig))
        self.client = AsyncClient(self.config, field_manager="mtrl-node-agent")
        self.node_names = [f"hyperpod-p5-{i}" for i in range(nodes)]
        self.work_dir = work_dir
        self.pods: dict[str, PodProcess] = {}
        octet, self._ip_range_lock = claim_ip_range()
        self.ips = ip_pool(octet)
        self.dns = ClusterDNS(work_dir / "dns")

    # ------------------------------------------------------------------ nodes

    async def register_nodes(self) -> None:
        for name in self.node_names:
            node = Node.from_dict({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {**NODE_LABELS, "kubernetes.io/hostname": name}},
            })
            with contextlib.suppress(ApiError):
                await self.client.create(node)
            status = {"status": {
                "capacity": NODE_CAPACITY, "allocatable": NODE_CAPACITY,
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "mtrl node agent is running pods as processes",
                                "lastHeartbeatTime": _now(), "lastTransitionTime": _now()}],
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"},
                              {"type": "Hostname", "address": name}],
                "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux",
                             "kubeletVersion": "v1.34.4-mtrl-agent", "kubeProxyVersion": "",
                             "containerRuntimeVersion": "process://", "kernelVersion": "",
                             "osImage": "local", "machineID": name, "systemUUID": name,
                             "bootID": name},
            }}
            if self.kubelet_port:  # where the API server asks for logs (pods/log)
                status["status"]["daemonEndpoints"] = {
                    "kubeletEndpoint": {"Port": self.kubelet_port}}
            await self.client.patch(Node.Status, name, status, patch_type=PatchType.MERGE)
            # The API server taints new nodes not-ready; the node lifecycle controller (not run
            # here, it would evict pods of a node without kubelet heartbeats) lifts it.
            await self.client.patch(Node, name, {"spec": {"taints": None}},
                                    patch_type=PatchType.MERGE)

    # ------------------------------------------------------------------ pods

    def logs_of(self, namespace: str, name: str) -> dict[str, ContainerLog] | None:
        """The containers of the newest pod of that name on these nodes (the logs endpoint)."""
        found = [s for s in self.pods.values() if (s.namespace, s.name) == (namespace, name)]
        return found[-1].logs if found else None

    async def run(self) -> None:
        if self.kubelet_port and self.tls:
            await container_logs.serve(self.logs_of, "127.0.0.1", self.kubelet_port,
                                       self.tls)
        await self.register_nodes()
        log.info("registered nodes %s", self.node_names)
        services = asyncio.create_task(self._watch(Service, self.on_service))
        try:
            await self._watch(Pod, self.on_pod)
        finally:
            services.cancel()

    async def _watch(self, kind: Any, handle: Callable[[str, Any], Awaitable[None]]) -> None:
        while True:
            try:
                async for event, obj in self.client.watch(kind, namespace="*", server_timeout=60):
                    await handle(event, obj)
            except (ApiError, httpx.HTTPError) as exc:
                log.warning("%s watch ended: %s; re-listing", kind.__name__, exc)
                await asyncio.sleep(1)

    async def on_service(self, event: str, svc: Service) -> None:
        spec = svc.spec
        record = None if event == "DELETED" or spec is None else ServiceRecord(
            name=svc.metadata.name, selector=dict(spec.selector or {}),
            headless=spec.clusterIP == "None",
            publish_not_ready=bool(spec.publishNotReadyAddresses))
        self.dns.set_service(svc.metadata.namespace, svc.metadata.name, record)

    def _publish(self, state: PodProcess, pod: Pod, ready: bool | None) -> None:
        """What the cluster DNS answers for this pod: ready or not while it runs, nothing once
        it ended (None)."""
        record = None if ready is None else PodRecord(
            name=state.name, ip=state.ip, labels=dict(pod.metadata.labels or {}), ready=ready,
            hostname=pod.spec.hostname, subdomain=pod.spec.subdomain)
        self.dns.set_pod(state.namespace, state.uid, record)

    async def on_pod(self, event: str, pod: Pod) -> None:
        if pod.spec is None or pod.spec.nodeName not in self.node_names:
            return
        uid = pod.metadata.uid
        state = self.pods.get(uid)
        if event == "DELETED":
            if state:
                await self._kill(state, grace=0)
                self._forget(state)
            return
        if pod.metadata.deletionTimestamp is not None:
            if state and not state.terminating:
                state.terminating = True
                grace = pod.metadata.deletionGracePeriodSeconds or 0
                state.reaper = asyncio.create_task(self._terminate_and_remove(state, grace, pod))
            elif not state:
                await self._remove(pod.metadata.namespace, pod.metadata.name, uid)
            return
        if state is None and (pod.status is None or pod.status.phase in (None, "Pending")):
            state = PodProcess(uid=uid, namespace=pod.metadata.namespace, name=pod.metadata.name,
                               ip=next(self.ips),
                               root=self.work_dir / f"{pod.metadata.namespace}_{pod.metadata.name}_{uid[:8]}")
            self.pods[uid] = state
            state.task = asyncio.create_task(self._run_pod(state, pod))
        elif state is None and pod.status.phase == "Running":
            # A pod from an earlier agent: its processes died with that agent.
            await self._patch_status(pod.metadata.namespace, pod.metadata.name, {
                "phase": "Failed", "reason": "NodeAgentRestarted",
                "message": "the node agent restarted and its processes are gone"})

    async def _run_pod(self, state: PodProcess, pod: Pod) -> None:
        try:
            await self._run_pod_inner(state, pod)
        except Exception as exc:
            log.exception("pod %s/%s failed to run", state.namespace, state.name)
            with contextlib.suppress(ApiError):
                await self._patch_status(state.namespace, state.name, {
                    "phase": "Failed", "reason": "AgentError", "message": str(exc)[:2000]})

    async def _run_pod_inner(self, state: PodProcess, pod: Pod) -> None:
        state.root.mkdir(parents=True, exist_ok=True)
        for c in [*(pod.spec.initContainers or []), *pod.spec.containers]:
            running = functools.partial(_running, state, c.name)
            state.logs[c.name] = ContainerLog(state.root / f"{c.name}.log", running=running)
        mounts = await self._volumes(pod, state)
        env_base = await self._base_env(pod, state)
        restart_policy = pod.spec.restartPolicy or "Always"
        await self._patch_status(state.namespace, state.name, {
            "phase": "Pending", "hostIP": "127.0.0.1", "podIP": state.ip,
            "podIPs": [{"ip": state.ip}], "startTime": _now(),
            "conditions": [{"type": "PodScheduled", "status": "True"}]})
        if unpullable := [c for c in [*(pod.spec.initContainers or []), *pod.spec.containers]
                          if cannot_pull(c.image or "")]:
            await self._never_pulled(state, unpullable)  # until the pod is deleted
            return
        for init in pod.spec.initContainers or []:
            code = await self._run_container(state, pod, init, mounts, env_base, wait=True)
            if code != 0:
                await self._finish(state, pod, {init.name: code}, failed_init=init.name)
                return
        containers = pod.spec.containers
        for c in containers:
            await self._run_container(state, pod, c, {
                **mounts, **_termination_mount(state, c)}, env_base, wait=False)
        await self._report_running(state, pod)
        probes = asyncio.create_task(self._probe_loop(state, pod))
        exit_codes: dict[str, int] = {}
        try:
            while len(exit_codes) < len(containers):
                waiters = {asyncio.create_task(state.procs[c.name].wait()): c for c in containers
                           if c.name not in exit_codes}
                done, pending = await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
                for t in pending:
                    t.cancel()
                for t in done:
                    c = waiters[t]
                    code = _exit_code(t.result())
                    if state.terminating:
                        exit_codes[c.name] = code
                    elif restart_policy == "Always" or (restart_policy == "OnFailure" and code):
                        restarts = state.restarts[c.name] = state.restarts.get(c.name, 0) + 1
                        back_off = min(10, 2 ** restarts / 4)
                        state.last_terminated[c.name] = _terminated(state, c, code)
                        if code:
                            state.waiting[c.name] = {
                                "reason": "CrashLoopBackOff",
                                "message": f"back-off {back_off:g}s restarting failed "
                                           f"container={c.name} pod={state.name}"}
                        await self._report_running(state, pod)
                        await asyncio.sleep(back_off)
                        state.waiting.pop(c.name, None)
                        await self._run_container(state, pod, c, {
                            **mounts, **_termination_mount(state, c)}, env_base, wait=False)
                        await self._report_running(state, pod)
                    else:
                        exit_codes[c.name] = code
        finally:
            probes.cancel()
        if not state.terminating:
            await self._finish(state, pod, exit_codes)

    async def _run_container(self, state: PodProcess, pod: Pod, c: Any, mounts: dict[str, Path],
                             env_base: dict[str, str], *, wait: bool) -> int | None:
        env = dict(env_base)  # the agent's own paths are local already: never rewritten
        for var in c.env or []:  # each value may name the variables before it, as $(NAME)
            env[var.name] = _rewrite(expand(await self._env_value(pod, state, var), env), mounts)
        argv = [_rewrite(expand(a, env), mounts) for a in [*(c.command or []), *(c.args or [])]]
        if not argv:
            raise RuntimeError(f"container {c.name} has no command; the node agent cannot run "
                               "an image's default entrypoint")
        log_file = open(state.root / f"{c.name}.log", "ab")  # noqa: SIM115, ASYNC230 (the child owns it)
        state.logs[c.name].starts.append(log_file.tell())  # this start's output begins here
        in_pod = self.dns.wrap(state.namespace, state.uid, _pod_host(pod, state),
                               _resolve_argv(argv))
        proc = await asyncio.create_subprocess_exec(
            *in_pod, env=env, cwd=str(state.root), stdout=log_file,
            stderr=asyncio.subprocess.STDOUT, start_new_session=True)
        log_file.close()
        state.procs[c.name] = proc
        state.started[c.name] = _now()
        state.ready[c.name] = c.readinessProbe is None
        log.info("started %s/%s[%s] pid %d: %s", state.namespace, state.name, c.name, proc.pid,
                 " ".join(argv)[:200])
        return await proc.wait() if wait else None

    async def _probe_loop(self, state: PodProcess, pod: Pod) -> None:
        probed = [c for c in pod.spec.containers if c.readinessProbe is not None]
        while probed:
            changed = False
            for c in probed:
                ok = await _probe(state.ip, c.readinessProbe, c.ports or [])
                if ok != state.ready.get(c.name):
                    state.ready[c.name] = ok
                    changed = True
            if changed:
                await self._report_running(state, pod)
            await asyncio.sleep(min((p.readinessProbe.periodSeconds or 10) for p in probed) / 5)

    async def _never_pulled(self, state: PodProcess, containers: list[Any]) -> None:
        """As the kubelet reports an image it cannot pull: ErrImagePull with the runtime's
        error, then ImagePullBackOff while it backs off, for as long as the pod exists. The pod
        stays Pending, bound to its node."""
        first = True
        while not state.terminating:
            statuses = [{"name": c.name, "image": c.image, "imageID": "", "ready": False,
                         "started": False, "restartCount": 0, "state": {"waiting": {
                             "reason": "ErrImagePull" if first else "ImagePullBackOff",
                             "message": cannot_pull(c.image) if first else
                             f'Back-off pulling image "{c.image}"'}}} for c in containers]
            await self._patch_status(state.namespace, state.name, {
                "phase": "Pending", "containerStatuses": statuses,
                "conditions": [{"type": "PodScheduled", "status": "True"},
                               {"type": "Ready", "status": "False",
                                "reason": "ContainersNotReady", "lastTransitionTime": _now()}]})
            first = False
            await asyncio.sleep(2)

    async def _report_running(self, state: PodProcess, pod: Pod) -> None:
        statuses = []
        for c in pod.spec.containers:
            if c.name not in state.procs:
                continue
            waiting = state.waiting.get(c.name)
            status: dict[str, Any] = {
                "name": c.name, "image": c.image or "", "imageID": "",
                "containerID": f"process://{state.procs[c.name].pid}",
                "ready": state.ready.get(c.name, False) and waiting is None,
                "started": waiting is None, "restartCount": state.restarts.get(c.name, 0),
                "state": {"waiting": waiting} if waiting else
                {"running": {"startedAt": state.started[c.name]}}}
            if c.name in state.last_terminated:
                status["lastState"] = {"terminated": state.last_terminated[c.name]}
            statuses.append(status)
        all_ready = all(s["ready"] for s in statuses)
        ready = "True" if all_ready else "False"
        self._publish(state, pod, all_ready)
        await self._patch_status(state.namespace, state.name, {
            "phase": "Running", "containerStatuses": statuses,
            "conditions": [{"type": t, "status": s, "lastTransitionTime": _now()} for t, s in (
                ("PodScheduled", "True"), ("Initialized", "True"), ("ContainersReady", ready),
                ("Ready", ready))]})

    async def _finish(self, state: PodProcess, pod: Pod, exit_codes: dict[str, int],
                      failed_init: str | None = None) -> None:
        ok = failed_init is None and all(code == 0 for code in exit_codes.values())
        containers = {c.name: c for c in [*(pod.spec.initContainers or []), *pod.spec.containers]}
        statuses = [{"name": name, "image": "", "imageID": "", "ready": False,
                     "restartCount": state.restarts.get(name, 0),
                     "state": {"terminated": _terminated(state, containers[name], code)}}
                    for name, code in exit_codes.items()]
        key = "initContainerStatuses" if failed_init else "containerStatuses"
        self._publish(state, pod, None)
        await self._patch_status(state.namespace, state.name, {
            "phase": "Succeeded" if ok else "Failed", key: statuses,
            "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted",
                            "lastTransitionTime": _now()}]})
        log.info("pod %s/%s finished: %s", state.namespace, state.name, exit_codes)

    async def _terminate_and_remove(self, state: PodProcess, grace: int, pod: Pod) -> None:
        await self._kill(state, grace)
        main = {c.name for c in pod.spec.containers}
        codes = {name: _exit_code(p.returncode) for name, p in state.procs.items()
                 if name in main and p.returncode is not None}
        if codes:  # a deleted pod's end is reported before it goes (kubelet: terminal phase)
            with contextlib.suppress(ApiError):
                await self._finish(state, pod, codes)
        await self._remove(state.namespace, state.name, state.uid)
        self._forget(state)

    def _forget(self, state: PodProcess) -> None:
        self.pods.pop(state.uid, None)
        self.dns.forget(state.namespace, state.uid)

    async def _kill(self, state: PodProcess, grace: int) -> None:
        state.terminating = True
        self.dns.set_pod(state.namespace, state.uid, None)  # a terminating pod leaves its Services
        live = [p for p in state.procs.values() if p.returncode is None]
        for p in live:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in live)), timeout=max(grace, 0.1))
        except TimeoutError:
            for p in live:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)
            await asyncio.gather(*(p.wait() for p in live))
        if state.task and not state.task.done():
            state.task.cancel()

    async def _remove(self, namespace: str, name: str, uid: str) -> None:
        with contextlib.suppress(ApiError):
            await _through_restarts(lambda: self.client.delete(Pod, name, namespace=namespace,
                                                               grace_period=0))

    async def _patch_status(self, namespace: str, name: str, status: dict[str, Any]) -> None:
        await _through_restarts(lambda: self.client.patch(
            Pod.Status, name, {"status": status}, namespace=namespace,
            patch_type=PatchType.STRATEGIC))

    # ------------------------------------------------------------------ environment and volumes

    async def _base_env(self, pod: Pod, state: PodProcess) -> dict[str, str]:
        # This Python's environment, then what the images the agent stands in for carry
        # (podnet/bin: nslookup; the trainer image's baked model cache: this machine's), then
        # the machine's.
        env = {"PATH": os.pathsep.join((str(Path(sys.executable).parent), str(POD_NETWORK / "bin"),
                                        "/usr/local/bin:/usr/bin:/bin")),
               "MTRL_MODEL_CACHE": os.environ.get("MTRL_MODEL_CACHE")  # model_sources.cache_root
               or str(Path.home() / ".cache" / "mtrl" / "models"),
               "HOME": str(state.root), "HOSTNAME": _pod_host(pod, state).hostname,
               "PYTHONUNBUFFERED": "1", "MTRL_POD_IP": state.ip,
               # The pod's own network namespace (see podnet/sitecustomize.py), then the
               # agent's own import path, so pods run the code under test.
               "PYTHONPATH": os.pathsep.join(p for p in (str(POD_NETWORK),
                                                         os.environ.get("PYTHONPATH")) if p)}
        extra = self.work_dir.parent / "pod-env.json"
        if extra.exists():
            env.update(json.loads(extra.read_text()))
        if pod.spec.automountServiceAccountToken is not False:
            env["KUBECONFIG"] = str(await self._pod_kubeconfig(pod, state))
        return env

    async def _pod_kubeconfig(self, pod: Pod, state: PodProcess) -> Path:
        sa = pod.spec.serviceAccountName or "default"
        req = ServiceAccount.Token(metadata=ObjectMeta(name=sa, namespace=state.namespace),
                                   spec=TokenRequestSpec(audiences=[], expirationSeconds=86400))
        token = await self.client.create(req, name=sa, namespace=state.namespace)
        cluster = self.config.contexts[self.config.current_context].cluster
        server = self.config.clusters[cluster].server
        ca = self.config.clusters[cluster].certificate_auth
        path = state.root / "serviceaccount.kubeconfig"
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": ca}}],
            "users": [{"name": sa, "user": {"token": token.status.token}}],
            "contexts": [{"name": "local", "context": {"cluster": "local", "user": sa,
                                                       "namespace": state.namespace}}],
            "current-context": "local"}))
        return path

    async def _env_value(self, pod: Pod, state: PodProcess, var: Any) -> str:
        if var.valueFrom is None:
            return var.value or ""
        src = var.valueFrom
        if src.fieldRef is not None:
            return _field_ref(pod, state, src.fieldRef.fieldPath)
        if src.configMapKeyRef is not None:
            cm = await self.client.get(ConfigMap, src.configMapKeyRef.name, namespace=state.namespace)
            return (cm.data or {}).get(src.configMapKeyRef.key, "")
        if src.secretKeyRef is not None:
            secret = await self.client.get(Secret, src.secretKeyRef.name, namespace=state.namespace)
            return base64.b64decode((secret.data or {}).get(src.secretKeyRef.key, "")).decode()
        return ""

    async def _volumes(self, pod: Pod, state: PodProcess) -> dict[str, Path]:
        """mountPath -> local directory, for every volume mount of every container."""
        local: dict[str, Path] = {}
        for vol in pod.spec.volumes or []:
            target = state.root / "volumes" / vol.name
            target.mkdir(parents=True, exist_ok=True)
            if vol.configMap is not None:
                cm = await self.client.get(ConfigMap, vol.configMap.name, namespace=state.namespace)
                for key, value in (cm.data or {}).items():
                    (target / key).write_text(value)
            elif vol.secret is not None:
                secret = await self.client.get(Secret, vol.secret.secretName, namespace=state.namespace)
                for key, value in (secret.data or {}).items():
                    (target / key).write_bytes(base64.b64decode(value))
            local[vol.name] = target
        mounts: dict[str, Path] = {}
        for c in [*(pod.spec.initContainers or []), *pod.spec.containers]:
            for m in c.volumeMounts or []:
                if m.name in local:
                    mounts[m.mountPath] = local[m.name]
        return mounts


def _pod_host(pod: Pod, state: PodProcess) -> PodHost:
    aliases = tuple((a.ip, tuple(a.hostnames or ())) for a in pod.spec.hostAliases or [])
    return PodHost(ip=state.ip, hostname=pod_hostname(pod.metadata.name, pod.spec.hostname),
                   subdomain=pod.spec.subdomain, aliases=aliases)


def _running(state: PodProcess, container: str) -> bool:
    proc = state.procs.get(container)
    return proc is not None and proc.returncode is None


# The kubelet's limits (pkg/kubelet/container/runtime.go, MaxContainerTerminationMessage*):
# 4 KiB from the file; from the logs, the last 80 lines, at most 2 KiB.
TERMINATION_MESSAGE_BYTES, TERMINATION_LOG_LINES, TERMINATION_LOG_BYTES = 4096, 80, 2048


def _termination_mount(state: PodProcess, c: Any) -> dict[str, Path]:
    """The kubelet mounts a file of the container's own at its terminationMessagePath (default
    /dev/termination-log); here it is a file in the pod's folder, and a path to it in the
    container's environment or arguments is rewritten to that file."""
    path = state.root / f"{c.name}.termination-log"
    path.write_bytes(b"")  # each start of the container begins with an empty message
    return {c.terminationMessagePath or "/dev/termination-log": path}


def _exit_code(returncode: int) -> int:
    """A process killed by signal N exits, as a container runtime reports it, 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def _terminated(state: PodProcess, c: Any, code: int) -> dict[str, Any]:
    """A container's `terminated` state, with its termination message."""
    out: dict[str, Any] = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                           "startedAt": state.started.get(c.name, _now()),
                           "finishedAt": _now()}
    if message := _termination_message(state, c, code):
        out["message"] = message
    return out


def _termination_message(state: PodProcess, c: Any, code: int) -> str:
    """What the kubelet reports as the terminated state's message
    (kuberuntime_container.go, getTerminationMessage): the file's content; with policy
    FallbackToLogsOnError and a failed container that wrote none, the tail of its log."""
    path = state.root / f"{c.name}.termination-log"
    message = path.read_bytes()[:TERMINATION_MESSAGE_BYTES] if path.exists() else b""
    if not message.strip() and code != 0 and c.terminationMessagePolicy == "FallbackToLogsOnError":
        log_path = state.root / f"{c.name}.log"
        lines = log_path.read_bytes().splitlines(keepends=True) if log_path.exists() else []
        message = b"".join(lines[-TERMINATION_LOG_LINES:])[-TERMINATION_LOG_BYTES:]
    return message.decode(errors="replace")


def expand(value: str, env: dict[str, str]) -> str:
    """The kubelet's expansion of `$(NAME)` in a container's command, args and env values
    (kubernetes third_party/forked/golang/expansion): a defined NAME becomes its value, an
    undefined one stays as written, `$$` is a literal `$`, and any other `$` is kept."""
    out, i = [], 0
    while i < len(value):
        if value[i] != "$" or i + 1 == len(value):
            out.append(value[i])
            i += 1
        elif value[i + 1] == "$":
            out.append("$")
            i += 2
        elif value[i + 1] == "(" and (end := value.find(")", i + 2)) != -1:
            name = value[i + 2:end]
            out.append(env[name] if name in env else value[i:end + 1])
            i = end + 1
        else:
            out.append("$")
            i += 1
    return "".join(out)


def _rewrite(value: str, mounts: dict[str, Path]) -> str:
    """A path inside a mounted volume, as the pod's container sees it, to the local folder."""
    for mount_path in sorted(mounts, key=len, reverse=True):
        root = mount_path.rstrip("/")
        if value == root or value.startswith(root + "/"):
            return str(mounts[mount_path]) + value[len(root):]
    return value


def _field_ref(pod: Pod, state: PodProcess, path: str) -> str:
    meta = pod.metadata
    simple = {"metadata.name": meta.name, "metadata.namespace": meta.namespace,
              "metadata.uid": meta.uid, "status.podIP": state.ip, "status.hostIP": "127.0.0.1",
              "spec.nodeName": pod.spec.nodeName, "spec.serviceAccountName": pod.spec.serviceAccountName}
    if path in simple:
        return simple[path] or ""
    for prefix, mapping in (("metadata.labels", meta.labels), ("metadata.annotations", meta.annotations)):
        if path.startswith(prefix + "['"):
            return (mapping or {}).get(path[len(prefix) + 2:-2], "")
    return ""


def _port(port: int | str, ports: list[Any]) -> int:
    """A probe's port: a number, or the name of one of the container's ports."""
    if isinstance(port, str) and not port.isdigit():
        return next(p.containerPort for p in ports if p.name == port)
    return int(port)


async def _probe(ip: str, probe: Any, ports: list[Any]) -> bool:
    try:
        if probe.httpGet is not None:
            port = _port(probe.httpGet.port, ports)
            async with httpx.AsyncClient(timeout=probe.timeoutSeconds or 1) as client:
                resp = await client.get(f"http://{ip}:{port}{probe.httpGet.path or '/'}")
                return 200 <= resp.status_code < 400
        if probe.tcpSocket is not None:
            _, writer = await asyncio.wait_for(
                asyncio.open_connection(ip, _port(probe.tcpSocket.port, ports)), timeout=1)
            writer.close()
            return True
    except (OSError, httpx.HTTPError, TimeoutError, StopIteration):
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--nodes", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, required=True)
    parser.add_argument("--kubelet-port", type=int, default=0,
                        help="serve containers' logs on 127.0.0.1:PORT (0: not at all)")
    parser.add_argument("--tls-cert-file", type=Path, help="the log endpoint's certificate")
    parser.add_argument("--tls-private-key-file", type=Path, help="its key")
    parser.add_argument("--client-ca-file", type=Path,
                        help="the CA whose client certificates may read logs")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    tls = container_logs.tls_context(args.tls_cert_file, args.tls_private_key_file,
                                     args.client_ca_file) if args.kubelet_port else None
    agent = NodeAgent(args.kubeconfig, args.nodes, args.work_dir, args.kubelet_port, tls)

    async def serve() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        runner = asyncio.create_task(agent.run())
        await stop.wait()
        runner.cancel()
        await asyncio.gather(*(agent._kill(s, grace=2) for s in list(agent.pods.values())),
                             return_exceptions=True)

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
