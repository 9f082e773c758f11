"""The MultiTurnRLRun API: pydantic models that are the source of truth for the CRDs."""

GROUP = "mtrl.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# The key of the run's progress ConfigMap that the trainer writes and the operator reads.
PROGRESS_KEY = "progress.json"

# The trainer's one-line cause of failure goes to its container's termination message, which
# the kubelet reports in the pod's status and the operator copies into the run's message.
TERMINATION_MESSAGE_PATH = "/dev/termination-log"
# A configuration error (retrying cannot help): the trainer exits with this code and begins its
# termination message with this prefix (torchrun exits 1 whatever its child's code).
CONFIG_ERROR_EXIT_CODE = 2
CONFIG_ERROR_PREFIX = "configuration error:"
# A trainer whose episodes keep failing (the environment raises, or times out, on more than
# spec.rollout.maxFailedEpisodeFraction of a step's episodes, step after step) stops with this
# prefix: the environment's error is in the message, and another attempt would play the same
# tasks against the same environment, so it is not retried.
EPISODES_FAILED_PREFIX = "episodes failed:"
# A trainer whose step's gradient norm is not finite (NaN or inf) stops before applying that
# update, with this prefix: its weights, and its last checkpoint, are the last good policy, and
# another attempt would replay the same data into the same numbers, so it is not retried.
DIVERGED_PREFIX = "training diverged:"
# A trainer that played every step and made no optimizer update (every group's rewards were
# equal, or every group lost an episode) stops with this prefix instead of reporting success:
# the run trained nothing, and another attempt would play the same tasks to the same end.
NOTHING_TRAINED_PREFIX = "nothing trained:"
# A trainer stopped by SIGTERM (suspend, delete, a node drain, an eviction, a preemption)
# saves a checkpoint at the step it was on and exits with 128 + SIGTERM, as a shell does.
TERMINATED_EXIT_CODE = 143

# HTTP clients' loggers: one line per request at INFO, which the operator, the trainer and the
# workers all keep out of their logs unless asked for DEBUG.
CLIENT_LOGGERS = ("httpx", "httpx2", "httpcore", "botocore", "urllib3", "aiohttp.access")
