"""The MultiTurnRLRun API: pydantic models that are the source of truth for the CRDs."""

GROUP = "mtrl.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# The key of the run's progress ConfigMap that the trainer writes and the operator reads.
PROGRESS_KEY = "progress.json"
