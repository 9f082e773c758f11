"""Settings from environment variables: the one way the operator, the workers and the trainer
read theirs (pydantic-settings).

A settings class declares one field per variable: `MTRL_` + the field name in capitals, unless
the field names its variables with a validation alias (the first one found is read); its
description is its help. An empty variable counts as unset. Every bad or missing value is
reported at once, each as `<VARIABLE>: <what is wrong>`, so a misconfigured pod says everything
in one crash-loop message.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Self

from pydantic import AliasChoices, ValidationError
from pydantic_core import ErrorDetails
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)


class InvalidSettings(ValueError):
    """Bad or missing variables, one `<VARIABLE>: <what is wrong>` each, joined by "; "."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class MtrlSettings(BaseSettings):
    """Settings read from the environment by `from_env`, or built in code from arguments."""

    model_config = SettingsConfigDict(env_prefix="MTRL_", env_ignore_empty=True, extra="forbid",
                                      frozen=True)

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise InvalidSettings([self._problem(e) for e in exc.errors()]) from None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """The settings `environ` (default: this process's environment) holds."""
        return cls(**_Environ(cls, os.environ if environ is None else environ)())

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings],
                                   init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Only from_env reads the environment: an instance built in code (a test, a
        # placeholder) holds its arguments and defaults, whatever this process's variables.
        return (init_settings,)

    @classmethod
    def variable(cls, name: str) -> str:
        """The variable field `name` is read from (the first of its aliases)."""
        alias = cls.model_fields[name].validation_alias
        if isinstance(alias, AliasChoices):
            alias = alias.choices[0]
        return alias if isinstance(alias, str) else f"{cls.model_config['env_prefix']}{name.upper()}"

    @classmethod
    def _problem(cls, error: ErrorDetails) -> str:
        """`<VARIABLE>[: <key within its value>]: <what is wrong>`."""
        where = [str(part) for part in error["loc"]]
        if where and where[0] in cls.model_fields:
            where[0] = cls.variable(where[0])  # else already a variable: the alias it came from
        if error["type"] == "missing" and len(where) == 1:
            return f"{where[0]} is not set"
        # A validator's own ValueError is the whole message (pydantic prefixes "Value error, ")
        cause = error.get("ctx", {}).get("error") if error["type"] == "value_error" else None
        return ": ".join([*where, str(cause or error["msg"])])


class _Environ(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping rather than os.environ."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)
        # A field with aliases is read from them alone, even one that code may set by name
        self.config = {**self.config, "populate_by_name": False, "validate_by_name": False}

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # pydantic-settings matches names in lower case; only the upper-case spelling is ours
        return {k.lower(): v for k, v in self._environ.items()
                if k.isupper() and not (self.env_ignore_empty and v == "")}
