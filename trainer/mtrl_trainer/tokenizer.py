"""Chat tokenizers. The trainer owns tokenization: workers send messages, never token ids.

`CharChatTokenizer` is a tiny deterministic character-level tokenizer with a minimal chat
template, for tests and local demos with random models (nothing to download). Every id decodes to
a string that encodes back to the same id, so a multi-turn history re-rendered from decoded text
extends the previous turn's tokens exactly (the trajectory stays one sequence).
`HFChatTokenizer` wraps a Hugging Face tokenizer and its own chat template.
"""

from __future__ import annotations

import string
from collections.abc import Sequence
from typing import Any, Protocol

from mtrl_rollout.protocol import ChatMessage


class ChatTokenizer(Protocol):
    vocab_size: int
    pad_token_id: int
    stop_token_ids: frozenset[int]

    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        """Token ids of `messages` followed by the start of the next assistant message."""
        ...

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of a completion, without a trailing stop token."""
        ...


class CharChatTokenizer:
    """Specials first, then printable ASCII one character per id.

    Template: `<|role|>content<|end|>` per message, then `<|assistant|>`; `<|end|>` ends a turn.
    """

    SPECIALS = ("<|pad|>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>", "<|tool|>")
    ALPHABET = string.printable[:95] + "\n"  # printable ASCII, then newline

    def __init__(self) -> None:
        self._tokens = list(self.SPECIALS) + list(self.ALPHABET)
        self._ids = {t: i for i, t in enumerate(self._tokens)}
        self.vocab_size = len(self._tokens)
        self.pad_token_id = self._ids["<|pad|>"]
        self.end_token_id = self._ids["<|end|>"]
        self.stop_token_ids = frozenset({self.end_token_id})

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        i = 0
        while i < len(text):
            special = next((s for s in self.SPECIALS if text.startswith(s, i)), None)
            if special is not None:
                ids.append(self._ids[special])
                i += len(special)
                continue
            # Characters outside the alphabet become '?': lossy, but never an unknown id.
            ids.append(self._ids.get(text[i], self._ids["?"]))
            i += 1
        return ids

    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        ids: list[int] = []
        for message in messages:
            ids.append(self._ids[f"<|{message.role}|>"])
            ids += self.encode(message.content)
            ids.append(self.end_token_id)
        ids.append(self._ids["<|assistant|>"])
        return ids

    def decode(self, token_ids: Sequence[int]) -> str:
        ids = list(token_ids)
        if ids and ids[-1] in self.stop_token_ids:
            ids = ids[:-1]
        return "".join(self._tokens[i] for i in ids)


class HFChatTokenizer:
    """A Hugging Face tokenizer; the chat template is the model's own."""

    def __init__(self, tokenizer: Any, extra_stop_ids: Sequence[int] = ()) -> None:
        self._tok = tokenizer
        self.vocab_size = len(tokenizer)
        stops = {tokenizer.eos_token_id, *extra_stop_ids} - {None}
        self.stop_token_ids = frozenset(int(t) for t in stops)
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(stops)
        self.pad_token_id = int(pad)

    @property
    def hf(self) -> Any:
        """The Hugging Face tokenizer itself."""
        return self._tok

    def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        rendered = self._tok.apply_chat_template(
            [m.model_dump(exclude_none=True) for m in messages],
            add_generation_prompt=True,
            tokenize=True,
        )
        # transformers 5 returns a BatchEncoding, 4.x a plain list.
        ids = rendered["input_ids"] if hasattr(rendered, "keys") else rendered
        return [int(i) for i in ids]

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(token_ids), skip_special_tokens=True))
