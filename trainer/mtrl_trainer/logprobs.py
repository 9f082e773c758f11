"""Log-probabilities of the trained tokens only, in chunks: peak memory flat in vocabulary size.

A full `model(...).logits` is [B, T, V]: with Qwen2's 151,936-token vocabulary, 8,192 tokens and
fp32 for the softmax that is 5 GB per copy per micro-batch, mostly for prompt and environment
tokens whose logprobs nobody uses. Here the model body gives hidden states, the positions whose
next token is trained are gathered, and the output head plus log-softmax run on chunks of them
small enough that a chunk's logits stay under `LOGIT_BUDGET` elements. Each chunk is
checkpointed: backward recomputes its logits instead of keeping them.

`SequenceLogprobs` is an `nn.Module` so that DistributedDataParallel can wrap it: DDP's gradient
all-reduce is prepared in the wrapped module's forward, so the whole computation goes through it.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

LOGIT_BUDGET = 1 << 24  # elements of fp32 logits alive per chunk (64 MiB)
# Output-head post-processing some models apply to their logits (Gemma 2/3, Cohere, Granite):
# the chunked head would not reproduce it, so these models take the full-logits path.
LOGIT_PROCESSING = ("final_logit_softcapping", "logit_scale", "logits_scaling")


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
        hidden = body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
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
