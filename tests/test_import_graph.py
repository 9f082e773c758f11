"""The dependency arrows point one way: read from every module's imports (its AST).

- Transport libraries (botocore, boto3, lightkube, prometheus_client) are used only by the
  operator's adapters and its metrics module; the controllers speak the operator's own
  types and errors.
- Pure layers (reconcile/, builders/, launchers/, naming, errors, settings, leader) import no adapter and
  no controller; adapters import no controller.
- The data plane (trainer, worker, rollout) and the API package never import the operator.
- The operator never imports the worker or the trainer (what it knows of environments is
  mtrl_api's catalog, data); only the `mtrl` command (`mtrl_cli.main`) names them, as strings
  it dispatches to.
- `reconcile/` is decisions only: no networking, processes, threads or event loop, no AWS or
  Kubernetes client, no SQS client of the rollout protocol, no plug-in loading, no data plane.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
OPERATOR = REPO / "operator" / "mtrl_operator"
TRANSPORTS = ("botocore", "boto3", "lightkube", "prometheus_client")


def imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def _uses(names: set[str], *packages: str) -> set[str]:
    return {n for n in names if n.split(".")[0] in packages or
            any(n == p or n.startswith(p + ".") for p in packages)}


def _modules(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", _modules(OPERATOR), ids=lambda p: str(p.relative_to(OPERATOR)))
def test_transport_libraries_stay_behind_the_adapters(path: Path) -> None:
    rel = path.relative_to(OPERATOR)
    if rel.parts[0] == "adapters" or rel.name == "metrics.py":
        return
    assert not _uses(imports(path), *TRANSPORTS), f"{rel} imports a transport library"


PURE = [p for p in _modules(OPERATOR) if p.relative_to(OPERATOR).parts[0] in
        ("reconcile", "builders", "launchers") or p.name in ("naming.py", "errors.py", "settings.py",
                                                 "leader.py")]


@pytest.mark.parametrize("path", PURE, ids=lambda p: str(p.relative_to(OPERATOR)))
def test_pure_layers_do_no_io(path: Path) -> None:
    found = _uses(imports(path), "mtrl_operator.adapters", "mtrl_operator.controllers",
                  "mtrl_operator.handlers", *TRANSPORTS, "kopf", "importlib", "importlib.metadata")
    assert not found, f"{path.relative_to(OPERATOR)} imports {sorted(found)}"


# What does I/O or loads code: what `reconcile/` must never import.
IO = ("socket", "ssl", "subprocess", "threading", "asyncio", "concurrent", "urllib.request",
      "http", "aiohttp", "httpx", "httpx2", "kopf", *TRANSPORTS, "importlib", "mtrl_rollout.sqs",
      "mtrl_worker", "mtrl_trainer", "mtrl_operator.adapters", "mtrl_operator.controllers",
      "mtrl_operator.handlers", "mtrl_operator.main", "mtrl_operator.leader")


@pytest.mark.parametrize("path", _modules(OPERATOR / "reconcile"),
                         ids=lambda p: str(p.relative_to(OPERATOR)))
def test_reconcile_decides_and_does_nothing_else(path: Path) -> None:
    found = _uses(imports(path), *IO)
    assert not found, f"{path.relative_to(OPERATOR)} imports {sorted(found)}"


@pytest.mark.parametrize("path", _modules(OPERATOR / "adapters"),
                         ids=lambda p: str(p.relative_to(OPERATOR)))
def test_adapters_sit_below_the_controllers(path: Path) -> None:
    found = _uses(imports(path), "mtrl_operator.controllers", "mtrl_operator.handlers")
    assert not found, f"{path.relative_to(OPERATOR)} imports {sorted(found)}"


DATA_PLANE = [p for package in ("trainer", "worker", "rollout", "api")
              for p in _modules(REPO / package)]


@pytest.mark.parametrize("path", DATA_PLANE, ids=lambda p: str(p.relative_to(REPO)))
def test_the_data_plane_and_the_api_never_import_the_operator(path: Path) -> None:
    assert not _uses(imports(path), "mtrl_operator"), f"{path.relative_to(REPO)}"


@pytest.mark.parametrize("path", _modules(OPERATOR), ids=lambda p: str(p.relative_to(OPERATOR)))
def test_the_operator_never_imports_the_data_plane_it_runs(path: Path) -> None:
    found = _uses(imports(path), "mtrl_worker", "mtrl_trainer")
    assert not found, f"{path.relative_to(OPERATOR)} imports {sorted(found)}"


def test_the_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from lightkube.core.exceptions import ApiError\nimport mtrl_operator\n"
                      "def f():\n    from importlib.metadata import entry_points\n")
    assert _uses(imports(module), *IO) == {"lightkube.core.exceptions",
                                           "lightkube.core.exceptions.ApiError",
                                           "importlib.metadata",
                                           "importlib.metadata.entry_points"}
    assert _uses(imports(module), *TRANSPORTS) == {"lightkube.core.exceptions",
                                                   "lightkube.core.exceptions.ApiError"}
    assert _uses(imports(module), "mtrl_operator") == {"mtrl_operator"}
