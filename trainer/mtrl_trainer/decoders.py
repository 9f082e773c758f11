"""Which decoder serves a model: the fast one where it implements the architecture, else the
general one (the model's own forward), so no causal LM transformers supports is refused."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

import torch
from torch import nn

from mtrl_trainer.decoder import FastDecoder, causal_lm, fast_path_problem
from mtrl_trainer.general import GeneralDecoder
from mtrl_trainer.sampling import Job, Sampled, SamplingParams

log = logging.getLogger(__name__)


class Decoder(Protocol):
    rows: int
    max_length: int
    steps: int
    prefilled_tokens: int
    prefill_seconds: float  # wall time of prefills (on CUDA, of launching them)
    reused_tokens: int
    row_steps: int  # rows computed, summed over decode steps
    active_row_steps: int  # of them, rows still generating
    params: SamplingParams  # as configured
    generator: torch.Generator | None

    @property
    def busy(self) -> bool: ...

    @property
    def decoding(self) -> bool:
        """Some admitted job is part-way through its completion."""
        ...

    def configure(self, params: SamplingParams, generator: torch.Generator | None = None) -> None: ...

    def submit(self, job: Job) -> None: ...

    def pump(self, admit: bool = True) -> None:
        """Make progress: admit (unless told not to), decode, and finish (call `job.on_done`
        of) some jobs."""
        ...

    def invalidate(self) -> None:
        """The weights changed: drop anything cached from the old ones."""
        ...

    def reset(self) -> None:
        """Forget every job (after a failure)."""
        ...

    def generate(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: Sequence[int],
        params: SamplingParams, *, generator: torch.Generator | None = None,
        keys: Sequence[str | None] | None = None,
    ) -> list[Sampled]: ...


def make_decoder(
    model: nn.Module, *, rows: int = 64, max_length: int = 2048, general: bool = False,
    compile_step: bool | None = None,
) -> Decoder:
    problem = "asked for" if general else fast_path_problem(causal_lm(model))
    if problem is None:
        return FastDecoder(model, rows=rows, max_length=max_length, compile_step=compile_step)
    log.info("general decoder (the model's own forward): %s", problem)
    return GeneralDecoder(model, rows=rows, max_length=max_length)
