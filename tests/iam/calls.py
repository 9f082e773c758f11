"""Recorded HTTP calls -> the IAM permissions AWS would check for them.

One API call can need several permissions: CreateQueue with tags also needs sqs:TagQueue,
RunTask with tags needs ecs:TagResource, and a task definition with roles needs iam:PassRole
for each (on RegisterTaskDefinition and again on RunTask). Those implied checks are derived here
from the request and response bodies, so the policy is tested against them too.

A request this module cannot map becomes the action `unmapped:<...>`, which no policy allows:
a new kind of call fails the coverage test until it is mapped, instead of passing unseen.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from mtrl_testbed.aws_proxy import Exchange

UNSCOPED = "*"  # the Resource of an action without resource-level permissions
ECS_TASKS_SERVICE = "ecs-tasks.amazonaws.com"

# X-Amz-Target prefixes of the JSON protocols -> IAM service prefix.
_TARGETS = {
    "AmazonSQS": "sqs",
    "AmazonEC2ContainerServiceV20141113": "ecs",
    "ResourceGroupsTaggingAPI_20170126": "tag",
    "Logs_20140328": "logs",
}
# API operations whose IAM action has another name (batch calls check the single action).
_ACTION_OF = {
    "SendMessageBatch": "SendMessage",
    "DeleteMessageBatch": "DeleteMessage",
    "ChangeMessageVisibilityBatch": "ChangeMessageVisibility",
}
_UNSCOPED_ACTIONS = {
    "sqs:ListQueues", "ecs:ListTaskDefinitions", "ecs:DescribeTaskDefinition",
    "ecs:RegisterTaskDefinition", "ecs:DeregisterTaskDefinition", "ecs:ListTasks",
    "tag:GetResources",
}
_CLUSTER_ACTIONS = {"ecs:RunTask", "ecs:StopTask", "ecs:DescribeTasks", "ecs:ListTasks"}


@dataclass(frozen=True)
class Permission:
    """One authorization check: action on resource, with the request's condition keys."""

    action: str
    resource: str
    context: tuple[tuple[str, str], ...] = ()
    call: str = field(default="", compare=False)  # the API call it came from, for messages

    def __str__(self) -> str:
        keys = ", ".join(f"{k}={v}" for k, v in self.context)
        implied = self.call and self.call != self.action.split(":", 1)[-1]
        via = f" (implied by {self.call})" if implied else ""
        return f"{self.action} on {self.resource}{f' [{keys}]' if keys else ''}{via}"


