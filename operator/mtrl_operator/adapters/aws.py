"""SQS and ECS calls: boto3 clients run in threads, with botocore's standard retries.

Every create is preceded by a look-up of what the deterministic name or `startedBy` says
should exist, so a repeated call after a crash finds the first result instead of making a
second. (moto ignores ECS client tokens; real ECS honours them as a second line of defence.)
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from mtrl_operator import metrics
from mtrl_operator.adapters.mutations import guard_aws_client
from mtrl_operator.builders.queues import DLQ, WORK_QUEUES, QueueRequest
from mtrl_operator.errors import SPEC_ERROR_CODES, SpecError
from mtrl_operator.naming import QUEUE_ROLES, RunNames
from mtrl_operator.reconcile.draft import OPERATOR_STOP_REASON, EcsTask, Placement
from mtrl_operator.reconcile.preflight import Found
from mtrl_operator.reconcile.sweep import Owner, Tagged
from mtrl_rollout.queues import MANAGED_BY, TAG_CLUSTER_ID, TAG_MANAGED_BY, TAG_OPERATOR_ID

log = logging.getLogger("mtrl.aws")

RETRY_CONFIG = Config(retries={"max_attempts": 8, "mode": "standard"}, connect_timeout=5,
                      read_timeout=30, max_pool_connections=32)
QUEUE_GONE = ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist")


def _task(t: dict[str, Any]) -> EcsTask:
    """A DescribeTasks entry: state, and for a stopped task why (its worker container's)."""
    container = next((c for c in t.get("containers") or [] if c.get("name") == "worker"),
                     (t.get("containers") or [{}])[0])
    return EcsTask(t["taskArn"], t.get("lastStatus", ""), t.get("desiredStatus", ""),
                   t.get("healthStatus", "UNKNOWN"), t.get("taskDefinitionArn", ""),
                   stopped_reason=t.get("stoppedReason", ""), stop_code=t.get("stopCode", ""),
                   exit_code=container.get("exitCode"),
                   container_reason=container.get("reason", ""),
                   stopped_at=t.get("stoppedAt"))


def _queue_role(names: RunNames, url: str) -> str | None:
    name = url.rsplit("/", 1)[-1]
    for role in QUEUE_ROLES:
        if name == names.queue(role):
            return role
    return None


def _count_request(event_name: str, **kwargs: Any) -> None:
    _, service, operation = event_name.split(".", 2)  # before-send.<service>.<Operation>
    metrics.CLOUD_REQUESTS.labels(service=service, operation=operation).inc()


def client(session: boto3.session.Session, service: str) -> Any:
    """A client with the operator's retry settings whose every HTTP request is counted."""
    made = session.client(service, config=RETRY_CONFIG)
    made.meta.events.register("before-send", _count_request)
    guard_aws_client(made)
    return made


async def call(client: Any, op: str, **kwargs: Any) -> dict[str, Any]:
    """One boto3 call in a thread; its error, if any, is counted by operation and code."""
    try:
        return await asyncio.to_thread(getattr(client, op), **kwargs)
    except ClientError as exc:
        metrics.CLOUD_ERRORS.labels(operation=op,
                                    code=exc.response.get("Error", {}).get("Code", "?")).inc()
        raise


def all_pages(fetch: Callable[..., dict[str, Any]], key: str, token_in: str, token_out: str,
              ) -> list[Any]:
    """Every item of a paginated AWS list call, following its token to the last page. ECS
    lists at most 100 tasks or task definitions a page, SQS 1000 queues, CloudWatch Logs 50
    groups: a single call sees only the first page. `fetch` takes the token as a keyword."""
    items: list[Any] = []
    token: str | None = None
    while True:
        page = fetch(**({token_in: token} if token else {}))
        items += page.get(key) or []
        token = page.get(token_out)
        if not token:
            return items


async def paged(client: Any, op: str, key: str, token_in: str = "nextToken",
                token_out: str = "nextToken", **kwargs: Any) -> list[Any]:
    """`all_pages` of one boto3 call, in a thread; an error is counted as `call` counts it."""
    try:
        return await asyncio.to_thread(all_pages, functools.partial(getattr(client, op), **kwargs),
                                       key, token_in, token_out)
    except ClientError as exc:
        metrics.CLOUD_ERRORS.labels(operation=op,
                                    code=exc.response.get("Error", {}).get("Code", "?")).inc()
        raise


async def tagged_resources(tagging: Any, owner: Owner, types: list[str]) -> list[Tagged]:
    """(ARN, tags) of every resource of `types` tagged with this operator's id and cluster, all
    pages. The tagging API filters; `reconcile.sweep` checks the tags again."""
    found = await paged(tagging, "get_resources", "ResourceTagMappingList",
                        token_in="PaginationToken", token_out="PaginationToken",
                        TagFilters=[{"Key": TAG_MANAGED_BY, "Values": [MANAGED_BY]},
                                    {"Key": TAG_OPERATOR_ID, "Values": [owner.operator_id]},
                                    {"Key": TAG_CLUSTER_ID, "Values": [owner.cluster_id]}],
                        ResourceTypeFilters=types, ResourcesPerPage=100)
    return [(item["ResourceARN"], {t["Key"]: t["Value"] for t in item.get("Tags", [])})
            for item in found]


class Aws:
    def __init__(self, region: str) -> None:
        session = boto3.session.Session(region_name=region)
        self.region = region
        self.sqs = client(session, "sqs")
        self.ecs = client(session, "ecs")
        self.tagging = client(session, "resourcegroupstaggingapi")
        self.s3 = client(session, "s3")
        self.logs = client(session, "logs")

    def _spec_error(self, op: str, exc: ClientError) -> SpecError | None:
        code = exc.response["Error"].get("Code", "?")
        if code in SPEC_ERROR_CODES:
            return SpecError(code, f"{op} in {self.region}: "
                                   f"{exc.response['Error'].get('Message', code)}")
        return None

    async def _call(self, client: Any, op: str, **kwargs: Any) -> dict[str, Any]:
        try:
            return await call(client, op, **kwargs)
        except ClientError as exc:
            if (error := self._spec_error(op, exc)) is not None:
                raise error from exc
            raise

    async def _paged(self, client: Any, op: str, key: str, **kwargs: Any) -> list[Any]:
        """Every page of a list call (`paged`), with `_call`'s errors."""
        try:
            return await paged(client, op, key, **kwargs)
        except ClientError as exc:
            if (error := self._spec_error(op, exc)) is not None:
                raise error from exc
            raise

    # ------------------------------------------------------------------ preflight

    async def s3_find(self, bucket: str, prefix: str, whole_key: bool) -> Found:
        """Whether an object (`whole_key`) or anything under a prefix exists. ListObjectsV2
        needs only s3:ListBucket, never the right to read the data; the first key listed is
        the key itself when it exists, as keys list in lexicographic order."""
        try:
            resp = await call(self.s3, "list_objects_v2", Bucket=bucket, Prefix=prefix, MaxKeys=1)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code == "NoSuchBucket":
                return Found.NO_BUCKET
            if code in ("AccessDenied", "AllAccessDisabled"):
                return Found.DENIED
            raise
        keys = [o["Key"] for o in resp.get("Contents") or []]
        if whole_key:
            return Found.PRESENT if keys[:1] == [prefix] else Found.NOTHING
        return Found.PRESENT if keys else Found.NOTHING

    async def s3_keys(self, bucket: str, prefix: str, limit: int) -> list[str]:
        """The keys under `prefix`, in order, at most `limit` of them (ListObjectsV2, page by
        page; s3:ListBucket only)."""
        keys: list[str] = []
        token: str | None = None
        while len(keys) < limit:
            page = await call(self.s3, "list_objects_v2", Bucket=bucket, Prefix=prefix,
                              **({"ContinuationToken": token} if token else {}))
            keys += [o["Key"] for o in page.get("Contents") or []]
            token = page.get("NextContinuationToken")
            if not token:
                break
        return keys[:limit]

    async def describe_cluster(self, cluster: str) -> dict[str, Any]:
        return await self._call(self.ecs, "describe_clusters", clusters=[cluster])

    # ------------------------------------------------------------------ worker logs

    async def ensure_log_group(self, name: str, tags: dict[str, str], retention_days: int) -> None:
        """The group, tagged at creation (so the sweeper finds it), with its retention."""
        try:
            await self._call(self.logs, "create_log_group", logGroupName=name, tags=tags)
        except ClientError as exc:
            if exc.response["Error"].get("Code") != "ResourceAlreadyExistsException":
                raise
            return
        metrics.RESOURCES_CREATED.labels(kind="log-group").inc()
        await self._call(self.logs, "put_retention_policy", logGroupName=name,
                         retentionInDays=retention_days)

    async def log_group_exists(self, name: str) -> bool:
        groups = await self._paged(self.logs, "describe_log_groups", "logGroups",
                                   logGroupNamePrefix=name)
        return any(g["logGroupName"] == name for g in groups)

    async def delete_log_group(self, name: str) -> bool:
        try:
            await self._call(self.logs, "delete_log_group", logGroupName=name)
        except ClientError as exc:
            if exc.response["Error"].get("Code") == "ResourceNotFoundException":
                return False
            raise
        metrics.RESOURCES_DELETED.labels(kind="log-group").inc()
        return True

    # ------------------------------------------------------------------ queues

    async def queues(self, names: RunNames) -> dict[str, str]:
        """role -> URL of the run's queues that exist (reply queues of workers excluded)."""
        out = {}
        for url in await self._queue_urls(names):
            role = _queue_role(names, url)
            if role:
                out[role] = url
        return out

    async def _queue_urls(self, names: RunNames) -> list[str]:
        """Every queue under the run's prefix: its four, and one reply queue per worker (up to
        1000 workers, so more than one page of ListQueues)."""
        return await self._paged(self.sqs, "list_queues", "QueueUrls", token_in="NextToken",
                                 token_out="NextToken", QueueNamePrefix=names.aws_prefix,
                                 MaxResults=1000)

    async def _create_queue(self, req: QueueRequest) -> str:
        resp = await self._call(self.sqs, "create_queue", QueueName=req.name,
                                Attributes=req.attributes, tags=req.tags)
        metrics.RESOURCES_CREATED.labels(kind="queue").inc()
        return resp["QueueUrl"]

    async def queue_arn(self, url: str) -> str:
        resp = await self._call(self.sqs, "get_queue_attributes", QueueUrl=url,
                                AttributeNames=["QueueArn"])
        return resp["Attributes"]["QueueArn"]

    async def ensure_queues(self, names: RunNames, dlq_req: QueueRequest, work_req: Any,
                            existing: dict[str, str]) -> dict[str, str]:
        """Create the dead-letter queue, then the work queues that redrive into it, except
        those in `existing` (`queues()`, just read). `work_req(role, dlq_arn)` builds each work
        queue's request. CreateQueue with the same name and attributes returns the existing
        queue, so this is safe to repeat. Returns role -> URL of all of them, from CreateQueue's
        own answers: SQS asks to wait a second before a new queue is used, and a ListQueues
        that soon may not list it yet."""
        urls = dict(existing)
        urls[DLQ] = existing.get(DLQ) or await self._create_queue(dlq_req)
        dlq_arn = await self.queue_arn(urls[DLQ])
        for role in WORK_QUEUES:
            if role not in existing:
                urls[role] = await self._create_queue(work_req(role, dlq_arn))
        return urls

    async def delete_queues(self, names: RunNames) -> int:
        """Delete every queue under the run's prefix, workers' reply queues included."""
        urls = await self._queue_urls(names)
        for url in urls:
            await self._delete_queue(url)
        return len(urls)

    async def _delete_queue(self, url: str) -> None:
        try:
            await self._call(self.sqs, "delete_queue", QueueUrl=url)
        except ClientError as exc:
            if exc.response["Error"].get("Code") not in QUEUE_GONE:
                raise
        metrics.RESOURCES_DELETED.labels(kind="queue").inc()

    # ------------------------------------------------------------------ payloads

    async def delete_payloads(self, bucket: str, prefix: str) -> int:
        """Delete every object under the run's payload prefix (what readers that died before
        their delete left): ListObjectsV2 page by page, DeleteObjects 1000 keys a call. A
        bucket that is gone holds nothing; a denied listing (a policy without
        `DeleteRunPayloads`) is logged and leaves them, so teardown never hangs on it."""
        try:
            objects = await self._paged(self.s3, "list_objects_v2", "Contents",
                                        token_in="ContinuationToken",
                                        token_out="NextContinuationToken",
                                        Bucket=bucket, Prefix=f"{prefix}/")
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            if code == "NoSuchBucket":
                return 0
            if code in ("AccessDenied", "AllAccessDisabled"):
                log.warning("cannot list s3://%s/%s/ to delete the run's payloads (%s): the "
                            "operator's role needs the DeleteRunPayloads statement "
                            "(docs/iam.md); they stay until the bucket's lifecycle rule "
                            "removes them", bucket, prefix, code)
                return 0
            raise
        keys = [o["Key"] for o in objects]
        for i in range(0, len(keys), 1000):
            await self._call(self.s3, "delete_objects", Bucket=bucket, Delete={
                "Objects": [{"Key": k} for k in keys[i:i + 1000]], "Quiet": True})
        if keys:
            metrics.RESOURCES_DELETED.labels(kind="payload").inc(len(keys))
        return len(keys)

    # ------------------------------------------------------------------ ECS

    async def active_task_definitions(self, names: RunNames) -> list[str]:
        arns = await self._paged(self.ecs, "list_task_definitions", "taskDefinitionArns",
                                 familyPrefix=names.task_family, status="ACTIVE", sort="DESC")
        return [arn for arn in arns
                if arn.rsplit("/", 1)[-1].rsplit(":", 1)[0] == names.task_family]

    async def ensure_task_definition(self, names: RunNames, body: dict[str, Any],
                                     known: str | None = None, looked: bool = False) -> str:
        """The run's active task definition: `known` (just observed), else the newest one
        registered (unless the observation `looked` and found none), else a new one."""
        if known:
            return known
        active = [] if looked else await self.active_task_definitions(names)
        if active:
            return active[0]
        resp = await self._call(self.ecs, "register_task_definition", **body)
        metrics.RESOURCES_CREATED.labels(kind="task-definition").inc()
        return resp["taskDefinition"]["taskDefinitionArn"]

    async def deregister_task_definitions(self, names: RunNames) -> int:
        active = await self.active_task_definitions(names)
        for arn in active:
            await self._call(self.ecs, "deregister_task_definition", taskDefinition=arn)
            metrics.RESOURCES_DELETED.labels(kind="task-definition").inc()
        return len(active)

    async def worker_tasks(self, names: RunNames, cluster: str,
                           desired: tuple[str, ...] = ("RUNNING", "STOPPED")) -> list[EcsTask]:
        """The run's tasks whose desired status is one of `desired`: RUNNING alone leaves out
        those told to stop (one call less, while every worker is there and none needs
        replacing)."""
        arns: list[str] = []
        for status in desired:
            try:
                arns += await self._paged(self.ecs, "list_tasks", "taskArns", cluster=cluster,
                                          startedBy=names.started_by, desiredStatus=status)
            except SpecError as exc:
                if exc.reason == "ClusterNotFoundException":  # no cluster, no tasks
                    return []
                raise
        if not arns:
            return []
        tasks = []
        for i in range(0, len(arns), 100):
            resp = await self._call(self.ecs, "describe_tasks", cluster=cluster,
                                    tasks=arns[i:i + 100])
            tasks += [_task(t) for t in resp.get("tasks", [])]
        return tasks

    async def last_log_line(self, group: str, stream: str) -> str:
        """The last non-empty line a worker logged (its awslogs stream), or "" when there is
        none or the operator may not read it."""
        try:
            resp = await self._call(self.logs, "get_log_events", logGroupName=group,
                                    logStreamName=stream, limit=20, startFromHead=False)
        except ClientError as exc:
            log.debug("no log events in %s %s: %s", group, stream, exc)
            return ""
        lines = [line.strip() for e in resp.get("events", [])
                 for line in (e.get("message") or "").splitlines() if line.strip()]
        return lines[-1] if lines else ""

    async def run_tasks(self, requests: list[dict[str, Any]]) -> Placement:
        """Every request's RunTask, and what they answered together. ECS answers HTTP 200
        with fewer tasks than asked and a `failures` entry per task it could not place
        (Fargate short of capacity): that is a Placement that fell short, not an error."""
        started: list[str] = []
        failures: list[str] = []
        for req in requests:
            try:
                resp = await self._call(self.ecs, "run_task", **req)
            except SpecError as exc:
                if exc.reason != "ClusterNotFoundException":
                    raise
                raise SpecError(exc.reason, f"ECS cluster {req['cluster']!r} was not found in "
                                            f"{self.region} (RunTask): set spec.workers.ecs."
                                            "cluster or the operator's MTRL_ECS_CLUSTER") from exc
            metrics.RESOURCES_CREATED.labels(kind="task").inc(len(resp.get("tasks", [])))
            started += [t["taskArn"] for t in resp.get("tasks", [])]
            for failure in resp.get("failures") or []:
                reason = failure.get("reason") or "no reason given"
                failures.append(f"{reason} ({failure['detail']})" if failure.get("detail")
                                else reason)
            if resp.get("failures"):
                log.warning("run_task failures: %s", resp["failures"])
        return Placement(asked=sum(r["count"] for r in requests), started=len(started),
                         failures=tuple(failures))

    async def stop_tasks(self, cluster: str, arns: list[str]) -> None:
        for arn in arns:
            await self._call(self.ecs, "stop_task", cluster=cluster, task=arn,
                             reason=OPERATOR_STOP_REASON)
            metrics.RESOURCES_DELETED.labels(kind="task").inc()

    # ------------------------------------------------------------------ sweeping

    async def tagged(self, owner: Owner) -> list[Tagged]:
        """(ARN, tags) of the resources this operator tagged: queues, tasks, task definitions
        and log groups (the whole logs service: log groups are all the operator makes there,
        and moto names the type logs:loggroup where AWS says logs:log-group)."""
        return await tagged_resources(self.tagging, owner,
                                      ["sqs", "ecs:task", "ecs:task-definition", "logs"])

    async def delete_by_arn(self, arn: str, cluster: str) -> bool:
        """Delete one swept resource, whatever its kind; False when it was already gone.
        (Deregistered definitions and stopped tasks keep their tags for a while, and must not
        count as swept again at every pass.)"""
        service = arn.split(":")[2]
        if service == "sqs":
            account, name = arn.split(":")[4], arn.split(":")[5]
            try:
                resp = await self._call(self.sqs, "get_queue_url", QueueName=name,
                                        QueueOwnerAWSAccountId=account)
            except ClientError as exc:
                if exc.response["Error"].get("Code") in QUEUE_GONE:
                    return False
                raise
            await self._delete_queue(resp["QueueUrl"])
            return True
        if ":task-definition/" in arn:
            resp = await self._call(self.ecs, "describe_task_definition", taskDefinition=arn)
            if resp["taskDefinition"].get("status") != "ACTIVE":
                return False
            await self._call(self.ecs, "deregister_task_definition", taskDefinition=arn)
            metrics.RESOURCES_DELETED.labels(kind="task-definition").inc()
            return True
        if service == "logs":  # arn:aws:logs:<region>:<account>:log-group:<name>[:*]
            return await self.delete_log_group(arn.split(":log-group:", 1)[1].removesuffix(":*"))
        if ":task/" in arn:
            task_cluster = arn.split("/")[1] if arn.count("/") >= 2 else cluster
            resp = await self._call(self.ecs, "describe_tasks", cluster=task_cluster, tasks=[arn])
            live = [t for t in resp.get("tasks", []) if t.get("desiredStatus") != "STOPPED"]
            if not live:
                return False
            await self.stop_tasks(task_cluster, [arn])
            return True
        return False
