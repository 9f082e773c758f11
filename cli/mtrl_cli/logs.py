"""`mtrl logs RUN`: the trainer's log, from its pods through the API server's pods/log as
`kubectl logs` reads it; `--worker`: the reward workers' logs, from their pods (backend
kubernetes) or from CloudWatch Logs (backend ecs-fargate: the run's status.resources.logGroup,
one stream per task, `<prefix>/<container>/<task id>` as the awslogs driver names them)."""

from __future__ import annotations

import functools
import queue
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from mtrl_api.run import WorkerBackend, WorkersSpec
from mtrl_cli import aws, command, display, kube
from mtrl_cli.errors import CliError
from mtrl_operator.naming import (
    COMPONENT_TRAINER_LOG,
    LABEL_ATTEMPT,
    LABEL_COMPONENT,
    LABEL_RUN_UID,
    TRAINER_LOG_KEY,
)

Warn = Callable[[str], None]
POLL_SECONDS = 2.0  # CloudWatch Logs has no follow: it is read again this often


def backend(run: dict[str, Any]) -> str:
    workers = (run.get("spec") or {}).get("workers") or {}
    return str(workers.get("backend") or WorkersSpec.model_fields["backend"].default)


def gone(run: dict[str, Any], component: str) -> str:
    """The one sentence for a run without pods of `component`."""
    status, whose = display.status(run), "trainer's" if component == "trainer" else "workers'"
    phase = display.phase(run)
    if phase in ("Succeeded", "Failed"):
        output = f"; its output folder is {status['outputUri']}" if status.get("outputUri") else ""
        return f"the {whose} pods are gone (run {phase} at {status.get('completionTime') or '?'})" \
               f"{output}"
    return f"the run has no {component} pods (phase {phase}" + \
        (f": {status['message']})" if status.get("message") else ")")


def _attempt(pod: dict[str, Any]) -> int:
    value = (pod["metadata"].get("labels") or {}).get(LABEL_ATTEMPT, "0")
    return int(value) if value.isdigit() else 0


def _write(lines: Iterator[str], prefix: str = "", live: bool = False) -> None:
    """Lines as they come; `live`: each one out at once (a pipe would hold them)."""
    for line in lines:
        sys.stdout.write(f"{prefix}{line}" if line.endswith("\n") else f"{prefix}{line}\n")
        if live:
            sys.stdout.flush()
    sys.stdout.flush()


def _follow_all(cluster: kube.Cluster, pods: list[dict[str, Any]], tail: int | None,
                warn: Warn) -> int:
    """Every pod's log at once, each line prefixed with its pod's name, until all end."""
    lines: queue.Queue[tuple[str, str | CliError | None]] = queue.Queue()

    def read(pod: dict[str, Any]) -> None:
        name = pod["metadata"]["name"]
        try:
            for line in cluster.pod_log(pod, follow=True, tail_lines=tail):
                lines.put((name, line))
            lines.put((name, None))
        except CliError as exc:
            lines.put((name, exc))

    for pod in pods:
        threading.Thread(target=read, args=(pod,), daemon=True).start()
    running, failed = len(pods), 0
    while running:
        name, item = lines.get()
        if isinstance(item, str):
            _write(iter([item]), f"[{name}] ", live=True)
        else:
            running -= 1
            if item is not None:
                failed += 1
                warn(str(item))
    return 1 if failed else 0


def kept_logs(cluster: kube.Cluster, run: dict[str, Any], tail: int | None) -> bool:
    """The logs the operator kept of failed trainer attempts (the tail of the failed container,
    in a ConfigMap the run owns), each under a header; False when there are none."""
    meta = run["metadata"]
    kept = cluster.config_maps(meta["namespace"], {LABEL_RUN_UID: meta["uid"],
                                                   LABEL_COMPONENT: COMPONENT_TRAINER_LOG})
    kept.sort(key=_attempt)
    for config_map in kept:
        data = config_map.get("data") or {}
        lines = (data.get(TRAINER_LOG_KEY) or "").splitlines()
        print(f"==> attempt {_attempt(config_map)}: pod/{data.get('pod', '?')} "
              f"({data.get('container', '?')}), kept when it failed <==", flush=True)
        _write(iter(lines[-tail:] if tail else lines))
    return bool(kept)


