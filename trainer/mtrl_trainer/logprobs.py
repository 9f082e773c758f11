"""Log-probabilities of the trained tokens only, in chunks: peak memory flat in vocabulary size.

A full `model(...).logits` is [B, T, V]: with Qwen2's 151,936-token vocabulary, 8,192 tokens and
fp32 for the softmax that is 5 GB per copy per micro-batch, mostly for prompt and environment
tokens whose logprobs nobody uses. Here the model body gives hidden states, the positions whose
next token is trained are gathered, and the output head plus log-softmax run on chunks of them
small enough that a chunk's logits stay under `LOGIT_BUDGET` elements. Each chunk is
checkpointed: backward recomputes its logits instead of keeping them.

Rows that begin with the same tokens (a group's games all open with the same prompt: the
rules and the example game, 263 of a `guess` game's ~450 tokens) share them: the model body runs
that prefix once, its keys and values are repeated for each row, and only the rows' own tokens
run on top (`shared_prefixes`). A position's hidden state depends on the tokens up to it alone,
so this is the same computation, and the gradient through the repeated keys and values sums
over the rows, as the rows' separate forwards would. Under gradient checkpointing the layers
cannot keep a cache (their backward would replay the write), so every row runs whole there.

`SequenceLogprobs` is an `nn.Module` so that DistributedDataParallel can wrap it: DDP's gradient
all-reduce is prepared in the wrapped module's forward, so the whole computation goes through it.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

LOGIT_BUDGET = 1 << 24  # elements of fp32 logits alive per chunk (64 MiB)
# Output-head post-processing some models apply to their logits (Gemma 2/3, Cohere, Granite):
# the chunked head would not reproduce it, so these models take the full-logits path.
LOGIT_PROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling")
MIN_SHARED_PREFIX = 32  # tokens: rows sharing fewer run whole


def shared_prefixes(rows: Sequence[Sequence[int]],
                    min_shared: int = MIN_SHARED_PREFIX) -> list[tuple[list[int], int]]:
    """The rows (token ids without padding) in groups that begin alike, each with the length of
    the prefix its rows share, at least `min_shared` and short of every row's end (each row
    keeps a token of its own); a row that shares less with every earlier group is a group of
    one, with prefix 0. Greedy, in row order: a group's rows are usually a GRPO group's games."""
    groups: list[tuple[list[int], list[int]]] = []  # (members, [shared])
    for i, row in enumerate(rows):
        for members, shared in groups:
            leader = rows[members[0]]
            n, limit = 0, min(shared[0], len(row) - 1)
            while n < limit and row[n] == leader[n]:
                n += 1
            if n >= min_shared:
                members.append(i)
                shared[0] = n
                break
        else:
            groups.append(([i], [len(row) - 1]))
    return [(members, shared[0] if len(members) > 1 else 0) for members, shared in groups]


class SequenceLogprobs(nn.Module):
    def __init__(self, policy: nn.Module, logit_budget: int = LOGIT_BUDGET) -> None:
        super().__init__()
        self.policy = policy  # the peft model (LoRA adapter inside)
        self.logit_budget = logit_budget

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, where: torch.Tensor,
        temperature: float,
    ) -> torch.Tensor:
        """[B, T]: log p(token t | tokens < t) at `temperature` where `where` [B, T] is nonzero,
        0 elsewhere (position 0 always 0)."""
        from mtrl_trainer.decoder import causal_lm

        lm = causal_lm(self.policy)
        if any(getattr(lm.config, name, None) for name in LOGIT_PROCESSING):
            return full_logprobs(self.policy, input_ids, attention_mask, temperature)
        body = getattr(lm, lm.base_model_prefix)
        hidden = self.hidden_states(body, input_ids, attention_mask)
        rows, cols = where[:, 1:].nonzero(as_tuple=True)
        if rows.numel() == 0:
            # Keep the graph connected so every data-parallel rank reduces the same gradients.
            rows, cols = rows.new_zeros(1), cols.new_zeros(1)
        states = hidden[rows, cols]  # predicts the token at cols + 1
        targets = input_ids[rows, cols + 1]
        head = lm.get_output_embeddings()
        chunk = max(1, self.logit_budget // head.out_features)
        picked = [
            checkpoint(_chunk_logprobs, head, states[i : i + chunk], targets[i : i + chunk],
                       temperature, use_reentrant=False)
            for i in range(0, states.shape[0], chunk)
        ]
        out = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
        return out.index_put((rows, cols + 1), torch.cat(picked)) * (where != 0)

    @staticmethod
    def hidden_states(body: nn.Module, input_ids: torch.Tensor,
                      attention_mask: torch.Tensor) -> torch.Tensor:
        """[B, T, H]: the body's last hidden states, each shared prefix computed once."""
        def whole() -> torch.Tensor:
            return body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

        if any(getattr(m, "gradient_checkpointing", False) for m in body.modules()):
            return whole()  # no cache under checkpointing: nothing to share
        lengths = attention_mask.sum(dim=1).tolist()  # right-padded rows
        groups = shared_prefixes([ids[:n] for ids, n in zip(input_ids.tolist(), lengths,
                                                             strict=True)])
        if all(shared == 0 for _, shared in groups):
            return whole()
        cache_name = "cache" if "cache" in inspect.signature(body.forward).parameters \
            else "past_key_values"  # transformers before 5.2x
        parts, order = [], []
        for members, shared in groups:
            index = torch.tensor(members, device=input_ids.device)
            ids, mask = input_ids[index], attention_mask[index]
            if shared == 0:
                parts.append(body(input_ids=ids, attention_mask=mask).last_hidden_state)
            else:
                prefix = body(input_ids=ids[:1, :shared], use_cache=True)
                cache = getattr(prefix, cache_name)
                cache.batch_repeat_interleave(len(members))  # differentiable: gradients sum
                own = body(input_ids=ids[:, shared:], attention_mask=mask, use_cache=True,
                           **{cache_name: cache}).last_hidden_state
                parts.append(torch.cat(
                    [prefix.last_hidden_state.expand(len(members), -1, -1), own], dim=1))
            order += members
        inverse = torch.argsort(torch.tensor(order, device=input_ids.device))
        return torch.cat(parts)[inverse]


def _chunk_logprobs(
    head: nn.Module, states: torch.Tensor, targets: torch.Tensor, temperature: float
) -> torch.Tensor:
    logits = head(states).float() / temperature
    return logits.gather(-1, targets[:, None])[:, 0] - torch.logsumexp(logits, dim=-1)


def full_logprobs(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor, temperature: float
) -> torch.Tensor:
    """[B, T] from the model's whole logits: every position, position 0 gets 0."""
    logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[:, :-1].float()
    logits = logits / temperature
    targets = input_ids[:, 1:].unsqueeze(-1)
    picked = logits.gather(-1, targets).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    return torch.nn.functional.pad(picked, (1, 0))
