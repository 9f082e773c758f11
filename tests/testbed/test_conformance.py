"""`mtrl trainer-check`: both engines keep the trainer contract, and a trainer wrapped in a
shell script that swallows its exit code and SIGTERM is caught, part by part."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

from mtrl_testbed.conformance import check

pytestmark = [pytest.mark.slow, pytest.mark.aws]
PARTS = ["trains", "progress", "episodes", "metrics", "checkpoints", "config-error", "sigterm",
         "resume"]


@pytest.mark.parametrize("engine", ["mtrl", "trl"])
def test_both_engines_keep_the_trainer_contract(aws_env: dict[str, str], tmp_path: Path,
                                                engine: str) -> None:
    parts = check([sys.executable, "-m", "mtrl_trainer"], engine, tmp_path)
    assert [p.name for p in parts] == PARTS
    assert all(p.passed for p in parts), "\n".join(f"{p.name}: {p.detail}" for p in parts)


def test_a_wrapper_that_swallows_exit_codes_and_sigterm_is_caught(aws_env: dict[str, str],
                                                                  tmp_path: Path) -> None:
    """A classic image entrypoint: the shell runs the trainer, maps its exit code, and (as the
    container's first process) ends on SIGTERM without passing it on."""
    wrapper = ["sh", "-c", f"{sys.executable} -m mtrl_trainer; code=$?; "
                           "[ \"$code\" = 2 ] && exit 1; exit $code"]
    parts = {p.name: p for p in check(wrapper, "mtrl", tmp_path)}
    failed = {name for name, p in parts.items() if not p.passed}
    assert failed == {"config-error", "sigterm", "resume"}, parts
    assert parts["config-error"].detail.startswith("exit code 1,")
