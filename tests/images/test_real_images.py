"""The images themselves, built from images/ (tests/images/conftest.py): every command the
operator, the chart or a person gives a container runs, as uid 65532 under a read-only root with
no network and no capabilities, and the packages each image runs import there without writing
anything anywhere in the container."""

from __future__ import annotations

import json

import pytest

from tests.images.conftest import Images
from tests.images.test_dockerfiles import NAMES, command, trainer_command
from tests.images.test_image_contents import RUNS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]  # a cold build takes minutes

# The console scripts and modules each image is started with, with --help (or a command that
# only reads): the image's default, what the operator sets, and what a person runs in it.
COMMANDS = {
    "operator": [
        [*command("operator"), "--help"],
        ["mtrl", "--help"],
        ["kubectl-mtrl", "--help"],
        ["mtrl", "drain", "--help"],
    ],
    "worker": [
        [*command("worker"), "--help"],
        ["mtrl", "--help"],
        ["kubectl-mtrl", "--help"],
        ["mtrl", "env", "list"],
    ],
    "trainer": [
        [*trainer_command(nodes=1, gpus=1), "--help"],
        ["mtrl", "--help"],
        ["kubectl-mtrl", "--help"],
        ["python", "-m", "mtrl_trainer", "--help"],
        ["torchrun", "--help"],
        ["mtrl", "torchrun", "--help"],
        ["hyperpodrun", "--help"],
    ],
}
CASES = [(name, argv) for name in NAMES for argv in COMMANDS[name]]

# What must be writable besides nothing: the trainer imports libraries that probe for a temporary
# directory when imported (dill, through torch and datasets: tempfile.gettempdir() writes a file
# to find one), so a read-only trainer needs /tmp mounted, as the chart mounts the operator's.
# Its pods keep a writable root (docs/images.md); the operator and the worker need nothing.
# `exec`, as an emptyDir is: torch.compile loads the kernels it builds from there.
WRITABLE = {"operator": (), "worker": (), "trainer": ("--tmpfs", "/tmp:exec")}


@pytest.mark.parametrize(("name", "argv"), CASES, ids=[f"{n}:{' '.join(a)}" for n, a in CASES])
def test_command_runs_read_only_as_65532(images: Images, name: str, argv: list[str]) -> None:
    done = images.run(name, argv, *WRITABLE[name])
    assert done.returncode == 0, f"{' '.join(argv)} in {name}:\n{done.stdout}\n{done.stderr}"
    assert done.stdout.strip(), f"{' '.join(argv)} printed nothing"


def _import_everything(name: str) -> str:
    """A script that imports every module of the packages the image runs (its plug-ins are
    loaded by name at run time, so each is imported here), and prints how many. `__main__`
    modules run their program when imported: the commands above run those."""
    starts = json.dumps([m for m in RUNS[name] if not m.endswith("__main__")])
    return f"""
import importlib, pkgutil
done = 0
for start in {starts}:
    module = importlib.import_module(start)
    done += 1
    for info in pkgutil.walk_packages(getattr(module, "__path__", []), start + "."):
        if not info.name.endswith(".__main__"):
            importlib.import_module(info.name)
            done += 1
print(done)
"""


@pytest.mark.parametrize("name", NAMES)
def test_packages_import_under_a_read_only_root(images: Images, name: str) -> None:
    done = images.run(name, ["python", "-c", _import_everything(name)], *WRITABLE[name])
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) > 1


@pytest.mark.parametrize("name", NAMES)
def test_nothing_is_written_anywhere_in_the_container(images: Images, name: str) -> None:
    """With a writable root: importing everything and the default command's --help leave the
    container's filesystem as the image made it (no bytecode, no caches, nothing in HOME)."""
    created = images.docker("create", "--network", "none", "--user", "65532:65532",
                            "--entrypoint", "sh", images.ref(name), "-c",
                            f"python -c '{_import_everything(name)}' && "
                            + " ".join(COMMANDS[name][0]) + " >/dev/null")
    assert created.returncode == 0, created.stderr
    container = created.stdout.strip()
    try:
        started = images.docker("start", "--attach", container)
        assert started.returncode == 0, started.stderr
        diff = images.docker("diff", container)
        assert diff.returncode == 0, diff.stderr
        assert diff.stdout.strip() == "", f"{name} wrote:\n{diff.stdout}"
    finally:
        images.docker("rm", "-f", container)


@pytest.mark.parametrize("name", NAMES)
def test_runs_as_uid_65532(images: Images, name: str) -> None:
    done = images.docker("image", "inspect", "--format", "{{.Config.User}}", images.ref(name))
    assert done.stdout.strip() == "65532:65532"
    whoami = images.run(name, ["python", "-c", "import os; print(os.getuid(), os.getgid())"],
                        *WRITABLE[name])
    assert whoami.stdout.split() == ["65532", "65532"]