@dataclass
class Mapper:
    """Stateful, because RunTask passes the roles of a task definition registered earlier."""

    account: str
    region: str
    _roles: dict[str, list[str]] = field(default_factory=dict)  # task definition ARN -> roles

    def permissions(self, exchanges: list[Exchange]) -> list[Permission]:
        out: list[Permission] = []
        for exchange in exchanges:
            out += self.of(exchange)
        return out

    def of(self, exchange: Exchange) -> list[Permission]:
        target = exchange.headers.get("x-amz-target", "")
        if "." in target:
            prefix, operation = target.split(".", 1)
            service = _TARGETS.get(prefix)
            body = json.loads(exchange.body or b"{}")
        else:  # query protocol (form-encoded Action=...), or S3's REST
            form = {k: v[0] for k, v in parse_qs(exchange.body.decode(errors="replace")).items()}
            operation, service, body = form.get("Action", ""), None, dict(form)
            if operation and "sqs" in exchange.headers.get("authorization", ""):
                service = "sqs"
        if service == "sqs":
            return self._sqs(operation, body)
        if service == "ecs":
            return self._ecs(operation, body, json.loads(exchange.response or b"{}"))
        if service == "logs":
            return self._logs(operation, body)
        if service == "tag":
            return [Permission(f"tag:{operation}", UNSCOPED, call=operation)]
        if "/s3/" in exchange.headers.get("authorization", ""):
            return self._s3(exchange)
        return [Permission(f"unmapped:{exchange.method} {exchange.path} {target}", UNSCOPED)]

    # ------------------------------------------------------------------ SQS

    def queue_arn(self, name: str, account: str | None = None) -> str:
        return f"arn:aws:sqs:{self.region}:{account or self.account}:{name}"

    def _queue_of_url(self, url: str) -> str:
        account, name = urlsplit(url).path.strip("/").split("/")[-2:]
        return self.queue_arn(name, account)

    def _sqs(self, operation: str, body: dict[str, Any]) -> list[Permission]:
        action = f"sqs:{_ACTION_OF.get(operation, operation)}"
        if action in _UNSCOPED_ACTIONS:
            return [Permission(action, UNSCOPED, call=operation)]
        if "QueueUrl" in body:
            resource = self._queue_of_url(str(body["QueueUrl"]))
        else:  # CreateQueue, GetQueueUrl name the queue
            resource = self.queue_arn(str(body["QueueName"]),
                                      str(body.get("QueueOwnerAWSAccountId") or self.account))
        out = [Permission(action, resource, call=operation)]
        if operation == "CreateQueue" and body.get("tags"):
            out.append(Permission("sqs:TagQueue", resource, call=operation))
        return out

    # ------------------------------------------------------------------ ECS

    def cluster_arn(self, cluster: str | None) -> str:
        cluster = cluster or "default"
        if cluster.startswith("arn:"):
            return cluster
        return f"arn:aws:ecs:{self.region}:{self.account}:cluster/{cluster}"

    def _task_arn(self, task: str, cluster_arn: str) -> str:
        """The long ARN form AWS uses (task/<cluster>/<id>) for an ID or a short ARN."""
        if task.startswith("arn:") and task.count("/") >= 2:
            return task
        cluster = cluster_arn.rsplit("/", 1)[-1]
        return f"arn:aws:ecs:{self.region}:{self.account}:task/{cluster}/{task.rsplit('/', 1)[-1]}"

    def _task_definition_arn(self, ref: str) -> str:
        if ref.startswith("arn:"):
            return ref
        return f"arn:aws:ecs:{self.region}:{self.account}:task-definition/{ref}"

    def _ecs(self, operation: str, body: dict[str, Any],
             response: dict[str, Any]) -> list[Permission]:
        action = f"ecs:{operation}"
        cluster = self.cluster_arn(str(body.get("cluster") or ""))
        context: dict[str, str] = {"ecs:cluster": cluster} if action in _CLUSTER_ACTIONS else {}
        tags = {t["key"]: t["value"] for t in body.get("tags") or []}
        context |= {f"aws:RequestTag/{k}": v for k, v in tags.items()}
        ctx = tuple(sorted(context.items()))
        if operation in ("StopTask", "DescribeTasks"):
            tasks = body["tasks"] if operation == "DescribeTasks" else [body["task"]]
            return [Permission(action, self._task_arn(str(t), cluster), ctx, operation)
                    for t in tasks]
        if operation == "DescribeClusters":
            return [Permission(action, self.cluster_arn(str(c)), ctx, operation)
                    for c in body["clusters"]]
        if operation == "RegisterTaskDefinition":
            return self._register(body, response, ctx, bool(tags))
        if operation == "RunTask":
            return self._run_task(body, response, ctx, bool(tags))
        return [Permission(action, UNSCOPED, ctx, operation)]

    def _register(self, body: dict[str, Any], response: dict[str, Any],
                  ctx: tuple[tuple[str, str], ...], tagged: bool) -> list[Permission]:
        arn = str(response.get("taskDefinition", {}).get("taskDefinitionArn", ""))
        roles = [str(body[k]) for k in ("taskRoleArn", "executionRoleArn") if body.get(k)]
        self._roles[arn] = roles
        out = [Permission("ecs:RegisterTaskDefinition", UNSCOPED, ctx, "RegisterTaskDefinition")]
        out += _pass_roles(roles, "RegisterTaskDefinition")
        if tagged:
            out.append(_tag_on_create(arn, "RegisterTaskDefinition"))
        return out

    def _run_task(self, body: dict[str, Any], response: dict[str, Any],
                  ctx: tuple[tuple[str, str], ...], tagged: bool) -> list[Permission]:
        definition = self._task_definition_arn(str(body["taskDefinition"]))
        out = [Permission("ecs:RunTask", definition, ctx, "RunTask")]
        out += _pass_roles(self._roles.get(definition, []), "RunTask")
        if tagged:
            out += [_tag_on_create(str(t["taskArn"]), "RunTask")
                    for t in response.get("tasks", [])]
        return out

    # ------------------------------------------------------------------ CloudWatch Logs

    def _logs(self, operation: str, body: dict[str, Any]) -> list[Permission]:
        """A group's actions on the group's ARN (arn:...:log-group:<name>:*); describing is
        on every group in the account (`*`: its prefix is no resource)."""
        action = f"logs:{operation}"
        if operation == "DescribeLogGroups":
            return [Permission(action, UNSCOPED, call=operation)]
        arn = f"arn:aws:logs:{self.region}:{self.account}:log-group:{body['logGroupName']}:*"
        out = [Permission(action, arn, call=operation)]
        if operation == "CreateLogGroup" and body.get("tags"):
            # CloudWatch checks logs:TagResource too when a group is created with tags.
            out.append(Permission("logs:TagResource", arn, call=operation))
        return out

    # ------------------------------------------------------------------ S3 (REST)

    def _s3(self, exchange: Exchange) -> list[Permission]:
        """Path-style requests only (what botocore sends to an IP endpoint)."""
        bucket, _, key = unquote(exchange.path).lstrip("/").partition("/")
        query = parse_qs(exchange.query, keep_blank_values=True)
        if not key and "notification" in query:  # a trigger's bucket notification configuration
            action = {"GET": "s3:GetBucketNotification",
                      "PUT": "s3:PutBucketNotification"}.get(exchange.method)
            return [Permission(action or f"unmapped:s3 {exchange.method} ?notification",
                               f"arn:aws:s3:::{bucket}")]
        if not key and "delete" in query and exchange.method == "POST":
            # DeleteObjects: S3 checks s3:DeleteObject on every key the body names.
            keys = re.findall(r"<Key>(.*?)</Key>", exchange.body.decode())
            return [Permission("s3:DeleteObject", f"arn:aws:s3:::{bucket}/{k}") for k in keys]
        if not key:
            action = {"GET": "s3:ListBucket", "HEAD": "s3:ListBucket"}.get(exchange.method, "")
            context = tuple(sorted({"s3:prefix": query.get("prefix", [""])[0]}.items()))
            return [Permission(action or f"unmapped:s3 {exchange.method} bucket",
                               f"arn:aws:s3:::{bucket}", context)]
        action = {"GET": "s3:GetObject", "HEAD": "s3:GetObject", "PUT": "s3:PutObject",
                  "POST": "s3:PutObject", "DELETE": "s3:DeleteObject"}[exchange.method]
        if exchange.method == "DELETE" and "uploadId" in query:
            action = "s3:AbortMultipartUpload"
        return [Permission(action, f"arn:aws:s3:::{bucket}/{key}")]


def _pass_roles(roles: list[str], call: str) -> list[Permission]:
    return [Permission("iam:PassRole", role, (("iam:PassedToService", ECS_TASKS_SERVICE),), call)
            for role in roles]


def _tag_on_create(arn: str, call: str) -> Permission:
    return Permission("ecs:TagResource", arn, (("ecs:CreateAction", call),), call)
