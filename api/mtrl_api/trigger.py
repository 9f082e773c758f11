"""`MultiTurnRLTrigger` (mtrl.dev/v1alpha1): start a run whenever training data lands in S3.

The Kubernetes form of the AWS reference pipeline (S3 -> EventBridge -> Lambda -> Step
Functions): S3 sends its event notifications to an SQS queue, the operator consumes them and
creates one `MultiTurnRLRun` per new object version from `spec.runTemplate`, with
`dataset.s3.trainUri` set to the uploaded object. Each field's docstring is its CRD
description (`kubectl explain mtrltrigger.spec`).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any

from pydantic import ConfigDict, Field

from mtrl_api.base import ApiModel, list_map, rule, rules
from mtrl_api.run import (
    _KEYS_QUALIFIED,
    SPEC_RULES,
    Condition,
    LabelMap,
    MultiTurnRLRunSpec,
    S3ObjectUri,
)

BucketName = Annotated[str, Field(min_length=3, max_length=63,
                                  pattern=r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]$")]
KeyPart = Annotated[str, Field(max_length=1024)]
QueueUrl = Annotated[str, Field(max_length=2048, pattern=r"^https?://[^\s]+/[0-9]{12}/[A-Za-z0-9_-]{1,80}$")]
HISTORY_MAX = 100
RECENT_OBJECTS_MAX = 20
PROCESSED_OBJECTS_MAX = 500
ACTIVE_MAX = 100


class ConcurrencyPolicy(StrEnum):
    ALLOW = "Allow"
    FORBID = "Forbid"
    REPLACE = "Replace"


class ObjectOutcome(StrEnum):
    CREATED = "Created"
    DUPLICATE = "Duplicate"
    SKIPPED = "Skipped"
    FILTERED = "Filtered"


# ----------------------------------------------------------------------------- source and queue


class S3Source(ApiModel):
    bucket: BucketName
    """Bucket to watch. Immutable: a trigger for another bucket is another trigger."""
    prefix: KeyPart = ""
    """Only keys that start with this prefix start runs, e.g. training-data/. Default: empty
    (the whole bucket)."""
    suffix: KeyPart = ".jsonl"
    """Only keys that end with this suffix start runs. Default .jsonl (JSON Lines, one task
    per line, what the trainer reads)."""


class SourceSpec(ApiModel):
    s3: S3Source
    """S3 objects whose creation starts a run."""


class QueueSpec(ApiModel):
    model_config = ApiModel.model_config | {"json_schema_extra": rules(
        rule("(has(self.create) && self.create) != has(self.url)",
             "set exactly one of create: true (the operator makes the queue) or url (yours)"),
    )}

    create: bool | None = None
    """true: the operator creates an SQS queue and a dead-letter queue for this trigger,
    tagged with its UID, allows S3 to send to it, and adds a QueueConfiguration for the
    prefix and suffix to the bucket's notification configuration (next to any others, never
    replacing them). Everything is removed when the trigger is deleted. Default, when queue is
    not set at all."""
    url: QueueUrl | None = None
    """URL of an SQS queue you created and configured to receive the bucket's notifications
    (directly from S3, through SNS, or from EventBridge). The operator only reads it; malformed
    messages go to the dead-letter queue of its redrive policy, if it has one."""


# ----------------------------------------------------------------------------- run template


class TemplateS3Dataset(ApiModel):
    validation_uri: S3ObjectUri | None = None
    """s3:// URI of held-out tasks, the same for every run. trainUri is the uploaded object."""


class TemplateDataset(ApiModel):
    s3: TemplateS3Dataset = Field(default_factory=TemplateS3Dataset)
    """The operator sets s3.trainUri to s3://<bucket>/<key> of the uploaded object."""
    eval_interval_steps: int = Field(10, ge=0, le=1_000_000)
    """Evaluate the validation split every N steps; 0 turns evaluation off. Default 10."""


class RunTemplateSpec(MultiTurnRLRunSpec):
    model_config = MultiTurnRLRunSpec.model_config | {"json_schema_extra": rules(*SPEC_RULES)}

    dataset: TemplateDataset = Field(default_factory=TemplateDataset)  # type: ignore[assignment]
    """Validation tasks and evaluation interval. The training tasks are the uploaded object:
    each run gets dataset.s3.trainUri = s3://<bucket>/<key>."""


class TemplateMetadata(ApiModel):
    labels: LabelMap = Field(default_factory=dict)
    """Labels copied onto every run. The operator adds mtrl.dev/trigger and
    mtrl.dev/trigger-uid."""
    annotations: Annotated[dict[str, Annotated[str, Field(max_length=4096)]], Field(
        max_length=64, json_schema_extra=_KEYS_QUALIFIED)] = Field(default_factory=dict)
    """Annotations copied onto every run. The operator adds mtrl.dev/source-bucket,
    mtrl.dev/source-key, mtrl.dev/source-etag and, for versioned buckets,
    mtrl.dev/source-version-id."""


class RunTemplate(ApiModel):
    metadata: TemplateMetadata = Field(default_factory=TemplateMetadata)
    """Labels and annotations of the runs. Names are chosen by the operator:
    <trigger>-<first 10 hex of sha256(key + NUL + ETag)>, so one object version makes one run."""
    spec: RunTemplateSpec
    """A MultiTurnRLRun spec, validated like a run's, with two differences: dataset.s3.trainUri
    is the uploaded object, and output.s3Uri is a prefix under which each run writes to
    <s3Uri>/<run name> (a run resumes from the checkpoints it finds, so runs never share one).
    Edits apply to runs created afterwards."""


