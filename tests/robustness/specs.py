"""Hypothesis strategies for `MultiTurnRLRun` manifests, valid and invalid, with hostile text.

Every spec area has a valid strategy (in range, but with injection strings, unicode and very
long text wherever the schema takes free text) and a broken one (out-of-range, negative or
huge numbers, floats or strings where integers go, text that breaks a pattern or a length
limit). A manifest breaks none, one or two areas, so about half of them are accepted and reach
the operator.

Valid values are kept to what the local cluster can run to an end: the trainer is a one-second
`python -c` (the node agent ignores images), trainer pods ask for no GPUs, and Kubernetes
workers need none ready (minReplicas 0), since a worker given hostile environment arguments may
well crash. Fields that name things which must already exist elsewhere (ECS cluster, subnets,
KMS keys, ServiceAccounts, Kueue queues, node labels) are left out here; see
`test_hostile_specs.test_unusable_label_values_fail_the_run`.
"""

from __future__ import annotations

import re
from typing import Any

from hypothesis import strategies as st

from mtrl_api.run import RANDOM_MODEL_PRESETS
from tests.operator.runs import SUCCEED

INJECTIONS = ['"; rm -rf /', "$(id)", "`id`", "{{.Values}}", "' OR 1=1 --", "${HOME}",
              "../../etc/passwd", "%s%s%n", "<script>alert(1)</script>", "a\nb\r\nc", "\\",
              "\u202eevil", "\U0001f916 Ω≈ç√ 中文", "null", "true", "{}", "[]"]
AREAS = ("name", "model", "trainer", "grpo", "rollout", "workers", "reward", "dataset",
         "output", "queues", "lifecycle")
HUGE = [2**31, 2**53 + 1, 2**63, 2**64, 10**30, -(2**63) - 1]


