"""Two operator installs sharing one AWS account: two control planes, one moto, the chart's
default operator id in both, runs of the same namespace and name side by side. For several
sweep intervals each sweeper deletes its own orphan and nothing of the other's: the cluster
identity in the tags (each control plane's kube-system UID, read at start) keeps them apart.
Before it, each install's sweeper deleted the other's queues, tasks, task definitions and log
groups at every pass (their runs are not in its API server)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import boto3
import pytest

from mtrl_operator.naming import RunNames
from mtrl_testbed import census, chart_identity
from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.moto import EXECUTION_ROLE_ARN, MotoServer
from mtrl_testbed.operator import OperatorProcess
from tests.conftest import ARTIFACTS, started_cluster
from tests.operator.runs import HANG, apply, names_of, run_manifest, wait_for, wait_phase

pytestmark = [pytest.mark.cluster, pytest.mark.aws]

SWEEP_INTERVAL_S = 1.0
SWEEP_MIN_AGE_S = 2.0
WATCHED_FOR_S = 8.0  # several sweep intervals, each longer than the minimum age


@pytest.fixture(scope="module")
def second_cluster(tmp_path_factory: pytest.TempPathFactory,
                   moto_server: MotoServer) -> Iterator[LocalCluster]:
    """Another control plane (a prod cluster beside the dev one), its pods reaching moto."""
    with started_cluster(tmp_path_factory.mktemp("second-cluster"),
                         "second-cluster-logs") as local:
        (local.root / "pod-env.json").write_text(json.dumps(moto_server.env()))
        yield local


@dataclass
class Install:
    cluster: LocalCluster
    operator: OperatorProcess
    namespace: str

    @property
    def identity(self) -> str:
        return self.cluster.identity()


def _install(cluster: LocalCluster, moto_server: MotoServer, aws_env: dict[str, str],
             namespace: str, log: str) -> Install:
    """The operator as the chart's ServiceAccount (so its RBAC must let it read kube-system),
    with the chart's default operator id and no cluster id: it reads its own."""
    identity = chart_identity.install(cluster)
    subnet, group = moto_server.prepare_fargate()
    operator = OperatorProcess(cluster, {
        **aws_env, **identity.env, "MTRL_ECS_SUBNETS": subnet, "MTRL_ECS_SECURITY_GROUPS": group,
        "MTRL_ECS_EXECUTION_ROLE_ARN": EXECUTION_ROLE_ARN, "MTRL_OPERATOR_ID": "default",
        "MTRL_NAMESPACES": namespace, "MTRL_SWEEP_INTERVAL_SECONDS": str(SWEEP_INTERVAL_S),
        "MTRL_SWEEP_MIN_AGE_SECONDS": str(SWEEP_MIN_AGE_S)},
        ARTIFACTS / log, identity.kubeconfig).start()
    return Install(cluster, operator, namespace)


def _orphan(install: Install) -> str:
    """A queue this install's operator made, in its namespace, for a run that is gone."""
    ghost = RunNames(install.namespace, "ghost", str(uuid.uuid4()), "default", install.identity)
    return boto3.client("sqs").create_queue(QueueName=ghost.queue("dlq"),
                                            tags=ghost.tags("queue-dlq"))["QueueUrl"]


def _queue_exists(url: str) -> bool:
    name = url.rsplit("/", 1)[-1]
    return url in boto3.client("sqs").list_queues(QueueNamePrefix=name).get("QueueUrls", [])


def _held(names: RunNames) -> dict[str, list[str]]:
    """What the run holds in AWS: queues, task definition, live tasks, log group."""
    held = {kind: sorted(found) for kind, found in census.run_aws(names).items()}
    return {**held, "log_groups": sorted(census.run_logs(names))}


def test_two_installs_never_sweep_each_other(cluster: LocalCluster, second_cluster: LocalCluster,
                                            moto_server: MotoServer, aws_env: dict[str, str],
                                            pods_reach_moto: None) -> None:
    assert cluster.identity() != second_cluster.identity()
    # The same name in both clusters; not `t-*`, which the session's shared operator watches
    # in the first: it reconciled this run too, and its RunTasks made 4 tasks of a 2-task run.
    namespace = f"two-installs-{uuid.uuid4().hex[:6]}"
    installs: list[Install] = []
    with cluster.namespace(namespace), second_cluster.namespace(namespace):
        try:
            for i, local in enumerate((cluster, second_cluster)):
                installs.append(_install(local, moto_server, aws_env, namespace,
                                         f"operator-install-{i}.log"))
            runs = []
            for install in installs:
                apply(install.cluster, namespace, run_manifest(
                    "side-by-side", trainer={"command": HANG}, workers={
                        "backend": "ecs-fargate", "cpu": 256, "memory": 512,
                        "minReplicas": 2, "maxReplicas": 2}))
            for install in installs:
                runs.append(wait_phase(install.cluster, namespace, "side-by-side", "Running",
                                       timeout=120))
            names = [names_of(run, "default") for run in runs]
            assert names[0].aws_prefix != names[1].aws_prefix  # two UIDs, one AWS account
            held = [_held(n) for n in names]
            for found in held:  # (the other install's sweeper had taken some already)
                assert len(found.get("queues", [])) == 4 and len(found.get("tasks", [])) == 2 \
                    and found.get("task_definitions") and found["log_groups"], found
            orphans = [_orphan(install) for install in installs]

            # Each sweeper takes its own orphan, once it is old enough...
            wait_for(lambda: not any(_queue_exists(url) for url in orphans), 30,
                     "each install to sweep its own orphan")
            # ... and for several more sweeps nothing else of either install goes.
            deadline = time.monotonic() + WATCHED_FOR_S
            while time.monotonic() < deadline:
                assert [_held(n) for n in names] == held, "a sweeper took the other's"
                time.sleep(0.5)
            for install in installs:
                assert install.operator.alive
                wait_phase(install.cluster, namespace, "side-by-side", "Running", timeout=5)
            for install, n in zip(installs, names, strict=True):
                install.cluster.kubectl("delete", "mtrlrun", "side-by-side", "-n", namespace,
                                        "--timeout=90s")
                assert not census.run_aws(n) and not census.run_logs(n), "teardown left some"
        finally:
            for install in installs:
                install.operator.stop()
