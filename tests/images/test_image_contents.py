"""Each image holds what it runs and nothing else: the packages its Dockerfile copies into the
wheel are the ones its commands reach, and the libraries those import are the ones its extra
installs (with what they pull in). Read from the source (every import, lazy ones included), the
Dockerfiles and pyproject.toml; `hack/image-contents.py` installs each set and sizes it.

`mtrl` is one distribution with one extra per image (docs/images.md): the API models and the
rollout protocol are what every image shares, and all its base requires.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
from functools import cache
from pathlib import Path

import pytest

from tests.images.test_dockerfiles import IMAGES, NAMES, PYPROJECT, installed_extras, parse

REPO = Path(__file__).resolve().parents[2]
ROOTS = PYPROJECT["tool"]["setuptools"]["packages"]["find"]["where"]
PACKAGES = {f"mtrl_{root}" if root != "cli" else "mtrl_cli": root for root in ROOTS}

# What each image runs: whole packages (their plug-ins are loaded by name, not imported), and
# the `mtrl` command's dispatcher, which imports its subcommands only when asked.
RUNS = {
    "operator": ("mtrl_operator", "mtrl_cli.main", "mtrl_cli.__main__"),
    "worker": ("mtrl_worker", "mtrl_cli.main", "mtrl_cli.__main__"),
    "trainer": ("mtrl_trainer", "mtrl_worker.environments", "mtrl_cli.main", "mtrl_cli.__main__"),
}
# What a person installs for the command line: the `cli` and `plots` extras.
CLI = ("mtrl_cli",)


def _module_path(name: str) -> Path | None:
    top = name.split(".")[0]
    if top not in PACKAGES:
        return None
    base = REPO / PACKAGES[top] / Path(*name.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _modules_of(name: str) -> list[str]:
    """A package's modules (all of them), or the one module named."""
    path = _module_path(name)
    assert path is not None, f"no module {name}"
    if path.name != "__init__.py":
        return [name]
    root = REPO / PACKAGES[name.split(".")[0]]
    return sorted(".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
                  for p in path.parent.rglob("*.py") if "__pycache__" not in p.parts)


@cache
def _imports(name: str) -> frozenset[str]:
    path = _module_path(name)
    assert path is not None, name
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{alias.name}" for alias in node.names
                      if _module_path(f"{node.module}.{alias.name}") is not None}
    # A package's module imports its parents' __init__ first.
    parts = name.split(".")
    found |= {".".join(parts[:i]) for i in range(1, len(parts))}
    return frozenset(found)


def reached(starts: tuple[str, ...]) -> tuple[set[str], set[str]]:
    """(first-party modules, third-party top-level imports) reached from `starts`."""
    todo = [m for start in starts for m in _modules_of(start)]
    modules: set[str] = set()
    third: set[str] = set()
    while todo:
        name = todo.pop()
        if name in modules:
            continue
        modules.add(name)
        for imported in _imports(name):
            top = imported.split(".")[0]
            if top in PACKAGES:
                if _module_path(imported) is not None:
                    todo.append(imported)
            elif top not in sys.stdlib_module_names and top != "__future__":
                third.add(top)
    return modules, third


def _dist_name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _requirements(extras: set[str]) -> set[str]:
    project = PYPROJECT["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    return {_dist_name(r) for r in reqs}


@cache
def _pulled_in(dist: str) -> frozenset[str]:
    """A distribution and what it requires, transitively (as installed here, extras aside)."""
    try:
        requires = importlib.metadata.requires(dist) or []
    except importlib.metadata.PackageNotFoundError:
        return frozenset({dist})
    out = {dist}
    for req in requires:
        if "extra ==" not in req:
            out |= _pulled_in(_dist_name(req))
    return frozenset(out)


def _installed(extras: set[str]) -> set[str]:
    return {d for req in _requirements(extras) for d in _pulled_in(req)}


def _distributions_of(top: str) -> set[str]:
    return {d.lower().replace("_", "-")
            for d in importlib.metadata.packages_distributions().get(top, [top])}


def copied_roots(name: str) -> set[str]:
    """The source folders the wheel stage copies."""
    return {w for ins in parse(IMAGES / name / "Dockerfile") if ins.keyword == "COPY"
            and not any(a.startswith("--from=") for a in ins.args.split())
            for w in ins.args.split()[:-1] if w in ROOTS}


def test_every_image_says_what_it_runs() -> None:
    assert set(RUNS) == set(NAMES)


@pytest.mark.parametrize("name", NAMES)
def test_the_wheel_holds_the_packages_the_image_runs_and_no_other(name: str) -> None:
    modules, _ = reached(RUNS[name])
    needed = {PACKAGES[m.split(".")[0]] for m in modules}
    assert copied_roots(name) == needed, (
        f"images/{name}: copies {sorted(copied_roots(name))}, runs {sorted(needed)}")


@pytest.mark.parametrize("name", NAMES)
def test_the_extra_installs_every_library_the_image_imports(name: str) -> None:
    _, third = reached(RUNS[name])
    installed = _installed(installed_extras(name))
    missing = {top for top in third if not _distributions_of(top) & installed}
    assert not missing, f"images/{name} imports {sorted(missing)}, which its extras " \
                        f"{sorted(installed_extras(name))} do not install"


def test_the_command_line_extra_installs_what_the_commands_import() -> None:
    _, third = reached(CLI)
    installed = _installed({"cli", "plots"})
    assert {top for top in third if not _distributions_of(top) & installed} == set()


def test_the_worker_image_holds_neither_the_operator_nor_its_libraries() -> None:
    modules, _ = reached(RUNS["worker"])
    assert not {m for m in modules if m.startswith(("mtrl_operator", "mtrl_trainer"))}
    installed = _installed(installed_extras("worker"))
    assert not {"kopf", "lightkube", "prometheus-client", "torch"} & installed


def test_the_operator_image_holds_no_data_plane() -> None:
    modules, _ = reached(RUNS["operator"])
    assert not {m for m in modules if m.startswith(("mtrl_worker", "mtrl_trainer"))}
    assert "torch" not in _installed(installed_extras("operator"))


def test_the_check_sees_lazy_imports_and_what_an_extra_pulls_in() -> None:
    # mtrl_operator.main imports kopf at the top, the dispatcher imports it only when asked.
    assert "kopf" in reached(("mtrl_operator.main",))[1]
    assert "kopf" not in reached(("mtrl_cli.main",))[1]
    assert "transformers" in reached(("mtrl_trainer.models",))[1]  # imported inside a function
    assert "botocore" in _installed(set())  # boto3 pulls it in
    assert "kopf" not in _installed({"worker"})
