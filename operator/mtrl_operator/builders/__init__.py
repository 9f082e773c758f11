"""Pure functions from a run's spec to Kubernetes manifests and AWS request bodies."""
