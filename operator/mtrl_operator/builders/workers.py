"""Reward workers: an ECS Fargate task definition and RunTask calls, or a Deployment."""

from __future__ import annotations

from typing import Any

from mtrl_api.run import MultiTurnRLRunSpec
from mtrl_operator.builders import security
from mtrl_operator.builders.env import HEALTH_PORT, as_k8s
from mtrl_operator.naming import LABEL_COMPONENT, LABEL_RUN_UID, RunNames

WORKER_COMMAND = ["mtrl", "worker"]
RUN_TASK_BATCH = 10  # ECS RunTask starts at most 10 tasks per call


LOG_STREAM_PREFIX = "worker"  # streams are worker/<container>/<task id> (the awslogs driver's)


def log_group(names: RunNames, spec: MultiTurnRLRunSpec) -> str:
    """The workers' CloudWatch Logs group: the spec's, or the run's own."""
    return spec.workers.ecs.log_group or names.log_group


def task_definition(names: RunNames, spec: MultiTurnRLRunSpec, env: dict[str, str],
                    execution_role_arn: str, region: str) -> dict[str, Any]:
    """RegisterTaskDefinition request for the run's workers. Their output goes to CloudWatch
    Logs through the awslogs driver, which on Fargate sends with the execution role
    (docs.aws.amazon.com/AmazonECS/latest/developerguide/using_awslogs.html)."""
    workers = spec.workers
    body: dict[str, Any] = {
        "family": names.task_family,
        "networkMode": "awsvpc",
        "requiresCompatibilities": ["FARGATE"],
        "cpu": str(workers.cpu),
        "memory": str(workers.memory),
        "containerDefinitions": [{
            "name": "worker",
            "image": workers.image,
            "command": WORKER_COMMAND,
            "essential": True,
            "cpu": workers.cpu,
            "memory": workers.memory,
            "environment": [{"name": k, "value": v} for k, v in env.items()],
            "healthCheck": {
                "command": ["CMD", "python", "-c", "import urllib.request as u; "
                            f"u.urlopen('http://127.0.0.1:{HEALTH_PORT}/healthz', timeout=3)"],
                "interval": 30, "timeout": 5, "retries": 3, "startPeriod": 30},
            "stopTimeout": 30,  # SIGTERM drains in-flight episodes before SIGKILL
            "logConfiguration": {"logDriver": "awslogs", "options": {
                "awslogs-group": log_group(names, spec), "awslogs-region": region,
                "awslogs-stream-prefix": LOG_STREAM_PREFIX}},
        }],
        "tags": [{"key": k, "value": v} for k, v in names.tags("task-definition").items()],
    }
    role = workers.ecs.execution_role_arn or execution_role_arn
    if role:
        body["executionRoleArn"] = role
    if workers.ecs.task_role_arn:
        body["taskRoleArn"] = workers.ecs.task_role_arn
    return body


def run_task_requests(names: RunNames, spec: MultiTurnRLRunSpec, task_definition_arn: str,
                      cluster: str, subnets: list[str], security_groups: list[str],
                      placement: int, missing: int, first_batch: int) -> list[dict[str, Any]]:
    """RunTask requests starting `missing` tasks, in batches of 10, each with its own client
    token so a repeated call after a crash is recognisable. `placement` (shortfalls so far,
    from the status) changes the tokens of a retry after a shortfall: ECS answers a token it
    has seen with its first answer, and a retry must be a new request. (A run without subnets
    or security groups never gets here: `reconcile.readings.spec_problem` fails it first.)"""
    requests = []
    for i in range(0, missing, RUN_TASK_BATCH):
        batch = first_batch + i // RUN_TASK_BATCH
        requests.append({
            "cluster": cluster,
            "taskDefinition": task_definition_arn,
            "count": min(RUN_TASK_BATCH, missing - i),
            "launchType": "FARGATE",
            "platformVersion": spec.workers.ecs.platform_version,
            "networkConfiguration": {"awsvpcConfiguration": {
                "subnets": subnets, "securityGroups": security_groups,
                "assignPublicIp": "ENABLED" if spec.workers.ecs.assign_public_ip else "DISABLED"}},
            "startedBy": names.started_by,
            "clientToken": names.client_token(placement, batch),
            "tags": [{"key": k, "value": v} for k, v in names.tags("worker-task").items()],
            "propagateTags": "TASK_DEFINITION",
            "enableECSManagedTags": True,
        })
    return requests


def deployment(names: RunNames, spec: MultiTurnRLRunSpec, env: dict[str, str],
               owner: dict[str, Any]) -> dict[str, Any]:
    """Workers as a Deployment (backend kubernetes), e.g. on an EKS Fargate profile."""
    workers = spec.workers
    labels = names.labels("worker")
    millicores = max(1, workers.cpu * 1000 // 1024)
    pod_spec: dict[str, Any] = {
        "containers": [{
            "name": "worker",
            "image": workers.image,
            "command": WORKER_COMMAND,
            "env": [*as_k8s(env),
                    {"name": "MTRL_WORKER_ID", "valueFrom": {"fieldRef": {
                        "fieldPath": "metadata.name"}}},
                    {"name": "MTRL_HEALTH_HOST", "valueFrom": {"fieldRef": {
                        "fieldPath": "status.podIP"}}}],
            "ports": [{"name": "health", "containerPort": HEALTH_PORT}],
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": HEALTH_PORT},
                               "periodSeconds": 5},
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": HEALTH_PORT},
                              "periodSeconds": 20, "failureThreshold": 3},
            "resources": {"requests": {"cpu": f"{millicores}m", "memory": f"{workers.memory}Mi"},
                          "limits": {"memory": f"{workers.memory}Mi"}},
            # A worker that stops on an error says why in its last log lines: the kubelet
            # keeps their tail as the termination message, which the run's status quotes.
            "terminationMessagePolicy": "FallbackToLogsOnError",
            "securityContext": security.container_security_context(),
        }],
        "securityContext": security.pod_security_context(),
        "terminationGracePeriodSeconds": 45,
        "nodeSelector": dict(workers.kubernetes.node_selector),
    }
    if workers.kubernetes.service_account_name:
        pod_spec["serviceAccountName"] = workers.kubernetes.service_account_name
    return {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": names.worker_deployment, "namespace": names.namespace,
                     "labels": labels, "ownerReferences": [owner]},
        "spec": {
            "replicas": workers.max_replicas,
            "selector": {"matchLabels": {k: labels[k] for k in
                                         (LABEL_RUN_UID, LABEL_COMPONENT)}},
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }
