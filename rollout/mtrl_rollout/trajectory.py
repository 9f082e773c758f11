"""Turn records -> training sequences with a loss mask, without ever re-tokenizing.

A multi-turn episode is one sequence when each turn's prompt extends the previous prompt plus
completion (the usual case for chat templates). The tokens between one completion and the next
generation are environment text: mask 0. Completion tokens: mask 1. When a template re-renders
history differently (e.g. it strips earlier reasoning), the prefix breaks and a new sequence
starts, so the trainer still gets exactly the tokens that were sampled.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mtrl_rollout.protocol import TurnRecord


@dataclass
class FlatSequence:
    token_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # 0.0 where loss_mask is 0
    turns: list[int] = field(default_factory=list)
    token_turns: list[int] = field(default_factory=list)  # the turn each token leads to

    def _extend(self, tokens: list[int], trained: bool, logprobs: list[float] | None,
                turn: int) -> None:
        self.token_ids.extend(tokens)
        self.token_turns.extend([turn] * len(tokens))
        self.loss_mask.extend([int(trained)] * len(tokens))
        self.logprobs.extend(logprobs if logprobs is not None else [0.0] * len(tokens))


def flatten(turns: list[TurnRecord]) -> list[FlatSequence]:
    sequences: list[FlatSequence] = []
    for record in sorted(turns, key=lambda t: t.turn):
        current = sequences[-1] if sequences else None
        prompt = record.prompt_token_ids
        if current is None or prompt[: len(current.token_ids)] != current.token_ids:
            current = FlatSequence()
            sequences.append(current)
        current._extend(prompt[len(current.token_ids) :], False, None, record.turn)
        current._extend(record.completion_token_ids, True, record.completion_logprobs, record.turn)
        current.turns.append(record.turn)
    return sequences
