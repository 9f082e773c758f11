"""Task rows for training and validation, and the order they are played in.

The order is a pure function of (seed, step): each epoch is a seeded permutation, so a resumed
trainer plays exactly the tasks the uninterrupted run would have.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from mtrl_api.environments import known
from mtrl_api.run import DatasetSpec
from mtrl_trainer import s3
from mtrl_trainer.config import ConfigError

Task = dict[str, Any]


@dataclass(frozen=True)
class Tasks:
    train: list[Task]
    validation: list[Task]

    def for_step(self, step: int, count: int, seed: int) -> list[Task]:
        """Tasks of (0-based) `step`: positions step*count ... in the epoch-wise shuffled order."""
        n = len(self.train)
        picked: list[Task] = []
        for position in range(step * count, (step + 1) * count):
            epoch, index = divmod(position, n)
            order = list(range(n))
            random.Random(seed * 1_000_003 + epoch).shuffle(order)
            picked.append(self.train[order[index]])
        return picked

    def extra_for_step(self, step: int, round_: int, count: int, seed: int) -> list[Task]:
        """Tasks of an extra round of dynamic sampling: a seeded draw per (step, round), so a
        resumed run draws the same."""
        return random.Random(f"{seed}/{step}/{round_}").choices(self.train, k=count)


def load_tasks(spec: DatasetSpec, environment: str) -> Tasks:
    if spec.inline is not None:
        return Tasks(list(spec.inline.train), list(spec.inline.validation))
    if spec.s3 is not None:
        validation = (_read_jsonl(spec.s3.validation_uri, "validationUri", environment)
                      if spec.s3.validation_uri else [])
        return Tasks(_read_jsonl(spec.s3.train_uri, "trainUri", environment), validation)
    if spec.generated is not None:
        return _generated(environment, spec.generated.train_size, spec.generated.validation_size)
    raise ValueError("dataset has no source")


def _read_jsonl(uri: str, field: str, environment: str) -> list[Task]:
    """The task rows of a JSON Lines object, each checked against the environment's declared
    task fields (mtrl_api's catalog): a row every worker would refuse stops the run here, with
    its line, before any episode is played."""
    bucket, key = s3.parse_s3_uri(uri)
    body = s3.client().get_object(Bucket=bucket, Key=key)["Body"].read().decode()
    env = known(environment)
    rows = []
    for number, line in enumerate(body.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"spec.dataset.s3.{field}: {uri} line {number} is not JSON: "
                              f"{exc.msg}") from None
        if not isinstance(row, dict):
            raise ConfigError(f"spec.dataset.s3.{field}: {uri} line {number} is not a JSON "
                              "object")
        if env is not None and (problem := env.task_problem(row)) is not None:
            raise ConfigError(f"spec.dataset.s3.{field}: {uri} line {number}: {problem}")
        rows.append(row)
    return rows


def _generated(environment: str, train_size: int, validation_size: int) -> Tasks:
    """Tasks the environment makes itself (`Environment.generate_tasks`)."""
    from mtrl_worker.environments.registry import environment_class

    cls = environment_class(environment)
    train = cls.generate_tasks(train_size, "train")
    if train is None:
        raise ValueError(
            f"environment {environment!r} cannot generate tasks; use dataset.inline or dataset.s3"
        )
    return Tasks(train, cls.generate_tasks(validation_size, "validation") or [])
