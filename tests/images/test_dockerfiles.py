"""The Dockerfiles under images/ name only things the distribution has: console scripts, `mtrl`
subcommands, `-m` modules, and repository paths to copy. Read from the files, without a Docker
engine: they catch a rename before a build does. test_real_images.py builds and runs them."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import json
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest

from mtrl_api.run import MultiTurnRLRunSpec
from mtrl_cli.main import DELEGATES
from mtrl_operator.builders.trainer import pod_template
from mtrl_operator.builders.workers import WORKER_COMMAND, deployment
from mtrl_operator.naming import RunNames

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "images"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
# Console scripts an image may name that other distributions install: script -> distribution.
FOREIGN_SCRIPTS = {"torchrun": "torch", "hyperpodrun": "hyperpod-elastic-agent"}
NAMES = sorted(p.name for p in IMAGES.iterdir() if (p / "Dockerfile").is_file())
RUN = RunNames("team-a", "wordle", "0000-uid")


@dataclass(frozen=True)
class Instruction:
    keyword: str
    args: str


def parse(path: Path) -> list[Instruction]:
    """Instructions with continuation lines joined; comments and blank lines dropped."""
    out, pending = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue  # Docker drops these inside a continued instruction too
        if line.endswith("\\"):
            pending += line[:-1].rstrip() + " "
            continue
        keyword, _, args = (pending + line).partition(" ")
        out.append(Instruction(keyword.upper(), args.strip()))
        pending = ""
    assert not pending, f"{path}: the last instruction ends with a line continuation"
    return out


def final_stage(instructions: list[Instruction]) -> list[Instruction]:
    starts = [i for i, ins in enumerate(instructions) if ins.keyword == "FROM"]
    return instructions[starts[-1]:]


def exec_form(ins: Instruction) -> list[str]:
    """The JSON (exec) form of ENTRYPOINT or CMD; the shell form would wrap it in /bin/sh."""
    value = json.loads(ins.args)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), ins
    return value


def last(stage: list[Instruction], keyword: str) -> Instruction | None:
    found = [ins for ins in stage if ins.keyword == keyword]
    return found[-1] if found else None


def command(name: str) -> list[str]:
    """What the image runs by default: ENTRYPOINT followed by CMD."""
    stage = final_stage(parse(IMAGES / name / "Dockerfile"))
    entrypoint, cmd = last(stage, "ENTRYPOINT"), last(stage, "CMD")
    assert entrypoint is not None, f"images/{name}/Dockerfile has no ENTRYPOINT"
    return exec_form(entrypoint) + (exec_form(cmd) if cmd else [])


def installed_extras(name: str) -> set[str]:
    """Extras of the distribution that the final stage's pip install asks for."""
    runs = [ins.args for ins in final_stage(parse(IMAGES / name / "Dockerfile"))
            if ins.keyword == "RUN" and "pip install" in ins.args]
    assert runs, f"images/{name}/Dockerfile installs nothing"
    return {extra for args in runs for extras in re.findall(r"\.whl\)?\[([\w,-]+)\]", args)
            for extra in extras.split(",")}


def import_target(target: str) -> None:
    module, _, func = target.partition(":")
    assert callable(getattr(importlib.import_module(module), func)), target


def _spec(nodes: int = 1, gpus: int = 8, launcher: str = "Job") -> MultiTurnRLRunSpec:
    return MultiTurnRLRunSpec.model_validate({
        "model": {"name": "Qwen/Qwen3-8B"}, "rollout": {"environment": "wordle"},
        "dataset": {"generated": {}}, "output": {"s3Uri": "s3://bucket/runs/wordle"},
        "trainer": {"nodes": nodes, "gpusPerNode": gpus, "launcher": launcher},
    })


def trainer_command(nodes: int, gpus: int, launcher: str = "Job") -> list[str]:
    """The command the operator gives trainer containers for this shape."""
    template = pod_template(RUN, _spec(nodes, gpus, launcher), {}, attempt=1)
    return template["spec"]["containers"][0]["command"]


def pip_installed(name: str) -> set[str]:
    """Distributions the final stage's pip installs by name (pinned with ==)."""
    return {m for ins in final_stage(parse(IMAGES / name / "Dockerfile"))
            if ins.keyword == "RUN" and "pip install" in ins.args
            for m in re.findall(r'"([A-Za-z0-9_.-]+)==', ins.args)}


# Every way a container of an image is started: its own default, and the commands the
# operator sets for it. case -> (image, argv).
CASES = {
    "operator-default": ("operator", lambda: command("operator")),
    "worker-default": ("worker", lambda: command("worker")),
    "worker-by-operator": ("worker", lambda: WORKER_COMMAND),
    "trainer-default": ("trainer", lambda: command("trainer")),
    "trainer-by-operator-1x1": ("trainer", lambda: trainer_command(nodes=1, gpus=1)),
    "trainer-by-operator-1x8": ("trainer", lambda: trainer_command(nodes=1, gpus=8)),
    "trainer-by-operator-2x8": ("trainer", lambda: trainer_command(nodes=2, gpus=8)),
    "trainer-by-operator-hyperpod-2x8": ("trainer", lambda: trainer_command(
        nodes=2, gpus=8, launcher="HyperPodPyTorchJob")),
}


def test_every_image_is_found() -> None:
    assert NAMES == ["operator", "trainer", "worker"]
    assert {image for image, _ in CASES.values()} == set(NAMES)