# ----------------------------------------------------------------------------- spec


class MultiTurnRLTriggerSpec(ApiModel):
    source: SourceSpec
    """What to watch."""
    queue: QueueSpec = Field(default_factory=lambda: QueueSpec(create=True))
    """Where S3's event notifications arrive. Immutable. Default: {create: true}."""
    run_template: RunTemplate
    """The run created for each new object."""
    concurrency_policy: ConcurrencyPolicy = ConcurrencyPolicy.ALLOW
    """What to do with a new object while a run of this trigger is still active (not Succeeded
    or Failed), as CronJob does: Allow starts another run; Forbid skips the object (recorded in
    status.recentObjects with the reason, and a RunSkipped Event) and does not retry it later;
    Replace deletes the active runs and starts the new one. Default Allow."""
    successful_runs_history_limit: int = Field(3, ge=0, le=HISTORY_MAX)
    """Succeeded runs to keep; older ones are deleted (their outputs in S3 stay). Default 3."""
    failed_runs_history_limit: int = Field(1, ge=0, le=HISTORY_MAX)
    """Failed runs to keep; older ones are deleted (their outputs in S3 stay). Default 1."""
    suspend: bool = False
    """Stop consuming notifications. They stay in the queue (for up to 14 days when the
    operator made it) and are processed, in order of arrival, when suspend is set back to
    false. Runs already created are not touched. Default false."""


# ----------------------------------------------------------------------------- status


class ObjectRecord(ApiModel):
    key: KeyPart
    """Object key, decoded."""
    etag: Annotated[str, Field(max_length=128)] = ""
    """The object's ETag, without quotes."""
    version_id: Annotated[str, Field(max_length=1024)] | None = None
    """Object version, for versioned buckets."""
    run: Annotated[str, Field(max_length=253)] | None = None
    """The run this object maps to (created, already there, or skipped)."""
    time: datetime
    """When the notification was processed."""
    outcome: ObjectOutcome
    """Created (a run was created), Duplicate (its run exists or existed: a redelivered or
    repeated notification), Skipped (concurrencyPolicy Forbid, or the run was refused) or
    Filtered (outside prefix or suffix, another bucket, or not an object creation)."""
    reason: Annotated[str, Field(max_length=1024)] = ""
    """Why, for every outcome but Created."""


class MultiTurnRLTriggerStatus(ApiModel):
    observed_generation: int | None = Field(None, ge=0)
    """The .metadata.generation the operator last acted on."""
    conditions: Annotated[list[Condition], Field(
        max_length=8, json_schema_extra=list_map("type"))] = Field(default_factory=list)
    """Ready: True while notifications are consumed; False with reason Provisioning,
    Suspended or AwsError."""
    queue_url: Annotated[str, Field(max_length=2048)] | None = None
    """The queue consumed."""
    queue_arn: Annotated[str, Field(max_length=2048)] | None = None
    """Its ARN (the bucket's notification destination)."""
    dead_letter_queue_url: Annotated[str, Field(max_length=2048)] | None = None
    """Where malformed notifications go."""
    last_trigger_time: datetime | None = None
    """When the latest run was created."""
    active: Annotated[list[Annotated[str, Field(max_length=253)]], Field(
        max_length=ACTIVE_MAX)] = Field(default_factory=list)
    """Runs of this trigger that are neither Succeeded nor Failed."""
    active_count: int = Field(0, ge=0)
    """len(active), for kubectl get."""
    runs_created: int = Field(0, ge=0)
    """Runs created since the trigger was made."""
    recent_objects: Annotated[list[ObjectRecord], Field(max_length=RECENT_OBJECTS_MAX)] = Field(
        default_factory=list)
    """The latest objects notified and what became of them, oldest first."""
    processed_objects: Annotated[list[Annotated[str, Field(max_length=16)]], Field(
        max_length=PROCESSED_OBJECTS_MAX)] = Field(default_factory=list)
    """Hashes of the latest object versions that made (or were refused) a run, oldest first.
    A notification for one of them creates nothing, even after the run itself was deleted by
    the history limits."""


def _immutability_rules() -> dict[str, Any]:
    return rules(
        rule("self.spec.source.s3.bucket == oldSelf.spec.source.s3.bucket",
             "spec.source.s3.bucket is immutable; create another trigger instead",
             field_path=".spec.source.s3.bucket", reason="FieldValueForbidden", transition=True),
        rule("self.spec.queue == oldSelf.spec.queue",
             "spec.queue is immutable; create another trigger instead",
             field_path=".spec.queue", reason="FieldValueForbidden", transition=True),
    )


class MultiTurnRLTrigger(ApiModel):
    """Starts a MultiTurnRLRun for each new training-data object in S3, from S3's event
    notifications through SQS; deduplicated by object key and ETag."""

    model_config = ConfigDict(**ApiModel.model_config,
                              json_schema_extra=_immutability_rules())

    spec: MultiTurnRLTriggerSpec
    """What to watch and which run to start."""
    status: MultiTurnRLTriggerStatus = Field(default_factory=MultiTurnRLTriggerStatus)
    """Observed state, written by the operator."""
