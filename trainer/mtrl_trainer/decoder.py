"""Batched decoding with a static KV cache for Llama-family decoders (Llama, Qwen2, Qwen3,
Mistral), LoRA adapters included.

Why not `model.generate`: its per-token Python work (logits processors, stopping criteria, cache
bookkeeping) dominates at small models and large batches. Here a decode step is one function of
fixed-shape tensors (token, position, cache slot, key mask) that reuses the model's own modules,
so on CUDA it is compiled once with CUDA graphs (`torch.compile(mode="reduce-overhead")`) and a
step is a single graph replay. Sampling happens inside the step: temperature, optional top-p and
a Gumbel-max draw from noise made outside the graph.

Sequences are left-padded to a common prompt length, so every row writes the same cache slot at
a step; a per-row key mask hides the padding. Rows stop at a stop token or their own token
budget; the batch stops when every row has.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

CHECK_DONE_EVERY = 16  # steps between host syncs that test whether every row has stopped


@dataclass(frozen=True)
class Sampled:
    token_ids: list[int]
    logprobs: list[float]  # log p(token) under softmax(logits / temperature)
    stopped: bool  # ended with a stop token (kept in token_ids)


class UnsupportedModel(TypeError):
    pass


def causal_lm(model: nn.Module) -> nn.Module:
    """The transformers CausalLM (LoRA layers injected) inside DDP and peft wrappers."""
    inner = getattr(model, "module", model)  # DistributedDataParallel
    if hasattr(inner, "get_base_model"):  # peft
        inner = inner.get_base_model()
    if not hasattr(inner, "lm_head") or not hasattr(inner, "model"):
        raise UnsupportedModel(f"{type(inner).__name__} is not a decoder-only causal LM")
    return inner


class StaticCacheDecoder:
    def __init__(self, model: nn.Module, *, compile_step: bool | None = None) -> None:
        self.lm = causal_lm(model)
        body = self.lm.model
        self.layers = list(body.layers)
        self.embed, self.norm, self.rotary = body.embed_tokens, body.norm, body.rotary_emb
        for layer in self.layers:
            attn = layer.self_attn
            if getattr(attn, "sliding_window", None) and getattr(
                self.lm.config, "use_sliding_window", False
            ):
                raise UnsupportedModel("sliding-window attention is not supported")
            for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
                if not hasattr(attn, name):
                    raise UnsupportedModel(f"attention without {name}: {type(attn).__name__}")
        attn0 = self.layers[0].self_attn
        self._rope = sys.modules[type(attn0).__module__].apply_rotary_pos_emb
        self.head_dim = int(attn0.head_dim)
        self.scaling = float(attn0.scaling)
        config = self.lm.config
        self.kv_heads = int(config.num_key_value_heads)
        self.device = self.embed.weight.device
        self.dtype = self.embed.weight.dtype
        use_compile = self.device.type == "cuda" if compile_step is None else compile_step
        self._step: Callable[..., tuple[torch.Tensor, torch.Tensor]] = (
            torch.compile(self._decode_step, mode="reduce-overhead", fullgraph=True)
            if use_compile
            else self._decode_step
        )
        self._cache: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None
        self._key_mask = torch.zeros(0, 0, dtype=torch.bool)
        self._noise = torch.zeros(0, 0)

    # ------------------------------------------------------------------ model pieces

    def _attention(
        self,
        layer: nn.Module,
        index: int,
        hidden: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        slots: torch.Tensor,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        attn = layer.self_attn
        batch, length, _ = hidden.shape
        shape = (batch, length, -1, self.head_dim)
        q = attn.q_proj(hidden).view(shape)
        k = attn.k_proj(hidden).view(shape)
        if hasattr(attn, "q_norm"):  # Qwen3 normalises q and k per head
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)
        v = attn.v_proj(hidden).view(shape).transpose(1, 2)
        q, k = self._rope(q, k, *cos_sin)
        keys, values = self._cache  # type: ignore[misc]
        keys[index].index_copy_(2, slots, k.to(keys[index].dtype))
        values[index].index_copy_(2, slots, v.to(values[index].dtype))
        out = F.scaled_dot_product_attention(
            q, keys[index], values[index], attn_mask=mask, scale=self.scaling, enable_gqa=True
        )
        return attn.o_proj(out.transpose(1, 2).reshape(batch, length, -1))

    def _forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Hidden state of the last position; writes K and V of `tokens` into `slots`."""
        hidden = self.embed(tokens)
        cos_sin = self.rotary(hidden, positions)
        for index, layer in enumerate(self.layers):
            hidden = hidden + self._attention(
                layer, index, layer.input_layernorm(hidden), cos_sin, slots, mask
            )
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.norm(hidden[:, -1])

    def _sample(
        self, hidden: torch.Tensor, noise: torch.Tensor, temperature: float, top_p: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        logits = self.lm.lm_head(hidden).float() / temperature
        logprobs = torch.log_softmax(logits, dim=-1)
        candidates = logprobs
        if top_p < 1.0:
            sorted_lp, order = torch.sort(logprobs, dim=-1, descending=True)
            before = torch.cumsum(sorted_lp.exp(), dim=-1) - sorted_lp.exp()
            drop = torch.zeros_like(before, dtype=torch.bool).scatter(-1, order, before > top_p)
            candidates = logprobs.masked_fill(drop, float("-inf"))
        # Gumbel-max: argmax(log p + G) is a draw from p.
        token = torch.argmax(candidates - torch.log(-torch.log(noise)), dim=-1)
        return token, logprobs.gather(-1, token.unsqueeze(-1)).squeeze(-1)

    def _decode_step(
        self,
        token: torch.Tensor,
        position: torch.Tensor,
        slot: torch.Tensor,
        key_mask: torch.Tensor,
        noise: torch.Tensor,
        temperature: float,
        top_p: float,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        key_mask.index_fill_(1, slot, True)
        hidden = self._forward(token[:, None], position[:, None], slot, key_mask[:, None, None, :])
        return self._sample(hidden, noise, temperature, top_p)

    # ------------------------------------------------------------------ public

    def _allocate(self, batch: int, length: int) -> None:
        """Reuse the buffers when the shape repeats: CUDA graphs read them by address."""
        shape = (batch, self.kv_heads, length, self.head_dim)
        if self._cache is None or tuple(self._cache[0][0].shape) != shape:
            dev = self.device
            self._cache = (
                [torch.zeros(shape, dtype=self.dtype, device=dev) for _ in self.layers],
                [torch.zeros(shape, dtype=self.dtype, device=dev) for _ in self.layers],
            )
            self._key_mask = torch.zeros(batch, length, dtype=torch.bool, device=dev)
            self._noise = torch.zeros(batch, self.lm.lm_head.out_features, device=dev)
            if dev.type == "cuda":
                for tensor in (*self._cache[0], *self._cache[1], self._key_mask, self._noise):
                    torch._dynamo.mark_static_address(tensor)
        # Stale keys need no clearing: the key mask hides every slot not yet written.
        self._key_mask.zero_()

    def _uniform(self, generator: torch.Generator | None) -> torch.Tensor:
        # Strictly inside (0, 1) so the Gumbel transform stays finite.
        return self._noise.uniform_(1e-10, 1 - 1e-7, generator=generator)

    @torch.inference_mode()
    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: Sequence[int],
        *,
        stop_token_ids: frozenset[int],
        temperature: float = 1.0,
        top_p: float = 1.0,
        generator: torch.Generator | None = None,
        pad_batch_to: int | None = None,
        pad_length_to: int = 1,
    ) -> list[Sampled]:
        """Sample a completion for every prompt. `pad_batch_to` / `pad_length_to` round the
        shapes up so compiled graphs are reused across calls of slightly different sizes."""
        real = len(prompts)
        batch = max(real, pad_batch_to or real)
        prompt_len = _round_up(max(len(p) for p in prompts), pad_length_to)
        budget = list(max_new_tokens) + [1] * (batch - real)
        steps = max(budget)
        total = _round_up(prompt_len + steps, pad_length_to)
        self._allocate(batch, total)
        dev = self.device
        pads = torch.tensor([prompt_len - len(p) for p in prompts] + [0] * (batch - real), device=dev)
        rows = [[0] * (prompt_len - len(p)) + list(p) for p in prompts]
        rows += [[0] * prompt_len] * (batch - real)
        tokens = torch.tensor(rows, device=dev)
        slots = torch.arange(prompt_len, device=dev)
        positions = (slots[None, :] - pads[:, None]).clamp(min=0)
        key_mask = self._key_mask
        key_mask[:, :prompt_len] = slots[None, :] >= pads[:, None]
        # Causal over the prompt block; padding queries see themselves so no row is all -inf.
        causal = torch.ones(prompt_len, total, dtype=torch.bool, device=dev).tril()
        prefill_mask = (causal[None] & key_mask[:, None, :]) | torch.eye(
            prompt_len, total, dtype=torch.bool, device=dev
        )[None]
        hidden = self._forward(tokens, positions, slots, prefill_mask[:, None])
        token, logprob = self._sample(hidden, self._uniform(generator), temperature, top_p)
        out_tokens = torch.zeros(batch, steps, dtype=torch.long, device=dev)
        out_logprobs = torch.zeros(batch, steps, device=dev)
        out_tokens[:, 0], out_logprobs[:, 0] = token, logprob
        stop_ids = torch.tensor(sorted(stop_token_ids), device=dev)
        limits = torch.tensor(budget, device=dev)
        done = torch.isin(token, stop_ids) | (limits <= 1)
        position = positions[:, -1] + 1
        slot = torch.tensor([prompt_len], device=dev)
        for t in range(1, steps):
            token, logprob = self._step(
                token, position, slot, key_mask, self._uniform(generator), temperature, top_p
            )
            out_tokens[:, t], out_logprobs[:, t] = token, logprob
            done = done | torch.isin(token, stop_ids) | (limits <= t + 1)
            position, slot = position + 1, slot + 1
            if t % CHECK_DONE_EVERY == 0 and bool(done[:real].all()):
                break
        return [_trim(out_tokens[i].tolist(), out_logprobs[i].tolist(), budget[i], stop_token_ids)
                for i in range(real)]


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _trim(tokens: list[int], logprobs: list[float], budget: int, stops: frozenset[int]) -> Sampled:
    tokens, logprobs = tokens[:budget], logprobs[:budget]
    for i, token in enumerate(tokens):
        if token in stops:
            return Sampled(tokens[: i + 1], logprobs[: i + 1], True)
    return Sampled(tokens, logprobs, False)
