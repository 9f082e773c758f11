"""Prometheus metrics (served on MTRL_METRICS_PORT at /metrics)."""

from __future__ import annotations

import contextlib
from typing import Any

from prometheus_client import Counter, Gauge, Histogram, start_http_server

RUNS_BY_PHASE = Gauge("mtrl_runs", "Runs by phase", ["phase"])
RECONCILE_SECONDS = Histogram("mtrl_reconcile_seconds", "Time to reconcile one run once",
                              buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
RECONCILE_ERRORS = Counter("mtrl_reconcile_errors_total", "Reconciles that raised", ["kind"])
# Every HTTP request botocore sends, retries included: what AWS bills and throttles.
CLOUD_REQUESTS = Counter("mtrl_cloud_api_requests_total", "AWS API requests sent",
                         ["service", "operation"])
CLOUD_ERRORS = Counter("mtrl_cloud_api_errors_total", "AWS API errors by operation",
                       ["operation", "code"])
RESOURCES_CREATED = Counter("mtrl_resources_created_total", "Resources created", ["kind"])
RESOURCES_DELETED = Counter("mtrl_resources_deleted_total", "Resources deleted", ["kind"])
SWEPT = Counter("mtrl_swept_resources_total", "Orphaned cloud resources deleted by the sweeper")
# controller-runtime exports the same as leader_election_master_status.
LEADER = Gauge("mtrl_leader", "1 while this replica holds the leader-election Lease")
TRIGGER_OBJECTS = Counter("mtrl_trigger_objects_total", "Object notifications by outcome",
                          ["outcome"])
TRIGGER_MALFORMED = Counter("mtrl_trigger_malformed_notifications_total",
                            "Messages that were no S3 notification, moved to the dead-letter "
                            "queue")

# Each run's latest training figures, from its status (what `kubectl get` shows), labelled by
# the run; a run's series go when the run does. Keys are status.progress fields.
RUN_FIGURES = {
    "step": Gauge("mtrl_run_step", "Training steps done", ["namespace", "run"]),
    "rewardMean": Gauge("mtrl_run_reward_mean", "Mean aggregate reward of the latest step",
                        ["namespace", "run"]),
    "successRate": Gauge("mtrl_run_success_rate", "Episodes of the latest step that succeeded",
                         ["namespace", "run"]),
    "zeroVarianceFraction": Gauge("mtrl_run_zero_variance_fraction",
                                  "Groups of the latest step whose rewards were all equal",
                                  ["namespace", "run"]),
    "validationSuccessRate": Gauge("mtrl_run_validation_success_rate",
                                   "Validation success rate at the latest evaluation",
                                   ["namespace", "run"]),
    "validationGreedySuccessRate": Gauge("mtrl_run_validation_greedy_success_rate",
                                         "Greedy validation success rate at the latest "
                                         "evaluation (dataset.evalGreedy)",
                                         ["namespace", "run"]),
}


def set_run_figures(namespace: str, run: str, progress: dict[str, Any]) -> None:
    """Export what a run's status.progress says; a figure it does not have yet is left out."""
    for key, gauge in RUN_FIGURES.items():
        value = progress.get(key)
        if value is not None:
            gauge.labels(namespace=namespace, run=run).set(value)


def forget_run(namespace: str, run: str) -> None:
    for gauge in RUN_FIGURES.values():
        with contextlib.suppress(KeyError):
            gauge.remove(namespace, run)


def serve(port: int) -> None:
    """/metrics on `port`, from a thread of prometheus_client's own."""
    start_http_server(port)
