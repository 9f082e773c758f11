"""Deterministic names, labels and tags, from a run's (or a trigger's) namespace, name and UID.

Every name the operator creates is computed, never remembered: after a crash the operator
recomputes it and finds what it made before instead of making it twice.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

from mtrl_api import API_VERSION, GROUP
from mtrl_rollout.queues import (  # the data plane tags alike
    MANAGED_BY,
    TAG_CLUSTER_ID,
    TAG_COMPONENT,
    TAG_MANAGED_BY,
    TAG_NAME,
    TAG_NAMESPACE,
    TAG_OPERATOR_ID,
    resource_tags,
)
from mtrl_rollout.queues import (
    TAG_RUN_UID as TAG_RUN_UID,  # re-exported: the runs' sweeper groups by it
)

QUEUE_PREFIX = "mtrl-"  # the operator's IAM policy scopes SQS actions to this prefix

LABEL_RUN_UID = f"{GROUP}/run-uid"
LABEL_RUN_NAME = f"{GROUP}/run-name"
LABEL_COMPONENT = f"{GROUP}/component"
LABEL_ATTEMPT = f"{GROUP}/attempt"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"


FINALIZER = f"{GROUP}/cleanup"
ANNOTATION_FORCE_RELEASE = f"{GROUP}/force-release"

QUEUE_ROLES = ("rollout", "result", "generate", "dlq")


def _digest(*parts: str, length: int = 8) -> str:
    return hashlib.sha256("/".join(parts).encode()).hexdigest()[:length]


def _dns_label(text: str, max_len: int) -> str:
    """`text` trimmed to a DNS-1123 label of at most `max_len` characters."""
    cleaned = re.sub(r"[^a-z0-9-]", "-", text.lower()).strip("-")
    return cleaned[:max_len].rstrip("-") or "x"


@dataclass(frozen=True)
class RunNames:
    """Every name and tag derived from one run's identity."""

    namespace: str
    name: str
    uid: str
    operator_id: str = "default"
    cluster_id: str = ""  # the operator's cluster identity (Settings.cluster_id), tagged

    # -- Kubernetes objects (in the run's namespace)

    def _k8s(self, suffix: str, max_len: int = 63) -> str:
        """`<name>-<suffix>`; a name that is too long or not a DNS label is shortened and
        given a hash of the UID, so two such runs never collide. Starts with a letter, so it
        is also a valid Service name."""
        plain = f"{self.name}-{suffix}"
        if len(plain) <= max_len and re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", plain):
            return plain
        base = _dns_label(self.name, max_len - len(suffix) - 11)
        base = base if base[0].isalpha() else f"r{base}"[: max_len - len(suffix) - 11]
        return f"{base}-{_digest(self.uid)}-{suffix}"

    @property
    def config_map(self) -> str:
        return self._k8s("config")

    @property
    def progress_config_map(self) -> str:
        return self._k8s("progress")

    @property
    def progress_role(self) -> str:
        return self._k8s("progress-writer")

    @property
    def worker_deployment(self) -> str:
        return self._k8s("workers")

    def trainer_log(self, attempt: int) -> str:
        """The ConfigMap keeping a failed attempt's log after its pods are gone."""
        return self._k8s(f"t{attempt}-log")

    def trainer(self, attempt: int) -> str:
        """Trainer workload of one attempt; a retry is a new workload, never an edited one.
        Short enough that indexed Job pod names (`<job>-<index>-<5>`) stay within 63."""
        return self._k8s(f"t{attempt}", max_len=46)

    # -- AWS resources

    @property
    def aws_prefix(self) -> str:
        return f"{QUEUE_PREFIX}{_dns_label(self.namespace, 16)}-{_dns_label(self.name, 20)}-" \
               f"{_digest(self.uid)}"

    def queue(self, role: str) -> str:
        if role not in QUEUE_ROLES:
            raise ValueError(f"unknown queue role {role!r}")
        return f"{self.aws_prefix}-{role}"  # at most 5+16+1+20+1+8+1+8 = 60 < 80 characters

    @property
    def task_family(self) -> str:
        return f"{self.aws_prefix}-workers"

    @property
    def log_group(self) -> str:
        """The ECS workers' own CloudWatch Logs group."""
        return f"/mtrl/{self.aws_prefix}"

    @property
    def started_by(self) -> str:
        """ECS `startedBy` (at most 36 characters): the UID without dashes."""
        return "mtrl" + self.uid.replace("-", "")[:32]

    def client_token(self, placement: int, batch: int) -> str:
        """ECS RunTask idempotency token for one batch of worker tasks: `batch` counts the
        run's tasks before it, `placement` the shortfalls before it (a retry is a new call)."""
        return f"{self.uid}-p{placement}-b{batch}"[:64]

    def tags(self, component: str) -> dict[str, str]:
        return resource_tags(self.uid, self.namespace, self.name, component, self.operator_id,
                             self.cluster_id)

    def labels(self, component: str) -> dict[str, str]:
        """Labels on every Kubernetes object the operator creates. Deliberately without
        Argo CD's tracking label, so GitOps never prunes or adopts the run's children."""
        return {
            LABEL_RUN_UID: self.uid,
            LABEL_RUN_NAME: _dns_label(self.name, 63),
            LABEL_COMPONENT: component,
            LABEL_MANAGED_BY: MANAGED_BY,
        }


