"""One operator replica, many concurrent runs (target P4 in bench/NOTES.md, issue 7).

For each N, on the local control plane with moto, with compute simulated:

1. a fresh operator process starts (so its peak RSS and CPU belong to this N alone);
2. N runs are created at once, each with a PyTorchJob trainer (no training operator runs here:
   this script plays it, marking each PyTorchJob Running as soon as it appears) and one
   ECS Fargate worker (moto holds tasks at RUNNING);
3. time until every run's phase is Running;
4. every PyTorchJob is marked Succeeded; time until every run is Succeeded and moto holds no
   queue, no running task and no task definition of any run (teardown; the workers' log
   group stays with the finished run, for its last words);
5. every run is deleted; time until the API server has none left, nor moto any log group;
6. the operator's peak RSS (VmHWM) and CPU seconds from /proc (also at the moment all runs
   were Running, and the CPU of moto, kube-apiserver and etcd), its Kubernetes API requests
   from the API server's audit log (it runs as the chart's ServiceAccount, under the chart's
   RBAC and admission policy, and the log records that user's requests), its AWS requests
   from its `mtrl_cloud_api_requests_total` counter (botocore's before-send: retries
   included), and its reconciles from `mtrl_reconcile_seconds_count`.

    python bench/scale_bench.py --runs 10 100 500 1000
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx2
from lightkube import Client
from lightkube.config.kubeconfig import KubeConfig
from lightkube.core.exceptions import ApiError
from lightkube.resources.core_v1 import ConfigMap, Namespace
from lightkube.types import PatchType

from mtrl_operator.adapters.kube import MultiTurnRLRun, PyTorchJob
from mtrl_testbed import census, chart_identity
from mtrl_testbed.chart_identity import ChartIdentity
from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.moto import EXECUTION_ROLE_ARN, MotoServer
from mtrl_testbed.operator import OperatorProcess
from mtrl_testbed.ports import wait_until
from mtrl_testbed.standin_trainer import finished_report

REPO = Path(__file__).resolve().parents[1]
PYTORCHJOB_CRD = REPO / "tests" / "fixtures" / "thirdparty-crds" / "kubeflow.org_pytorchjobs.yaml"
OPERATOR_USER = chart_identity.USERNAME
POLL = 0.1  # for the run phases, kept by a watch; moto is asked every 0.5 s
CLK_TCK = os.sysconf("SC_CLK_TCK")
MAX_STEPS = 100  # each run's grpo.maxSteps (the default), which its trainer reports reaching


def run_manifest(name: str, subnet: str, group: str) -> dict[str, Any]:
    return {
        "apiVersion": "mtrl.dev/v1alpha1", "kind": "MultiTurnRLRun",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "random:tiny-qwen2"}, "grpo": {"maxSteps": MAX_STEPS},
            "trainer": {"launcher": "PyTorchJob", "gpusPerNode": 8, "efaPerNode": 32},
            "rollout": {"environment": "target"},
            "workers": {"backend": "ecs-fargate", "cpu": 256, "memory": 512, "minReplicas": 1,
                        "maxReplicas": 1, "ecs": {"subnets": [subnet], "securityGroups": [group],
                                "executionRoleArn": EXECUTION_ROLE_ARN}},
            "dataset": {"inline": {"train": [{"target": "a"}]}},
            "output": {"s3Uri": "s3://bench-outputs/runs"},
        },
    }


class TrainingOperator:
    """Plays the Kubeflow training operator: a PyTorchJob is Running once it exists, and
    Succeeded `succeed_after` seconds later, or when `finish_all` says so."""

    def __init__(self, client: Client, namespace: str,
                 succeed_after: Callable[[], float] | None = None) -> None:
        self.client, self.namespace, self.succeed_after = client, namespace, succeed_after
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def start(self) -> TrainingOperator:
        self.thread.start()
        return self

    def _set(self, name: str, *types: str) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        conditions = [{"type": t, "status": "True", "reason": t, "lastTransitionTime": now,
                       "lastUpdateTime": now} for t in types]
        self.client.patch(PyTorchJob.Status, name, {"status": {"conditions": conditions}},
                          namespace=self.namespace, patch_type=PatchType.MERGE)

    def _watch(self) -> None:
        while not self.stopped.is_set():
            try:
                for event, job in self.client.watch(PyTorchJob, namespace=self.namespace):
                    if self.stopped.is_set():
                        return
                    if event == "ADDED" and not (job.status or {}).get("conditions"):
                        self._set(job.metadata.name, "Created", "Running")
                        if self.succeed_after:
                            threading.Timer(self.succeed_after(), self._succeed,
                                            [job.metadata.name]).start()
            except Exception as exc:  # a cut watch: watch again
                print(f"PyTorchJob watch ended: {exc!r}", file=sys.stderr, flush=True)
                time.sleep(0.5)

    def _succeed(self, name: str) -> None:
        with contextlib.suppress(ApiError):  # the run may be gone already
            self._finish(self.client.get(PyTorchJob, name, namespace=self.namespace))

    def _finish(self, job: Any) -> None:
        """As a trainer ends: its report of the outcome (the operator's evidence), then the
        job's Succeeded."""
        container = job.spec["pytorchReplicaSpecs"]["Master"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value", "") for e in container.get("env") or []}
        name, patch = finished_report(env, MAX_STEPS)
        self.client.patch(ConfigMap, name, patch, namespace=self.namespace,
                          patch_type=PatchType.MERGE)
        self._set(job.metadata.name, "Created", "Succeeded")

    def finish_all(self) -> None:
        for job in self.client.list(PyTorchJob, namespace=self.namespace):
            self._finish(job)


class PhaseWatch:
    """Every run's phase, kept from one watch stream: listing 500 runs twice a second would
    cost the API server and this script more CPU than the operator spends on them."""

    def __init__(self, client: Client, namespace: str) -> None:
        self.client, self.namespace = client, namespace
        self.phases: dict[str, str] = {}
        self.stopped = threading.Event()
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        while not self.stopped.is_set():
            try:  # a watch without a version starts with an ADDED for each run there is
                seen: dict[str, str] = {}
                for event, run in self.client.watch(MultiTurnRLRun, namespace=self.namespace):
                    name = run.metadata.name
                    if event == "DELETED":
                        seen.pop(name, None)
                    else:
                        seen[name] = (run.status or {}).get("phase") or "none"
                    self.phases = dict(seen)
            except Exception as exc:  # a cut watch: watch again
                print(f"run watch ended: {exc!r}", file=sys.stderr, flush=True)
                time.sleep(0.5)

    def count(self, phase: str) -> int:
        return sum(p == phase for p in self.phases.values())


def memory_mib(pid: int, field: str) -> float:
    """A memory figure of /proc/<pid>/status (VmRSS: resident now; VmHWM: its peak)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"{field}:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]


def _proc_figures(pid: int) -> dict[str, float]:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime
    return {"peak_rss_mib": memory_mib(pid, "VmHWM"), "cpu_s": cpu}


def _server_pids(cluster: LocalCluster, moto: MotoServer) -> dict[str, int]:
    return {"moto": moto.pid, **cluster.pids(("kube-apiserver", "etcd"))}


def _metric_sum(text: str, name: str) -> float:
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def _aws_requests(text: str) -> Counter[str]:
    """The operator's AWS requests by operation, from its counter."""
    out: Counter[str] = Counter()
    for m in re.finditer(r'^mtrl_cloud_api_requests_total\{(.*)\} (\S+)$', text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m[1]))
        out[labels.get("operation", "?")] += int(float(m[2]))
    return out


def _kube_requests(audit: Path, offset: int) -> Counter[str]:
    """The operator's requests written to the audit log after `offset`, by verb."""
    verbs: Counter[str] = Counter()
    with audit.open() as f:
        f.seek(offset)
        for line in f:
            entry = json.loads(line)
            if entry.get("user", {}).get("username") == OPERATOR_USER:
                verbs[entry["verb"]] += 1
                if os.environ.get("SCALE_BENCH_REQUESTS"):  # where each verb goes, by resource
                    ref = entry.get("objectRef") or {}
                    print("k8s", entry["verb"], ref.get("resource"), ref.get("subresource", ""),
                          entry.get("responseStatus", {}).get("code"), file=sys.stderr)
    return verbs


def _until(check: Any, timeout: float, what: str, interval: float = POLL) -> float:
    wait_until(check, timeout, what, interval=interval)
    return time.monotonic()


def delete_all(client: Client, namespace: str) -> None:
    """DeleteCollection of every run, asked again when the API server cuts the call: its
    request timeout (60 s) is shorter than marking 1,000 runs deleted one after another."""
    while True:
        try:
            client.deletecollection(MultiTurnRLRun, namespace=namespace)
            return
        except httpx2.TransportError as exc:
            print(f"deletecollection cut ({exc!r}); asking again", file=sys.stderr, flush=True)


def measure(cluster: LocalCluster, moto: MotoServer, identity: ChartIdentity, root: Path, n: int,
            timeout: float) -> dict[str, Any]:
    moto.reset()
    subnet, group = moto.prepare_fargate()
    moto.bucket("bench-outputs")  # the runs' output bucket, which preflight checks
    # Deleting 500 runs in one call takes longer than lightkube's default 10 s.
    client = Client(KubeConfig.from_file(str(cluster.kubeconfig)), timeout=httpx2.Timeout(300))
    namespace = f"scale-{n}"
    client.create(Namespace.from_dict({"metadata": {"name": namespace}}))
    audit_offset = cluster.audit_log.stat().st_size if cluster.audit_log.exists() else 0
    operator = OperatorProcess(cluster, {**moto.env(), **identity.env, "MTRL_RESYNC_SECONDS": "30",
                                         "MTRL_SWEEP_INTERVAL_SECONDS": "0",
                                         "MTRL_OPERATOR_ID": f"scale-{n}",
                                         "MTRL_LOG_FORMAT": "json"},
                               root / f"operator-{n}.log",
                               kubeconfig=identity.kubeconfig).start()
    trainer_operator = TrainingOperator(client, namespace).start()
    runs = PhaseWatch(client, namespace)
    try:
        wait_until(lambda: urllib.request.urlopen(
            f"http://127.0.0.1:{operator.health_port}/healthz", timeout=2).status == 200,
            60, "operator liveness")
        assert operator.proc is not None
        pid = operator.proc.pid
        servers_before = {name: _proc_figures(p)["cpu_s"]
                          for name, p in _server_pids(cluster, moto).items()}
        t0, own_cpu0 = time.monotonic(), time.process_time()
        for i in range(n):
            client.create(MultiTurnRLRun.from_dict(run_manifest(f"run-{i}", subnet, group)),
                          namespace=namespace)
        t_created = time.monotonic()
        t_running = _until(lambda: runs.count("Running") == n, timeout,
                           f"{n} runs Running")
        cpu_to_running = _proc_figures(pid)["cpu_s"]
        own_cpu_to_running = time.process_time() - own_cpu0
        servers_at_running = {name: _proc_figures(p)["cpu_s"] - servers_before[name]
                              for name, p in _server_pids(cluster, moto).items()}
        metrics_at_running = urllib.request.urlopen(
            f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5).read().decode()
        t_finish = time.monotonic()
        trainer_operator.finish_all()
        t_succeeded = _until(lambda: runs.count("Succeeded") == n, timeout,
                             f"{n} runs Succeeded")
        # A finished run keeps its workers' log group (its last words) until it is deleted.
        t_clean = _until(lambda: not set(census.all_aws()) - {"log_groups"}
                         and not list(client.list(PyTorchJob, namespace=namespace)), timeout,
                         "teardown of every run", interval=0.5)
        t_delete = time.monotonic()
        delete_all(client, namespace)
        t_gone = _until(lambda: not runs.phases and not census.all_aws(),
                        timeout, f"{n} runs and their log groups deleted", interval=0.5)
        time.sleep(2)  # the audit log's batch writer flushes every second
        metrics_text = urllib.request.urlopen(
            f"http://127.0.0.1:{operator.metrics_port}/metrics", timeout=5).read().decode()
        figures = _proc_figures(pid)
        servers_cpu = {name: _proc_figures(p)["cpu_s"] - servers_before[name]
                       for name, p in _server_pids(cluster, moto).items()}
    finally:
        trainer_operator.stopped.set()
        runs.stopped.set()
        operator.stop()
        with contextlib.suppress(ApiError):
            client.delete(Namespace, namespace)
    kube = _kube_requests(cluster.audit_log, audit_offset)
    aws = _aws_requests(metrics_text)
    reconciles = _metric_sum(metrics_text, "mtrl_reconcile_seconds_count")
    aws_to_running = _aws_requests(metrics_at_running)
    return {
        "runs": n,
        "create_s": t_created - t0,
        "all_running_s": t_running - t0,
        "finish_to_clean_s": max(t_succeeded, t_clean) - t_finish,
        "delete_to_gone_s": t_gone - t_delete,
        "peak_rss_mib": figures["peak_rss_mib"],
        "cpu_s": figures["cpu_s"],
        # The operator's own share of the time to Running: what it would take on a core of
        # its own, with the API server and AWS elsewhere (here all share 2 cores).
        "cpu_to_running_s": cpu_to_running,
        "cpu_ms_per_run": 1000 * figures["cpu_s"] / n,
        "kube_requests_per_run": sum(kube.values()) / n,
        "kube_requests_by_verb": dict(kube),
        "aws_requests_per_run": sum(aws.values()) / n,
        "aws_requests_by_operation": dict(aws),
        "reconciles_per_run": reconciles / n,
        # Until every run was Running: what the time to Running is made of.
        "aws_requests_to_running_per_run": sum(aws_to_running.values()) / n,
        "aws_requests_to_running_by_operation": dict(aws_to_running),
        "reconciles_to_running_per_run":
            _metric_sum(metrics_at_running, "mtrl_reconcile_seconds_count") / n,
        "servers_cpu_to_running_s": sum(servers_at_running.values()),
        "moto_cpu_to_running_s": servers_at_running["moto"],
        "apiserver_etcd_cpu_to_running_s":
            servers_at_running["kube-apiserver"] + servers_at_running["etcd"],
        # This script's own share (creating the runs, watching them, playing the training
        # operator): it runs on the same 2 cores.
        "bench_cpu_to_running_s": own_cpu_to_running,
        "moto_cpu_s": servers_cpu["moto"],
        "apiserver_etcd_cpu_s": servers_cpu["kube-apiserver"] + servers_cpu["etcd"],
    }


COLUMNS = [("runs", "runs", "{:d}"), ("all_running_s", "all Running (s)", "{:.1f}"),
           ("cpu_to_running_s", "operator CPU until all Running (s)", "{:.1f}"),
           ("servers_cpu_to_running_s", "servers' CPU until all Running (s)", "{:.1f}"),
           ("aws_requests_to_running_per_run", "AWS req/run until all Running", "{:.1f}"),
           ("reconciles_to_running_per_run", "reconciles/run until all Running", "{:.1f}"),
           ("finish_to_clean_s", "finish -> torn down (s)", "{:.1f}"),
           ("delete_to_gone_s", "delete -> gone (s)", "{:.1f}"),
           ("peak_rss_mib", "peak RSS (MiB)", "{:.0f}"), ("cpu_s", "CPU (s)", "{:.1f}"),
           ("cpu_ms_per_run", "CPU ms/run", "{:.0f}"),
           ("kube_requests_per_run", "k8s req/run", "{:.1f}"),
           ("aws_requests_per_run", "AWS req/run", "{:.1f}"),
           ("reconciles_per_run", "reconciles/run", "{:.1f}"),
           ("moto_cpu_s", "moto CPU (s)", "{:.1f}"),
           ("apiserver_etcd_cpu_s", "apiserver+etcd CPU (s)", "{:.1f}")]


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| " + " | ".join(title for _, title, _ in COLUMNS) + " |",
             "|" + "---:|" * len(COLUMNS)]
    for r in results:
        lines.append("| " + " | ".join(fmt.format(r[key]) for key, _, fmt in COLUMNS) + " |")
    for key, title in (("kube_requests_by_verb", "k8s"), ("aws_requests_by_operation", "AWS")):
        lines += ["", *_per_run(results, key, title)]
    return "\n".join(lines)


def _per_run(results: list[dict[str, Any]], key: str, title: str) -> list[str]:
    """One column per request kind (verb, operation), in requests per run."""
    kinds = sorted({k for r in results for k in r[key]})
    return ["| runs | " + " | ".join(f"{title} {k}/run" for k in kinds) + " |",
            "|" + "---:|" * (len(kinds) + 1),
            *(f"| {r['runs']} | " + " | ".join(f"{r[key].get(k, 0) / r['runs']:.2f}"
                                             for k in kinds) + " |" for r in results)]


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[10, 100, 500, 1000])
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds allowed for each stage at each N")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="mtrl-scale-"))
    cluster = LocalCluster(root, audit_users=(OPERATOR_USER,)).start()
    moto = MotoServer(log_path=root / "moto.log").start()
    results = []
    try:
        os.environ.update(moto.env())
        cluster.install_crds(REPO / "crds")
        cluster.install_crds(PYTORCHJOB_CRD)
        identity = chart_identity.install(cluster)
        for n in args.runs:
            results.append(measure(cluster, moto, identity, root, n, args.timeout))
            print(json.dumps(results[-1]), flush=True)
    finally:
        moto.stop()
        cluster.stop()
    print(table(results))
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))
    return results


if __name__ == "__main__":
    main()