def check_console_script(name: str, script: str) -> None:
    scripts = PYPROJECT["project"]["scripts"]
    if script in scripts:
        import_target(scripts[script])
        return
    assert script in FOREIGN_SCRIPTS, f"{script} is neither in [project.scripts] nor known"
    dist = FOREIGN_SCRIPTS[script]
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert dist in pip_installed(name) or any(
        re.match(rf"{dist}\b", req) for extra in installed_extras(name)
        for req in extras[extra]), f"images/{name} installs neither {dist} nor an extra that " \
        f"requires it"
    try:
        found = importlib.metadata.distribution(dist).entry_points
    except importlib.metadata.PackageNotFoundError:
        return  # the requirement is declared; its script cannot be looked at here
    assert script in {ep.name for ep in found if ep.group == "console_scripts"}, script


def check_subcommand(subcommand: str) -> None:
    assert subcommand in DELEGATES, f"`mtrl {subcommand}` is not a subcommand"
    target = DELEGATES[subcommand][0]
    if target.startswith("mtrl_trainer"):
        pytest.importorskip("torch")
    import_target(target)


def check_module(module: str) -> None:
    spec = importlib.util.find_spec(module)
    assert spec is not None, f"-m {module}: no such module"
    if spec.submodule_search_locations is not None:  # a package runs its __main__
        assert importlib.util.find_spec(f"{module}.__main__") is not None, f"-m {module}"


@pytest.mark.parametrize("case", CASES)
def test_command_names_only_what_the_image_has(case: str) -> None:
    name, argv = CASES[case][0], CASES[case][1]()
    check_console_script(name, argv[0])
    for i, arg in enumerate(argv[:-1]):
        if arg == "-m":
            check_module(argv[i + 1])
    if argv[0] == "mtrl":
        check_subcommand(argv[1])


@pytest.mark.parametrize("name", NAMES)
def test_copy_sources_exist_and_reach_the_context(name: str) -> None:
    allowed = {line[1:] for line in (IMAGES / name / "Dockerfile.dockerignore").read_text().splitlines()
               if line.startswith("!")}
    copies = [ins for ins in parse(IMAGES / name / "Dockerfile") if ins.keyword == "COPY"]
    assert copies
    for ins in copies:
        words = ins.args.split()
        if any(w.startswith("--from=") for w in words):
            continue
        for source in [w for w in words if not w.startswith("--")][:-1]:
            assert (REPO / source).exists(), f"images/{name}: COPY {source}: not in the repository"
            assert source in allowed, f"images/{name}: COPY {source}: excluded by the .dockerignore"


@pytest.mark.parametrize("name", NAMES)
def test_runs_as_numeric_non_root_user(name: str) -> None:
    user = last(final_stage(parse(IMAGES / name / "Dockerfile")), "USER")
    assert user is not None, f"images/{name} runs as root"
    uid, _, gid = user.args.partition(":")
    # Numeric, so runAsNonRoot can verify it without a passwd entry.
    assert uid.isdigit() and int(uid) != 0, user
    assert not gid or gid.isdigit(), user


# One extra per image: what its own commands need (tests/images/test_image_contents.py); the
# trainer's adds TRL, for spec.trainer.engine trl.
EXTRAS = {"operator": {"operator"}, "worker": {"worker"}, "trainer": {"trainer", "trl"}}


@pytest.mark.parametrize("name", NAMES)
def test_installs_the_right_extras(name: str) -> None:
    assert installed_extras(name) == EXTRAS[name]


def test_worker_pods_run_as_the_images_user() -> None:
    user = last(final_stage(parse(IMAGES / "worker" / "Dockerfile")), "USER")
    assert user is not None
    pod = deployment(RUN, _spec(), {}, {})["spec"]["template"]["spec"]
    uid = pod["containers"][0]["securityContext"].get("runAsUser",
                                                      pod["securityContext"].get("runAsUser"))
    assert str(uid) == user.args.partition(":")[0]


def test_worker_default_is_what_the_operator_runs() -> None:
    assert command("worker") == WORKER_COMMAND


def test_trainer_default_is_what_the_operator_runs_on_one_8_gpu_node() -> None:
    assert command("trainer") == trainer_command(nodes=1, gpus=8)


def test_the_trainer_pins_torch_to_the_installed_distribution() -> None:
    """pip compares a pin with the installed distribution's version. `torch.__version__` is not
    that: PyPI's torch 2.15.0 says 2.15.0+cu132, a version no index has, and the build failed
    (seen when CI first built the image)."""
    runs = [ins.args for ins in final_stage(parse(IMAGES / "trainer" / "Dockerfile"))
            if ins.keyword == "RUN" and '"torch==' in ins.args]
    assert runs
    for args in runs:
        assert "torch.__version__" not in args
        assert "importlib.metadata" in args and 'version("torch")' in args, args


def test_every_base_is_a_build_argument_defaulting_to_what_users_pull() -> None:
    """CI builds on bases made on its own machine (hack/build-images.sh); users get these."""
    defaults = {"operator": {"BASE_IMAGE": "python:3.11-slim"},
                "worker": {"BASE_IMAGE": "python:3.11-slim"},
                "trainer": {"BASE_IMAGE": "python:3.11-slim",
                            "TRAINER_BASE_IMAGE": "pytorch/pytorch:"}}
    for name in NAMES:
        instructions = parse(IMAGES / name / "Dockerfile")
        args = dict(ins.args.partition("=")[::2] for ins in instructions if ins.keyword == "ARG"
                    and "=" in ins.args)
        for arg, default in defaults[name].items():
            assert args.get(arg, "").startswith(default), (name, arg, args)
        froms = [ins.args.split()[0] for ins in instructions if ins.keyword == "FROM"]
        assert all(f.startswith("${") and f.strip("${}") in defaults[name] for f in froms), froms