COMPONENT_TRAINER_LOG = "trainer-log"  # the component label of kept trainer logs
TRAINER_LOG_KEY = "log"  # the log's key in such a ConfigMap; "pod" and "container" name its source


# ----------------------------------------------------------------------------- triggers

LABEL_TRIGGER = f"{GROUP}/trigger"
LABEL_TRIGGER_UID = f"{GROUP}/trigger-uid"
ANNOTATION_SOURCE_BUCKET = f"{GROUP}/source-bucket"
ANNOTATION_SOURCE_KEY = f"{GROUP}/source-key"
ANNOTATION_SOURCE_ETAG = f"{GROUP}/source-etag"
ANNOTATION_SOURCE_VERSION_ID = f"{GROUP}/source-version-id"
# Trigger queues carry these instead of the run-uid tag, so the runs' sweeper never takes
# them for a gone run's; the triggers' sweeper finds them by this tag.
TAG_TRIGGER_UID = f"{GROUP}/trigger-uid"
TAG_SOURCE_BUCKET = f"{GROUP}/source-bucket"  # lets the sweeper remove the bucket's entry too
TRIGGER_QUEUE_PREFIX = f"{QUEUE_PREFIX}trigger-"
OBJECT_HASH_LENGTH = 10


def object_hash(key: str, etag: str) -> str:
    """Identity of one object version: the same key and content is the same upload, however
    often S3 (or SQS) tells us about it."""
    etag = etag.strip('"')  # S3 quotes it in HeadObject, not in event notifications
    return hashlib.sha256(f"{key}\0{etag}".encode()).hexdigest()[:OBJECT_HASH_LENGTH]


@dataclass(frozen=True)
class TriggerNames:
    """Every name and tag derived from one trigger's identity."""

    namespace: str
    name: str
    uid: str
    operator_id: str = "default"
    cluster_id: str = ""

    @property
    def aws_prefix(self) -> str:
        """Queue name, and the Id of the bucket's QueueConfiguration (at most 63 characters)."""
        return f"{TRIGGER_QUEUE_PREFIX}{_dns_label(self.namespace, 16)}-" \
               f"{_dns_label(self.name, 20)}-{_digest(self.uid)}"

    @property
    def queue(self) -> str:
        return self.aws_prefix

    @property
    def dead_letter_queue(self) -> str:
        return f"{self.aws_prefix}-dlq"

    @property
    def notification_id(self) -> str:
        return self.aws_prefix

    def run_name(self, digest: str) -> str:
        """`<trigger>-<object hash>`; a long trigger name is cut and given a hash of the whole
        name, so two triggers whose names share a long prefix never share run names."""
        room = 63 - len(digest) - 1
        base = self.name if len(self.name) <= room else \
            f"{_dns_label(self.name, room - 9)}-{_digest(self.name)}"
        return f"{base}-{digest}"

    def tags(self, component: str, bucket: str) -> dict[str, str]:
        tags = {
            TAG_TRIGGER_UID: self.uid,
            TAG_NAMESPACE: self.namespace,
            TAG_NAME: self.name,
            TAG_MANAGED_BY: MANAGED_BY,
            TAG_OPERATOR_ID: self.operator_id,
            TAG_COMPONENT: component,
            TAG_SOURCE_BUCKET: bucket,
        }
        if self.cluster_id:
            tags[TAG_CLUSTER_ID] = self.cluster_id
        return tags

    def run_labels(self) -> dict[str, str]:
        return {LABEL_TRIGGER: _dns_label(self.name, 63), LABEL_TRIGGER_UID: self.uid}


def owner_reference(run: dict[str, Any]) -> dict[str, Any]:
    """Children are owned by their run: Kubernetes' garbage collector is the last safety net."""
    return {"apiVersion": API_VERSION, "kind": "MultiTurnRLRun",
            "name": run["metadata"]["name"], "uid": run["metadata"]["uid"],
            "controller": True, "blockOwnerDeletion": True}
