"""A control plane whose only node is a real kubelet on containerd (mtrl_testbed.kubelet_node),
running the images `hack/build-images.sh` builds (tests/images/conftest.py). Started once per
test run; everything it started is stopped at the end."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from mtrl_testbed import kubelet_node
from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.kubelet_node import RealNode
from tests.conftest import ARTIFACTS
from tests.images.conftest import Images, images  # noqa: F401 (the fixture, shared)

NAMES = ("operator", "worker", "trainer")
# The ServiceAccount of the chart's default release (mtrl-operator in mtrl-system).
OPERATOR_USER = "system:serviceaccount:mtrl-system:mtrl-operator"


@dataclass(frozen=True)
class Node:
    cluster: LocalCluster
    node: RealNode

    @staticmethod
    def image(name: str) -> str:
        return Images.ref(name)


@pytest.fixture(scope="session")
def real_node(images: Images, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Node]:  # noqa: F811
    reason = kubelet_node.why_not()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run pods under a real kubelet: {reason}")
        pytest.skip(f"no real kubelet here: {reason}")
    kubelet_node.install()
    root = tmp_path_factory.mktemp("kubelet-cluster")
    # No node agent's nodes: every pod goes to the real node.
    # The chart's operator's requests are audited: what it did to its Lease at uninstall, and
    # that a run it failed never had a trainer created (tests/kubelet/test_e2e.py).
    cluster = LocalCluster(root, nodes=0, node_ip=kubelet_node.machine_ip(),
                           audit_users=(OPERATOR_USER,)).start()
    # Labelled as a HyperPod node is (the trainer's required affinity); no GPUs.
    node = RealNode(cluster, images=tuple(Images.ref(n) for n in NAMES),
                    docker=images.client, docker_host=images.host, kube_proxy=True,
                    labels={"node.kubernetes.io/instance-type": "ml.p5.48xlarge",
                            "sagemaker.amazonaws.com/node-health-status": "Schedulable",
                            "sagemaker.amazonaws.com/compute-type": "hyperpod"})
    try:
        node.start(timeout=900)  # a cold machine imports the trainer's 6.7 GB once
        yield Node(cluster, node)
    finally:
        try:  # a node that cannot stop cleanly (an API server too loaded to answer its
            node.stop()  # drain in time) must not leave the control plane running
        finally:
            cluster.stop()
        shutil.rmtree(ARTIFACTS / "kubelet-logs", ignore_errors=True)
        shutil.copytree(root / "logs", ARTIFACTS / "kubelet-logs", dirs_exist_ok=True)