def hostile_text(min_size: int = 0, max_size: int = 64, nul: bool = True) -> st.SearchStrategy[str]:
    """Injection strings, arbitrary unicode (no lone surrogates: JSON cannot carry them) and
    repeated injections up to `max_size` characters."""
    alphabet = st.characters(exclude_categories=("Cs",),
                             exclude_characters=() if nul else ("\x00",))
    long = st.builds(lambda s, n: (s * n)[:max_size], st.sampled_from(INJECTIONS),
                     st.integers(1, max(1, max_size // 2)))
    return st.one_of(st.sampled_from(INJECTIONS), st.text(alphabet, max_size=min(max_size, 40)),
                     long).filter(lambda s: min_size <= len(s) <= max_size)


def no_space(text: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
    return text.map(lambda s: "".join(s.split())).filter(bool)


def images() -> st.SearchStrategy[str]:
    """Odd but well-formed image references (registry, path components with every separator,
    tag, digest): the schema takes them, and the node agent ignores images."""
    component = st.from_regex(r"[a-z0-9]{1,8}((__|[._]|-{1,3})[a-z0-9]{1,8}){0,2}",
                              fullmatch=True)
    registry = st.sampled_from(["", "localhost:5000/", "ghcr.io/",
                                "123456789012.dkr.ecr.us-west-2.amazonaws.com/"])
    tag = st.one_of(st.just(""), st.from_regex(r":[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}",
                                               fullmatch=True))
    digest = st.sampled_from(["", f"@sha256:{'0' * 64}"])
    return st.builds(lambda r, path, t, d: r + "/".join(path) + t + d,
                     registry, st.lists(component, min_size=1, max_size=3), tag, digest)


def bad_int(low: int, high: int) -> st.SearchStrategy[Any]:
    """Not an integer within [low, high]: out of range, huge, a fraction, a string, null."""
    return st.one_of(st.integers(max_value=low - 1), st.integers(min_value=high + 1),
                     st.sampled_from(HUGE), st.floats(low, high).filter(lambda f: f != int(f)),
                     st.integers(low, high).map(str), st.just(None), st.just([low]))


def int_in(low: int, high: int, broken: bool) -> st.SearchStrategy[Any]:
    return bad_int(low, high) if broken else st.integers(low, high)


def bad_float(low: float, high: float) -> st.SearchStrategy[Any]:
    return st.one_of(st.floats(max_value=low, exclude_max=True, allow_nan=False,
                               allow_infinity=False),
                     st.floats(min_value=high, exclude_min=True, allow_nan=False,
                               allow_infinity=False),
                     st.just(1e308), st.just("0.5"), st.just(True))


# ------------------------------------------------------------------------------ areas


def names(broken: bool) -> st.SearchStrategy[str]:
    if not broken:  # DNS subdomains, up to the 253-character limit
        label = st.from_regex(r"\A[a-z0-9]([-a-z0-9]{0,20}[a-z0-9])?\Z")
        return st.one_of(label, st.lists(label, min_size=2, max_size=12).map(".".join),
                         st.builds(lambda n: ("a" * 60 + ".") * 4 + "z" * n, st.integers(1, 9)))
    return st.one_of(hostile_text(), st.just(""), st.just("a" * 254), st.just("UPPER"),
                     st.just("-lead"), st.just("a_b"), st.just("a/b"))


# Model names the schema takes: a Hugging Face repo id ([org/]name), an s3:// prefix, an
# absolute path in the image (anything after the slash but a line break), a random preset.
_HUB_PART = st.from_regex(r"\A[A-Za-z0-9_]([A-Za-z0-9_.-]{0,30}[A-Za-z0-9_])?\Z").filter(
    lambda part: "--" not in part and ".." not in part)
MODEL_NAMES = st.one_of(
    _HUB_PART, st.builds(lambda org, name: f"{org}/{name}", _HUB_PART, _HUB_PART),
    st.builds(lambda key: f"s3://mtrl-models/{key}", _HUB_PART),
    hostile_text(1, 500).filter(lambda t: "\n" not in t).map(lambda t: f"/{t}"),
    st.sampled_from([f"random:{preset}" for preset in RANDOM_MODEL_PRESETS]))


def models(broken: bool) -> st.SearchStrategy[dict[str, Any]]:
    if broken:
        return st.one_of(
            st.fixed_dictionaries({"name": st.one_of(st.just(""), hostile_text(513, 2000))}),
            st.fixed_dictionaries({"name": st.sampled_from([
                "random:huge", "Qwen/Qwen2.5/7B", "Qwen 2.5", "org/x--y", "https://hub/x/y",
                "relative/path/../up"])}),
            st.fixed_dictionaries({"name": st.just("m"), "dtype": hostile_text()}),
            st.fixed_dictionaries({"name": st.just("m"), "lora": st.fixed_dictionaries(
                {"rank": bad_int(1, 1024)})}),
            st.fixed_dictionaries({"name": st.just("m"),
                                   "maxSequenceLength": bad_int(128, 262144)}))
    return st.fixed_dictionaries(
        {"name": MODEL_NAMES, "dtype": st.just("float32")},
        optional={"revision": hostile_text(0, 128),
                  "lora": st.fixed_dictionaries({"rank": st.integers(1, 1024),
                                                 "dropout": st.floats(0, 1)})})


def env_vars(broken: bool) -> st.SearchStrategy[list[dict[str, Any]]]:
    """Extra environment variables. Names never shadow the operator's own variables; values
    are hostile (no NUL: no process can take one in its environment)."""
    name = st.from_regex(r"\AX_[A-Z0-9_]{1,20}\Z")
    value = st.one_of(hostile_text(nul=False), hostile_text(1000, 32768, nul=False))
    good = st.lists(st.fixed_dictionaries({"name": name, "value": value}), max_size=4,
                    unique_by=lambda e: e["name"])
    if not broken:
        return good
    bad_name = st.one_of(hostile_text(), st.just("1X"), st.just("A B"), st.just("a" * 254))
    return st.one_of(
        st.lists(st.fixed_dictionaries({"name": bad_name, "value": value}), min_size=1,
                 max_size=2),
        good.filter(bool).map(lambda envs: [*envs, envs[0]]),  # a duplicate name
        st.just([{"name": "X_BIG", "value": "v" * 32769}]))


def trainers(broken: bool) -> st.SearchStrategy[dict[str, Any]]:
    base = {"command": st.just(SUCCEED), "gpusPerNode": st.just(0), "efaPerNode": st.just(0)}
    if broken:
        return st.one_of(
            st.fixed_dictionaries({**base, "gpusPerNode": bad_int(0, 16)}),
            st.fixed_dictionaries({**base, "nodes": bad_int(1, 256)}),
            st.fixed_dictionaries({**base, "image": st.one_of(
                st.just(""), st.just("has space"), st.just("x" * 513),
                st.just("ghcr.io/Org/trainer"), st.just("trainer:v1:v2"),
                no_space(hostile_text(1, 512)))}),
            st.fixed_dictionaries({**base, "env": env_vars(True)}),
            st.fixed_dictionaries({**base, "command": st.lists(st.just("x" * 4097),
                                                                min_size=1, max_size=1)}))
    return st.fixed_dictionaries(base, optional={
        "image": images(), "env": env_vars(False)})


def grpos(broken: bool) -> st.SearchStrategy[dict[str, Any]]:
    if broken:
        return st.one_of(
            st.fixed_dictionaries({"maxSteps": bad_int(1, 1_000_000)}),
            st.fixed_dictionaries({"groupSize": bad_int(2, 256)}),
            st.fixed_dictionaries({"learningRate": bad_float(0.0, 1.0)}),
            st.fixed_dictionaries({"seed": bad_int(0, 2**31 - 1)}),
            st.fixed_dictionaries({"lossType": hostile_text()}),
            # CEL: epsilonHigh >= epsilon
            st.fixed_dictionaries({"epsilon": st.just(0.9), "epsilonHigh": st.floats(0.01, 0.8)}))
    return st.fixed_dictionaries({"maxSteps": st.integers(1, 1_000_000)}, optional={
        "groupSize": st.integers(2, 256), "learningRate": st.floats(1e-12, 1.0),
        "seed": st.integers(0, 2**31 - 1), "temperature": st.floats(0.01, 2.0)})


def rollouts(broken: bool) -> st.SearchStrategy[dict[str, Any]]:
    args = st.dictionaries(hostile_text(0, 64), hostile_text(0, 4096), max_size=4)
    if broken:
        return st.one_of(
            st.fixed_dictionaries({"environment": hostile_text().filter(
                lambda s: not s.islower() or not s.isalnum())}),
            st.fixed_dictionaries({"environment": st.just("target"),
                                   "environmentArgs": st.just({"k": "v" * 4097})}),
            st.fixed_dictionaries({"environment": st.just("target"),
                                   "maxTurns": bad_int(1, 256)}))
    # An unknown but well-formed environment is accepted, and must fail the run.
    return st.fixed_dictionaries(
        {"environment": st.sampled_from(["target"] * 4 + ["chess", "a.b_c-9"])},
        optional={"environmentArgs": args, "maxTurns": st.integers(1, 256),
                  "concurrencyPerWorker": st.integers(1, 1024)})


def workers(broken: bool) -> st.SearchStrategy[dict[str, Any]]:
    kube = st.fixed_dictionaries(
        {"backend": st.just("kubernetes"), "cpu": st.integers(128, 2048),
         "memory": st.integers(512, 4096), "minReplicas": st.just(0),
         "maxReplicas": st.integers(1, 2)},
        optional={"image": images(), "env": env_vars(False)})
    # Fargate sizes; a memory size the cpu does not take is refused by the schema, naming
    # spec.workers.memory.
    ecs = st.fixed_dictionaries(
        {"backend": st.just("ecs-fargate"), "cpu": st.sampled_from([256, 512]),
         "memory": st.sampled_from([512, 1024, 2048, 8192]), "minReplicas": st.integers(0, 1),
         "maxReplicas": st.integers(1, 3)},
        optional={"image": images(), "env": env_vars(False)})
    if not broken:
        return st.one_of(kube, ecs)
    return st.one_of(
        st.fixed_dictionaries({"backend": hostile_text()}),
        ecs.map(lambda w: {**w, "cpu": 300}),  # CEL: not a Fargate size
        kube.map(lambda w: {**w, "minReplicas": 5, "maxReplicas": 2}),  # CEL: min <= max
        st.fixed_dictionaries({"backend": st.just("kubernetes"), "maxReplicas": bad_int(1, 1000)}),
        st.fixed_dictionaries({"backend": st.just("kubernetes"), "memory": bad_int(512, 122880)}),
        st.fixed_dictionaries({"backend": st.just("kubernetes"), "env": env_vars(True)}))


def rewards(broken: bool) -> st.SearchStrategy[dict[str, Any]]:
    """Component weights. A well-formed name the environment lacks (Wordle's `win`, which the
    flagship example once used) is accepted by the schema and must fail the run with
    UnknownRewardComponent, before any worker starts."""
    component = st.fixed_dictionaries(
        {"name": st.sampled_from(["target_fraction"] * 3 + ["win", "guesses_left"])},
        optional={"weight": st.floats(-1000, 1000)})
    if broken:
        return st.one_of(
            st.fixed_dictionaries({"components": st.lists(st.fixed_dictionaries(
                {"name": hostile_text(1, 80).filter(
                    lambda s: not re.fullmatch(r"[a-z0-9_]{1,63}", s))}),
                min_size=1, max_size=2)}),
            st.fixed_dictionaries({"components": st.lists(st.fixed_dictionaries(
                {"name": st.just("target_fraction"), "weight": bad_float(-1000.0, 1000.0)}),
                min_size=1, max_size=1)}),
            # list-map keyed by name: a name twice is refused
            st.just({"components": [{"name": "target_fraction"}, {"name": "target_fraction"}]}))
    return st.fixed_dictionaries({}, optional={"components": st.lists(
        component, max_size=2, unique_by=lambda c: c["name"])})


def datasets(broken: bool) -> st.SearchStrategy[dict[str, Any]]:
    task = st.dictionaries(hostile_text(0, 64), hostile_text(0, 4096), min_size=1, max_size=3)
    inline = st.fixed_dictionaries({"inline": st.fixed_dictionaries(
        {"train": st.lists(task, min_size=1, max_size=3)})})
    generated = st.fixed_dictionaries({"generated": st.fixed_dictionaries(
        {"trainSize": st.integers(1, 10_000_000)})})
    if not broken:
        return st.one_of(inline, generated)
    return st.one_of(
        st.just({}),  # CEL: exactly one source
        st.tuples(inline, generated).map(lambda p: {**p[0], **p[1]}),
        st.fixed_dictionaries({"inline": st.just({"train": []})}),
        st.fixed_dictionaries({"generated": st.fixed_dictionaries(
            {"trainSize": bad_int(1, 10_000_000)})}),
        st.fixed_dictionaries({"s3": st.fixed_dictionaries({"trainUri": hostile_text()})}))


def outputs(broken: bool) -> st.SearchStrategy[dict[str, Any]]:
    if broken:
        return st.fixed_dictionaries({"s3Uri": st.one_of(
            hostile_text(), st.just("s3://UPPER/x"), st.just("s3://a"),
            st.just("s3://bucket/" + "k" * 1024))})
    path = hostile_text(0, 200).map(lambda s: s.replace("\n", "").replace("\r", ""))
    return st.fixed_dictionaries({"s3Uri": path.map(lambda p: f"s3://mtrl-out.example-1/{p}")})


def queues(broken: bool) -> st.SearchStrategy[dict[str, Any]]:
    if broken:
        return st.one_of(
            st.fixed_dictionaries({"visibilityTimeoutSeconds": bad_int(0, 43200)}),
            st.fixed_dictionaries({"messageRetentionSeconds": bad_int(60, 1209600)}),
            st.fixed_dictionaries({"maxReceiveCount": bad_int(1, 1000)}))
    return st.fixed_dictionaries({}, optional={
        "visibilityTimeoutSeconds": st.integers(0, 43200),
        "messageRetentionSeconds": st.integers(60, 1209600),
        "maxReceiveCount": st.integers(1, 1000)})


def lifecycles(broken: bool) -> st.SearchStrategy[dict[str, Any]]:
    """No suspend and no TTL: both end somewhere other than a finished, visible run."""
    if broken:
        return st.one_of(st.fixed_dictionaries({"backoffLimit": bad_int(0, 100)}),
                         st.fixed_dictionaries({"activeDeadlineSeconds": bad_int(1, 31_536_000)}))
    return st.fixed_dictionaries({"backoffLimit": st.integers(0, 1)}, optional={
        "activeDeadlineSeconds": st.integers(1, 31_536_000)})


AREA_STRATEGIES = {"model": models, "trainer": trainers, "grpo": grpos, "rollout": rollouts,
                   "workers": workers, "reward": rewards, "dataset": datasets,
                   "output": outputs, "queues": queues, "lifecycle": lifecycles}


@st.composite
def run_manifests(draw: st.DrawFn) -> dict[str, Any]:
    """A MultiTurnRLRun with none, one or two areas broken."""
    broken = draw(st.one_of(st.just(frozenset()),
                            st.frozensets(st.sampled_from(AREAS), min_size=1, max_size=2)))
    spec = {area: draw(strategy(area in broken)) for area, strategy in AREA_STRATEGIES.items()}
    return {"apiVersion": "mtrl.dev/v1alpha1", "kind": "MultiTurnRLRun",
            "metadata": {"name": draw(names("name" in broken))}, "spec": spec}
