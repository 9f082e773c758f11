"""The product installed on the local control plane, as `make demo` and `make dev-up` use it:
pods reach the moto server, the example's output bucket exists, and the chart is installed with
its default values (two replicas, one leading) and faster loops for a laptop."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from mtrl_testbed.cluster import REPO_ROOT, LocalCluster
from mtrl_testbed.moto import MotoServer

EXAMPLE = REPO_ROOT / "manifests" / "examples" / "tiny-cpu.yaml"
CHART = REPO_ROOT / "charts" / "mtrl-operator"
CHART_VALUES = ['operator={"resyncSeconds":5,"sweepIntervalSeconds":60}']
RELEASE, RELEASE_NAMESPACE = "mtrl-operator", "mtrl-system"


def install(cluster: LocalCluster, moto: MotoServer, root: Path) -> str:
    """Point pods at moto, create the example's output bucket, `helm install` the chart and
    wait for it. Returns the bucket's name. Needs moto's environment applied (os.environ)."""
    env = moto.env()
    (root / "pod-env.json").write_text(json.dumps(env))  # the node agent gives it to every pod
    cluster.install_crds(REPO_ROOT / "crds")
    run = yaml.safe_load(EXAMPLE.read_text())
    bucket = moto.bucket(run["spec"]["output"]["s3Uri"].split("/")[2])
    print(f"== helm install {RELEASE} charts/mtrl-operator -n {RELEASE_NAMESPACE}", flush=True)
    sets = [arg for value in CHART_VALUES for arg in ("--set-json", value)]
    cluster.helm("install", RELEASE, str(CHART), "-n", RELEASE_NAMESPACE, "--create-namespace",
                 "--wait", "--timeout", "180s", *sets)
    return bucket
