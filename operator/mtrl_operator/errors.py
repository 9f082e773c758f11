"""Errors that end a run instead of being retried, and one that only means 'look again'."""

from __future__ import annotations

# AWS error codes that mean the run's spec names something missing or invalid (an ECS cluster,
# a subnet, a security group, an image): retrying cannot help, so the run fails with the code.
SPEC_ERROR_CODES = frozenset({
    "ClusterNotFoundException", "InvalidParameterException", "ClientException",
    "InvalidSubnetID.NotFound", "InvalidGroup.NotFound", "InvalidSecurityGroupID.NotFound",
    "InvalidParameterValue",
})


class SpecError(Exception):
    """A spec the schema accepted but that cannot be run; the run fails with `reason`."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class StaleCopy(Exception):
    """A write conditioned on our cached copy found the object changed since; the watch brings
    the new version, and the reconcile runs again."""


class NotServed(Exception):
    """The API server serves no such kind (its CRD is not installed, or not yet)."""


class NotPermitted(Exception):
    """The operator's role does not allow the read (HTTP 403)."""


class CloudError(Exception):
    """An AWS call failed in a way worth showing on the object: `reason` for its condition,
    the message naming the call and AWS's own code and words."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class FatalConfig(Exception):
    """The operator cannot work as configured (no usable kubeconfig, a ServiceAccount that
    may not hold its Lease): it exits non-zero with this one line, as controller-runtime's
    GetConfigOrDie does, so that a liveness probe or a person sees it, never a healthy pod
    that will not act."""
