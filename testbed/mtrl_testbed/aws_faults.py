"""ECS as it fails half-way, in front of moto: Fargate short of capacity, and tasks that stop
on their own. An operator pointed at the proxy (AWS_ENDPOINT_URL) hears what real ECS says.

- **Capacity.** Each cluster may be given a placement budget: how many more tasks Fargate can
  place there. RunTask then answers HTTP 200 with at most that many tasks and one `failures`
  entry per task it could not place, reason `CAPACITY_REASON`, as ECS does
  (docs.aws.amazon.com/AmazonECS/latest/developerguide/api_failures_messages.html); with no
  budget left, no task at all. Budgets can be raised at any time (capacity comes back).
- **Tasks that stop.** `stop_task` stops a task the way a crashed worker stops: StopTask with
  ECS's own reason ("Essential container in task exited"), DescribeTasks then reports stop code
  `EssentialContainerExited` and the container's exit code, and the worker's last line is in
  its awslogs stream (worker/worker/<task id> of the run's log group), where the awslogs
  driver would have put it.

Everything else is moto's answer, unchanged. Throttling and 5xx are the robustness tests'
fault proxy (tests/robustness/faults.py).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from mtrl_testbed.aws_proxy import ForwardingHandler, ForwardingServer, RecordingProxy

CAPACITY_REASON = ("Capacity is unavailable at this time. Please try again later or in a "
                   "different availability zone")
ESSENTIAL_EXITED = "Essential container in task exited"
_TARGET = "AmazonEC2ContainerServiceV20141113."
_JSON = [("Content-Type", "application/x-amz-json-1.1")]


@dataclass
class EcsPlan:
    """What ECS can do now: placement budgets by cluster name (absent: no limit), and the
    exit of each task stopped from inside."""

    capacity: dict[str, int] = field(default_factory=dict)
    exits: dict[str, tuple[int, str]] = field(default_factory=dict)  # task ARN -> code, stop code
    run_tasks: Counter[str] = field(default_factory=Counter)  # RunTask calls by cluster
    shortfalls: Counter[str] = field(default_factory=Counter)  # tasks refused, by cluster
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def place(self, cluster: str, asked: int) -> int:
        """How many of `asked` tasks Fargate places in `cluster` now."""
        with self._lock:
            self.run_tasks[cluster] += 1
            budget = self.capacity.get(cluster)
            placed = asked if budget is None else min(asked, budget)
            if budget is not None:
                self.capacity[cluster] = budget - placed
            self.shortfalls[cluster] += asked - placed
            return placed


def _cluster_name(cluster: str) -> str:
    return cluster.rsplit("/", 1)[-1] or "default"


class EcsFaultHandler(ForwardingHandler):
    server: EcsFaultServer

    def exchange(self, body: bytes, headers: dict[str, str]
                 ) -> tuple[int, list[tuple[str, str]], bytes]:
        operation = self.headers.get("X-Amz-Target", "").removeprefix(_TARGET)
        if operation == "RunTask":
            return self._run_task(body, headers)
        status, reply_headers, payload = self.upstream(body, headers)
        if operation == "DescribeTasks" and status == 200 and self.server.plan.exits:
            payload = self._with_exits(payload)
        return status, reply_headers, payload

    def _run_task(self, body: bytes, headers: dict[str, str]
                  ) -> tuple[int, list[tuple[str, str]], bytes]:
        request = json.loads(body)
        asked = int(request.get("count") or 1)
        placed = self.server.plan.place(_cluster_name(request.get("cluster") or "default"),
                                        asked)
        answer: dict[str, Any] = {"tasks": [], "failures": []}
        if placed:
            status, reply_headers, payload = self.upstream(
                json.dumps({**request, "count": placed}).encode(), headers)
            if status != 200 or placed == asked:
                return status, reply_headers, payload
            answer = json.loads(payload)
        answer["failures"] = [*answer.get("failures", []),
                              *({"reason": CAPACITY_REASON} for _ in range(asked - placed))]
        return 200, _JSON, json.dumps(answer).encode()

    def _with_exits(self, payload: bytes) -> bytes:
        answer = json.loads(payload)
        for task in answer.get("tasks", []):
            if (exit_ := self.server.plan.exits.get(task.get("taskArn", ""))) is not None:
                code, stop_code = exit_
                task["stopCode"] = stop_code
                for container in task.get("containers") or []:
                    container["exitCode"] = code
                    container["lastStatus"] = "STOPPED"
        return json.dumps(answer).encode()


class EcsFaultServer(ForwardingServer):
    def __init__(self, upstream: str, plan: EcsPlan) -> None:
        super().__init__(upstream, EcsFaultHandler)
        self.plan = plan


class EcsFaultProxy(RecordingProxy):
    """`with EcsFaultProxy(moto.endpoint) as proxy:` ... `proxy.plan.capacity["c"] = 1`."""

    def __init__(self, upstream: str, plan: EcsPlan | None = None) -> None:
        self.plan = plan or EcsPlan()
        super().__init__(upstream, EcsFaultServer(upstream, self.plan))

    def stop_task(self, ecs: Any, logs: Any, cluster: str, task_arn: str, exit_code: int,
                  last_line: str, log_group: str) -> None:
        """Stop a task as its crashed worker would (with clients pointed at moto itself): the
        worker's last line in its log stream, then ECS's reason, stop code and exit code."""
        stream = f"worker/worker/{task_arn.rsplit('/', 1)[-1]}"
        with contextlib.suppress(logs.exceptions.ResourceAlreadyExistsException):
            logs.create_log_stream(logGroupName=log_group, logStreamName=stream)
        now = int(time.time() * 1000)
        logs.put_log_events(logGroupName=log_group, logStreamName=stream, logEvents=[
            {"timestamp": now - 1, "message": "starting worker"},
            {"timestamp": now, "message": last_line}])
        self.plan.exits[task_arn] = (exit_code, "EssentialContainerExited")
        ecs.stop_task(cluster=cluster, task=task_arn, reason=ESSENTIAL_EXITED)