# What each image must not hold (docs/images.md): the local control plane nowhere, the data
# plane not in the operator, the operator's libraries not in the worker.
ABSENT = {
    "operator": ["mtrl_testbed", "mtrl_worker", "mtrl_trainer", "torch"],
    "worker": ["mtrl_testbed", "mtrl_operator", "mtrl_trainer", "kopf", "torch"],
    "trainer": ["mtrl_testbed", "mtrl_operator", "kopf"],
}


@pytest.mark.parametrize("name", NAMES)
def test_holds_nothing_it_does_not_run(images: Images, name: str) -> None:
    script = ("import importlib.util, sys; "
              f"print([m for m in {ABSENT[name]!r} if importlib.util.find_spec(m)])")
    done = images.run(name, ["python", "-c", script], *WRITABLE[name])
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# A subcommand whose package another image holds says so (mtrl_cli.main), rather than a
# traceback: image -> (subcommand, the package it lacks).
ELSEWHERE = {"operator": ("worker", "mtrl_worker"), "worker": ("operator", "mtrl_operator"),
             "trainer": ("operator", "mtrl_operator")}


@pytest.mark.parametrize("name", NAMES)
def test_a_subcommand_of_another_image_says_where_it_runs(images: Images, name: str) -> None:
    subcommand, package = ELSEWHERE[name]
    done = images.run(name, ["mtrl", subcommand, "--help"], *WRITABLE[name])
    assert done.returncode == 2, done.stderr
    assert f"does not include {package}" in done.stderr, done.stderr


SANDBOX = """
import asyncio
from mtrl_worker.environments import sandbox
result = asyncio.run(sandbox.run_tests("def add(a, b):\\n    return a + b\\n",
                                       [("add(1, 2)", "3"), ("add(1, 1)", "3")]))
print(result.passed, result.total, result.error, sandbox.network_isolated())
"""


def test_the_coding_sandbox_scores_solutions_in_a_restricted_container(images: Images) -> None:
    """The coding environment's sandbox as a restricted worker pod runs it: uid 65532, no
    capabilities, no privilege escalation, the engine's default seccomp profile, /tmp its only
    writable path. `unshare` is refused there (EPERM), so solutions get no network namespace of
    their own, only the audit hook (docs/images.md); they are still run and scored."""
    done = images.run("worker", ["python", "-c", SANDBOX], "--tmpfs", "/tmp")
    assert done.returncode == 0, done.stderr
    passed, total, error, isolated = done.stdout.split()
    assert (passed, total, error) == ("1", "2", "None")
    assert isolated == "False"  # seen with Docker's default profile; a runtime that allows
    # user namespaces would isolate, and this line would say so


def test_the_worker_has_unshare(images: Images) -> None:
    """The coding environment's sandbox isolates solutions with `unshare --net` where the
    kernel allows it (mtrl_worker.environments.sandbox), from util-linux in the base."""
    done = images.run("worker", ["sh", "-c", "command -v unshare"])
    assert done.returncode == 0 and done.stdout.strip(), done.stderr


# The trainer's libraries working together on CPU, from the trainer's own code: a tiny random
# policy with its LoRA adapter (nothing downloaded), one forward and backward in train mode
# (gradient checkpointing on, as by default).
POLICY_STEP = """
import math, torch
from mtrl_api.run import ModelSpec
from mtrl_trainer.models import load_policy
policy = load_policy(ModelSpec(name="random:tiny-qwen2", dtype="float32"), seed=0,
                     device=torch.device("cpu"))
ids = torch.tensor([policy.tokenizer.encode("guess the word")])
policy.model.train()
loss = policy.model(input_ids=ids, labels=ids).loss
loss.backward()
grads = [p.grad for p in policy.model.parameters() if p.requires_grad]
assert grads and all(g is not None for g in grads), "LoRA got no gradient"
assert math.isfinite(loss.item()), loss
print(torch.__version__, loss.item())
"""


def test_the_trainer_trains_a_tiny_policy_on_cpu(images: Images) -> None:
    done = images.run("trainer", ["python", "-c", POLICY_STEP], *WRITABLE["trainer"])
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"
    assert "Disabling PyTorch" not in done.stderr, done.stderr


# What torch.compile needs of the image when the trainer compiles its decode step (on GPUs):
# a name for uid 65532 (inductor calls getpass.getuser()) and a C compiler that builds and
# links a shared object, as Triton does for its kernel launchers.
COMPILER = """
import ctypes, getpass, os, subprocess, tempfile
print(getpass.getuser())
with tempfile.TemporaryDirectory() as work:
    source, library = os.path.join(work, "k.c"), os.path.join(work, "k.so")
    with open(source, "w") as f:
        f.write("#include <stdlib.h>\\nint k(void) { return abs(-7); }\\n")
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", library, source], check=True)
    print(ctypes.CDLL(library).k())
"""


def test_the_trainer_has_what_torch_compile_needs(images: Images) -> None:
    done = images.run("trainer", ["python", "-c", COMPILER], *WRITABLE["trainer"])
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["mtrl", "7"]
