"""The one reader of environment variables: names, empty values, aliases, one-line errors."""

from __future__ import annotations

import pytest
from pydantic import AliasChoices, Field

from mtrl_api.settings import InvalidSettings, MtrlSettings


class Example(MtrlSettings):
    url: str = Field(description="required")
    count: int = Field(default=1, gt=0, description="a positive number")
    region: str = Field(default="here", validation_alias=AliasChoices("AWS_REGION", "AWS_DEFAULT_REGION"),
                        description="read from either alias, the first set one")


def test_each_field_is_read_from_its_variable_and_empty_counts_as_unset() -> None:
    example = Example.from_env({"MTRL_URL": "http://q", "MTRL_COUNT": "", "UNRELATED": "x"})
    assert (example.url, example.count, example.region) == ("http://q", 1, "here")
    assert Example.variable("count") == "MTRL_COUNT" and Example.variable("region") == "AWS_REGION"


def test_only_the_upper_case_names_are_read() -> None:
    with pytest.raises(InvalidSettings, match=r"^MTRL_URL is not set$"):
        Example.from_env({"mtrl_url": "http://q", "Mtrl_Url": "http://q"})


def test_aliases_are_read_in_order_and_an_aliased_field_not_by_its_own_name() -> None:
    base = {"MTRL_URL": "u"}
    assert Example.from_env({**base, "AWS_DEFAULT_REGION": "b", "AWS_REGION": "a"}).region == "a"
    assert Example.from_env({**base, "AWS_REGION": "", "AWS_DEFAULT_REGION": "b"}).region == "b"
    assert Example.from_env({**base, "MTRL_REGION": "c"}).region == "here"


def test_every_problem_is_reported_at_once_each_naming_its_variable() -> None:
    with pytest.raises(InvalidSettings) as info:
        Example.from_env({"MTRL_COUNT": "many"})
    assert info.value.problems == [
        "MTRL_URL is not set",
        "MTRL_COUNT: Input should be a valid integer, unable to parse string as an integer"]
    assert str(info.value) == "; ".join(info.value.problems) and "\n" not in str(info.value)


def test_values_set_in_code_are_checked_and_named_alike() -> None:
    with pytest.raises(InvalidSettings, match=r"^MTRL_COUNT: Input should be greater than 0$"):
        Example(url="u", count=0)


def test_an_instance_built_in_code_ignores_the_process_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for variable, value in {"MTRL_URL": "v", "MTRL_COUNT": "7", "AWS_REGION": "there"}.items():
        monkeypatch.setenv(variable, value)
    assert (Example(url="u").count, Example(url="u").region) == (1, "here")
    assert (Example.from_env({"MTRL_URL": "u"}).count, Example.from_env().count) == (1, 7)