def pod_logs(cluster: kube.Cluster, run: dict[str, Any], component: str, follow: bool,
             tail: int | None, warn: Warn) -> int:
    """Each pod's log under a header when there are several; a pod that cannot be read is
    a warning and exit 1, the others are still shown."""
    meta = run["metadata"]
    pods = cluster.pods(meta["namespace"], {LABEL_RUN_UID: meta["uid"],
                                            LABEL_COMPONENT: component})
    if not pods and component == "trainer" and kept_logs(cluster, run, tail):
        return 0
    if not pods:
        raise CliError(gone(run, component))
    pods.sort(key=lambda p: (_attempt(p), p["metadata"]["name"]))
    if follow:  # the newest attempt's pods: the older ones have ended
        newest = [p for p in pods if _attempt(p) == _attempt(pods[-1])]
        if len(newest) > 1:
            return _follow_all(cluster, newest, tail, warn)
        pods = newest
    failed = 0
    for pod in pods:
        if len(pods) > 1:
            attempt = f" (attempt {_attempt(pod)})" if component == "trainer" else ""
            print(f"==> pod/{pod['metadata']['name']}{attempt} <==", flush=True)
        try:
            _write(cluster.pod_log(pod, follow=follow, tail_lines=tail), live=follow)
        except CliError as exc:
            failed += 1
            warn(str(exc))
    return 1 if failed else 0


def _task(stream: str) -> str:
    return stream.rsplit("/", 1)[-1]


def cloudwatch_logs(cluster: kube.Cluster, run: dict[str, Any], follow: bool,
                    tail: int | None) -> int:
    name, namespace = run["metadata"]["name"], run["metadata"]["namespace"]
    group = (display.status(run).get("resources") or {}).get("logGroup")
    if not group:
        raise CliError(f'run "{name}" has no status.resources.logGroup, so its workers\' '
                       "CloudWatch Logs cannot be found")
    events = sorted(aws.log_events(group), key=lambda e: (e["timestamp"], e["eventId"]))
    shown = {e["eventId"] for e in events}
    streams = {e["logStreamName"] for e in events}
    since = max((e["timestamp"] for e in events), default=None)
    for event in list(deque(events, maxlen=tail)) if tail is not None else events:
        print(_line(event, len(streams) > 1))
    sys.stdout.flush()
    while follow:
        finished = display.phase(cluster.run(name, namespace)) in ("Succeeded", "Failed")
        # From the newest time seen on, that time included: events of one millisecond may
        # arrive apart; those already shown are known by their ids.
        for event in sorted((e for e in aws.log_events(group, since) if e["eventId"] not in shown),
                            key=lambda e: (e["timestamp"], e["eventId"])):
            shown.add(event["eventId"])
            streams.add(event["logStreamName"])
            since = max(since or 0, event["timestamp"])
            print(_line(event, len(streams) > 1), flush=True)
        if finished:  # read once more after it ended: the workers' last words
            return 0
        time.sleep(POLL_SECONDS)
    return 0


def _line(event: dict[str, Any], prefixed: bool) -> str:
    text = str(event["message"]).rstrip("\n")
    return f"[{_task(event['logStreamName'])}] {text}" if prefixed else text


def main(argv: Sequence[str] | None = None) -> int:
    parser = command.parser("logs", __doc__)
    parser.add_argument("run", metavar="RUN", help="the run's name")
    kube.add_arguments(parser)
    parser.add_argument("--worker", action="store_true",
                        help="the reward workers' logs instead of the trainer's")
    parser.add_argument("-f", "--follow", action="store_true",
                        help="keep printing new lines until the pods (or the run) end")
    parser.add_argument("--tail", type=int, metavar="N", help="only the last N lines")
    args = parser.parse_args(argv)

    def logs() -> int:
        cluster = kube.connect(args)
        run = cluster.run(args.run, cluster.namespace)
        if args.worker and backend(run) == WorkerBackend.ECS_FARGATE:
            return cloudwatch_logs(cluster, run, args.follow, args.tail)
        return pod_logs(cluster, run, "worker" if args.worker else "trainer", args.follow,
                        args.tail, functools.partial(command.warn, parser))

    return command.reported(parser, logs)
