"""The fast decoder: a slot KV cache, continuous batching, per-episode prefix reuse, and one
fixed-shape decode step compiled with CUDA graphs on GPU.

Why not `model.generate`: its per-token Python work (logits processors, stopping criteria, cache
bookkeeping) dominates at small models and large batches. Here a decode step is one function of
fixed-shape tensors that reuses the model's own modules (LoRA layers included), so on CUDA it is
compiled once (`torch.compile(mode="reduce-overhead")`) and a step is a graph replay. Sampling
and the per-row bookkeeping (token budget, stop tokens) happen inside the step; the host looks
at the rows only every `sync_every` steps.

- **Slots.** The cache has `rows` rows; a row's cache index is its token's position (plus one
  leading zero slot for attention sinks), so rows of different lengths decode side by side
  without padding, and a row's keys are valid below its position.
- **Continuous batching.** Between groups of up to `sync_every` steps, finished rows are
  returned and waiting jobs are prefilled into free rows; a batch never waits for its longest
  member. A group ends early (at `sync_every // 2` steps at the least, so at most twice as many
  host syncs) where a row reaches its token budget: a finished row neither waits for the group's
  end to be answered nor holds its place from a waiting job.
- **Prefix reuse.** A finished row is parked under its job's key (the episode): the next turn
  of that episode, whose prompt extends the previous prompt and completion, prefills only the
  new tokens. Parked rows are evicted least recently used, and all of them are dropped when the
  weights change (`invalidate`).
- **Shared prompts.** A job without a prefix of its own copies the cached keys and values of
  the longest prompt prefix (at least `MIN_SHARED` tokens) another row holds, and prefills the
  rest. GRPO plays each task `groupSize` times, so a group's first prompts are identical and
  arrive together: one of them (the leader) is prefilled in full, the others then copy its
  cache and prefill one token each.
- **Attention layout.** Grouped-query heads are folded into the query-length axis
  (`[B, kv_heads, group * T, D]`), so `scaled_dot_product_attention` sees plain multi-head
  attention with a float mask: the layout the fused memory-efficient kernel takes. A boolean
  mask with `enable_gqa=True` makes PyTorch fall back to the math kernel.
- **Architectures.** The decoder layers of Llama, Mistral, Qwen2, Qwen3, Qwen3-MoE, Mixtral and
  GPT-OSS compute `h + attn(norm(h))` then `h + mlp(norm(h))`; that is what this file
  re-implements around the model's own projections, norms, rotary embedding and MLP / experts.
  Sliding-window layers get a windowed mask (`kv > q - window`, as transformers'
  `sliding_window_overlay`); GPT-OSS's attention sinks are a zero key and value at cache index 0
  whose mask value is the head's sink logit, which is exactly `softmax([scores, sink])` with the
  sink column dropped (transformers' `eager_attention_forward` for GPT-OSS). Any other model
  goes to `general.GeneralDecoder`: see `make_decoder`.
"""

from __future__ import annotations

import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from mtrl_trainer.sampling import Job, Sampled, SamplingParams, sample_next, trim

FAST_PATH_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "mixtral", "gpt_oss"})
# Expert routing has data-dependent shapes: these compile with graph breaks, not fullgraph.
MOE_TYPES = frozenset({"qwen3_moe", "mixtral", "gpt_oss"})
# Attention reads config.sliding_window at call time instead of keeping it on the module.
CONFIG_WINDOW_TYPES = frozenset({"mistral", "mixtral"})
MIN_ROWS = 8  # decode-step batch sizes are powers of two from here: few distinct graphs
MIN_SPAN = 64  # attended cache length, likewise
CACHE_SLACK = 16  # cache positions never attended (see _allocate and _forward)
MAX_STOPS = 16
MIN_SHARED = 16  # shortest prompt prefix worth copying from another row


class UnsupportedModel(TypeError):
    pass


def causal_lm(model: nn.Module) -> nn.Module:
    """The transformers CausalLM (LoRA layers injected) inside DDP and peft wrappers."""
    inner = getattr(model, "module", model)  # DistributedDataParallel
    inner = getattr(inner, "policy", inner)  # logprobs.SequenceLogprobs
    if hasattr(inner, "get_base_model"):  # peft
        inner = inner.get_base_model()
    if not hasattr(inner, "get_output_embeddings") or inner.get_output_embeddings() is None:
        raise UnsupportedModel(f"{type(inner).__name__} is not a causal LM with an output head")
    return inner


def fast_path_problem(lm: nn.Module) -> str | None:
    """Why the fast decoder cannot run `lm`, or None if it can."""
    model_type = getattr(lm.config, "model_type", "?")
    if model_type not in FAST_PATH_TYPES:
        return f"model type {model_type!r} is not one the fast decoder implements"
    body = getattr(lm, "model", None)
    for name in ("layers", "embed_tokens", "norm", "rotary_emb"):
        if not hasattr(body, name):
            return f"{type(body).__name__} has no {name}"
    return None


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _capacity(max_length: int, offset: int) -> int:
    """The positions a row can attend: `offset` sink slots and `max_length` tokens, to 16."""
    return _round_up(max_length + offset, 16)


def cache_length(max_length: int, offset: int = 1) -> int:
    """Positions per row in the KV cache: its capacity and CACHE_SLACK (see _allocate). The
    default offset counts a sink slot, so without `offset` this is the most a row can take."""
    return _capacity(max_length, offset) + CACHE_SLACK


def _bucket(value: int, floor: int, cap: int) -> int:
    """The next power of two >= value (at least floor, at most cap)."""
    size = floor
    while size < value:
        size *= 2
    return min(size, cap)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """The length of the longest common prefix: a binary search of slice comparisons, which run
    in C (a token-by-token loop took a tenth of a second per admitted group)."""
    a, b = list(a), list(b)
    low, high = 0, min(len(a), len(b))
    while low < high:
        middle = (low + high + 1) // 2
        if a[:middle] == b[:middle]:
            low = middle
        else:
            high = middle - 1
    return low


@dataclass
class _Row:
    key: str | None
    tokens: list[int]  # prompt, then completion once finished
    prompt_len: int
    reused: int
    job: Job | None  # None once finished (the row is then parked)
    valid: int  # cache indices below `valid` (plus the sink offset) hold these tokens' keys
    upper_pos: int  # an upper bound of the row's position while it decodes
    last_used: int


class FastDecoder:
    def __init__(
        self,
        model: nn.Module,
        *,
        rows: int = 64,
        max_length: int = 2048,
        sync_every: int = 8,
        continuous: bool = True,
        reuse_prefix: bool = True,
        share_prompts: bool = True,
        compile_step: bool | None = None,
    ) -> None:
        self.lm = causal_lm(model)
        problem = fast_path_problem(self.lm)
        if problem:
            raise UnsupportedModel(problem)
        config = self.lm.config
        body = self.lm.model
        self.layers = list(body.layers)
        self.embed, self.norm, self.rotary = body.embed_tokens, body.norm, body.rotary_emb
        self.head = self.lm.get_output_embeddings()
        attn0 = self.layers[0].self_attn
        self._rope = sys.modules[type(attn0).__module__].apply_rotary_pos_emb
        self.head_dim = int(attn0.head_dim)
        self.scaling = float(attn0.scaling)
        self.q_heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads)
        self.group = self.q_heads // self.kv_heads
        model_type = config.model_type
        self.windows: list[int | None] = []
        self.sinks: list[torch.Tensor | None] = []
        for layer in self.layers:
            attn = layer.self_attn
            if model_type in CONFIG_WINDOW_TYPES:
                window = getattr(config, "sliding_window", None)
            else:
                window = getattr(attn, "sliding_window", None)
            self.windows.append(int(window) if window else None)
            self.sinks.append(getattr(attn, "sinks", None))
        self.offset = 1 if any(s is not None for s in self.sinks) else 0
        self.device = self.embed.weight.device
        self.dtype = self.embed.weight.dtype
        self.rows = rows
        self.max_length = max_length
        self.capacity = _capacity(max_length, self.offset)
        self.sync_every = sync_every
        self.continuous = continuous
        self.reuse_prefix = reuse_prefix
        self.share_prompts = share_prompts
        self.params = SamplingParams()
        self.generator: torch.Generator | None = None
        use_compile = self.device.type == "cuda" if compile_step is None else compile_step
        # Dynamic shapes: one compilation serves every (rows, span) bucket; CUDA graphs are
        # still recorded per bucket, and replays need no recompilation.
        self._step = (
            torch.compile(self._decode_step, mode="reduce-overhead" if self.device.type == "cuda"
                          else None, fullgraph=model_type not in MOE_TYPES, dynamic=True)
            if use_compile else self._decode_step
        )
        self._pending: deque[Job] = deque()
        self._slots: list[_Row | None] = [None] * rows
        self._clock = 0
        self.steps = 0  # decode steps run
        self.prefilled_tokens = 0
        self.reused_tokens = 0
        self.shared_tokens = 0  # of them, copied from another row's prompt
        self.prefill_seconds = 0.0  # wall time admitting (on CUDA: launching) prefills
        self.row_steps = 0
        self.active_row_steps = 0
        self._allocate()

    # ------------------------------------------------------------------ state

    def _allocate(self) -> None:
        dev, rows = self.device, self.rows
        # CACHE_SLACK positions past the largest span: a span of the cache's whole length
        # would be a slice that is the whole tensor, which the compiler specialises on, so the
        # first episode to reach it would recompile the step (bench/decoder_recompiles.py).
        shape = (rows, self.kv_heads, cache_length(self.max_length, self.offset), self.head_dim)
        # Zeros matter only at the sink slot (index 0): a zero key and value.
        self._keys = [torch.zeros(shape, dtype=self.dtype, device=dev) for _ in self.layers]
        self._values = [torch.zeros(shape, dtype=self.dtype, device=dev) for _ in self.layers]
        long = {"dtype": torch.long, "device": dev}
        self._token = torch.zeros(rows, **long)
        self._pos = torch.zeros(rows, **long)
        self._count = torch.zeros(rows, **long)
        self._budget = torch.ones(rows, **long)
        self._active = torch.zeros(rows, dtype=torch.bool, device=dev)
        self._out_tokens = torch.zeros(rows, self.max_length, **long)
        self._out_logprobs = torch.zeros(rows, self.max_length, device=dev)
        self._stops = torch.full((MAX_STOPS,), -1, **long)
        self._noise = torch.full((rows, self.head.out_features), 0.5, device=dev)
        if dev.type == "cuda":  # CUDA graphs read these by address
            for tensor in (*self._keys, *self._values, self._token, self._pos, self._count,
                           self._budget, self._active, self._out_tokens, self._out_logprobs,
                           self._stops, self._noise):
                torch._dynamo.mark_static_address(tensor)

    def configure(self, params: SamplingParams, generator: torch.Generator | None = None) -> None:
        if len(params.stop_token_ids) > MAX_STOPS:
            raise ValueError(f"at most {MAX_STOPS} stop tokens")
        self.params, self.generator = params, generator
        stops = sorted(params.stop_token_ids) + [-1] * (MAX_STOPS - len(params.stop_token_ids))
        self._stops.copy_(torch.tensor(stops))

    @property
    def busy(self) -> bool:
        return bool(self._pending) or any(r is not None and r.job is not None for r in self._slots)

    def submit(self, job: Job) -> None:
        if not job.prompt:
            raise ValueError("empty prompt")
        if job.budget < 1 or len(job.prompt) + job.budget > self.max_length:
            raise ValueError(f"prompt {len(job.prompt)} + budget {job.budget} tokens does not fit "
                             f"1..{self.max_length}")
        self._pending.append(job)

    def invalidate(self) -> None:
        """Forget every parked prefix: the weights changed, so their keys and values are stale."""
        for i, row in enumerate(self._slots):
            if row is not None and row.job is None:
                self._slots[i] = None

    def reset(self) -> None:
        """Forget every job and row (after a failure left them in an unknown state)."""
        self._pending.clear()
        self._slots = [None] * self.rows
        self._active.zero_()

    # ------------------------------------------------------------------ model pieces

    def _masks(self, query_pos: torch.Tensor, span: int) -> dict[int | None, torch.Tensor]:
        """Float masks [b, 1, group * t, span] per window size, from each query's cache index."""
        key = torch.arange(span, device=query_pos.device)
        q = query_pos[..., None]  # [b, t, 1]
        allowed = (key <= q) & (key >= self.offset)
        out = {}
        for window in set(self.windows):
            ok = allowed if window is None else allowed & (key > q - window)
            bias = torch.zeros(ok.shape, dtype=self.dtype, device=ok.device).masked_fill(
                ~ok, float("-inf"))
            b, t, s = bias.shape
            out[window] = bias[:, None, None].expand(b, 1, self.group, t, s).reshape(
                b, 1, self.group * t, s)
        return out

    def _attention(
        self, index: int, hidden: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor],
        rows: torch.Tensor, write: torch.Tensor, span: int, decode_rows: int | None,
        mask: torch.Tensor,
    ) -> torch.Tensor:
        attn = self.layers[index].self_attn
        b, t, _ = hidden.shape
        q = attn.q_proj(hidden).view(b, t, self.q_heads, self.head_dim)
        k = attn.k_proj(hidden).view(b, t, self.kv_heads, self.head_dim)
        if hasattr(attn, "q_norm"):  # Qwen3 normalises q and k per head
            q, k = attn.q_norm(q), attn.k_norm(k)
        v = attn.v_proj(hidden).view(b, t, self.kv_heads, self.head_dim)
        q, k = self._rope(q.transpose(1, 2), k.transpose(1, 2), *cos_sin)
        cache_k, cache_v = self._keys[index], self._values[index]
        cache_k[rows[:, None], :, write] = k.transpose(1, 2).to(self.dtype)
        cache_v[rows[:, None], :, write] = v.to(self.dtype)
        if decode_rows is not None:  # the first rows of the cache: a view, no copy
            keys, values = cache_k[:decode_rows, :, :span], cache_v[:decode_rows, :, :span]
        else:
            keys, values = cache_k[rows, :, :span], cache_v[rows, :, :span]
        sinks = self.sinks[index]
        if sinks is not None:
            mask = mask.expand(b, self.kv_heads, self.group * t, span).clone()
            mask.view(b, self.kv_heads, self.group, t, span)[..., 0] = (
                sinks.view(self.kv_heads, self.group, 1).to(mask.dtype))
        q = q.reshape(b, self.kv_heads, self.group * t, self.head_dim)
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scaling)
        out = out.reshape(b, self.q_heads, t, self.head_dim).transpose(1, 2)
        return attn.o_proj(out.reshape(b, t, self.q_heads * self.head_dim))

    def _forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor, span: int,
        decode_rows: int | None, idle: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Hidden states [b, t, H] (before the final norm); writes K and V of every token, those
        of `idle` rows (decode steps compute rows that are not generating) into the slack."""
        query = (positions + self.offset).clamp(max=self.capacity - 1)
        # An idle row may hold a parked prefix, moved there with none of its per-row state:
        # written at its stale position, it would overwrite one of the prefix's keys.
        write = query if idle is None else torch.where(idle[:, None], self.capacity, query)
        hidden = self.embed(tokens)
        cos_sin = self.rotary(hidden, positions)
        masks = self._masks(query, span)
        for index, layer in enumerate(self.layers):
            hidden = hidden + self._attention(
                index, layer.input_layernorm(hidden), cos_sin, rows, write, span, decode_rows,
                masks[self.windows[index]])
            mlp = layer.mlp(layer.post_attention_layernorm(hidden))
            hidden = hidden + (mlp[0] if isinstance(mlp, tuple) else mlp)  # MoE: (out, router)
        return hidden

    def _decode_step(self, n: int, span: int, temperature: float, top_p: float) -> None:
        """One token for the first `n` rows; rows that are not active keep their state and
        their cached keys and values."""
        rows = torch.arange(n, device=self._token.device)
        token, pos = self._token[:n], self._pos[:n]
        active, count = self._active[:n], self._count[:n]
        hidden = self._forward(token[:, None], pos[:, None], rows, span, n, idle=~active)
        logits = self.head(self.norm(hidden[:, -1]))
        new, logprob = sample_next(logits, self._noise[:n], temperature, top_p)
        slot = count.clamp(max=self.max_length - 1)
        self._out_tokens[rows, slot] = torch.where(active, new, self._out_tokens[rows, slot])
        self._out_logprobs[rows, slot] = torch.where(active, logprob, self._out_logprobs[rows, slot])
        self._token[:n] = torch.where(active, new, token)
        step = active.long()
        done = active & (torch.isin(new, self._stops) | (count + step >= self._budget[:n]))
        self._count[:n] = count + step
        self._pos[:n] = pos + step
        self._active[:n] = active & ~done

    # ------------------------------------------------------------------ scheduling

    def _place(self, job: Job) -> tuple[int, int] | None:
        """A row for `job` and how many of its prompt tokens are already cached there.

        A decode step computes every row below the highest busy one, so busy rows are kept at
        the low indices and parked prefixes above them: the job takes the lowest row that is
        not busy. Its own parked prefix comes down to that row; another prefix parked there
        moves up to a free row, or else onto the least recently used prefix (evicting it)."""
        low = next((i for i, row in enumerate(self._slots) if row is None or row.job is None),
                   None)
        if low is None:
            return None
        own = None
        if self.reuse_prefix and job.key is not None:
            own = next((i for i, row in enumerate(self._slots)
                        if row is not None and row.job is None and row.key == job.key), None)
        if own is not None:
            if self._slots[low] is None:
                self._move(own, low)
            elif own != low:
                self._swap(own, low)
            row = self._slots[low]
            assert row is not None
            # At least one token is fed: its logits give the first sampled token.
            return low, min(_common_prefix(row.tokens[: row.valid], job.prompt),
                            len(job.prompt) - 1)
        if self._slots[low] is not None:
            free = [i for i, row in enumerate(self._slots) if row is None]
            if free:
                target = free[-1]
            else:
                _, target = min((row.last_used, i) for i, row in enumerate(self._slots)
                                if row is not None and row.job is None)
            if target != low:
                self._move(low, target)  # onto a free row, or over the oldest prefix
            self._slots[low] = None
        return low, 0

    def _swap(self, a: int, b: int) -> None:
        """Exchange two parked rows: their cached keys and values and slots."""
        for cache in (*self._keys, *self._values):
            held = cache[a].clone()
            cache[a].copy_(cache[b])
            cache[b].copy_(held)
        self._slots[a], self._slots[b] = self._slots[b], self._slots[a]

    def _move(self, source: int, target: int) -> None:
        """Put a parked row's keys, values and slot at `target`, whose own are dropped."""
        for cache in (*self._keys, *self._values):
            cache[target].copy_(cache[source])
        self._slots[target], self._slots[source] = self._slots[source], None

    def _admit(self) -> None:
        if not self.continuous and any(r is not None and r.job is not None for r in self._slots):
            return
        placed: list[tuple[int, Job, int]] = []
        while self._pending:
            spot = self._place(self._pending[0])
            if spot is None:
                break
            job = self._pending.popleft()
            row, reuse = spot
            self._clock += 1
            self._slots[row] = _Row(job.key, list(job.prompt), len(job.prompt), reuse, job,
                                    len(job.prompt), len(job.prompt), self._clock)
            placed.append((row, job, reuse))
        if not placed:
            return
        started = time.perf_counter()
        leaders, followers = self._share(placed)
        if leaders:
            self._prefill(leaders)
        if followers:
            for row, _, shared, donor in followers:
                self._copy_prefix(donor, row, shared)
            self._prefill([(row, job, shared) for row, job, shared, _ in followers])
        self.prefill_seconds += time.perf_counter() - started

    def _share(
        self, placed: list[tuple[int, Job, int]]
    ) -> tuple[list[tuple[int, Job, int]], list[tuple[int, Job, int, int]]]:
        """Split the jobs just placed into those prefilled now (with whatever their rows hold)
        and those that first copy a longer prompt prefix from another row: (row, job, tokens
        copied, donor row). A donor placed in this same batch is prefilled first, as a leader."""
        if not self.share_prompts:
            return placed, []
        now = {row for row, _, _ in placed}
        leaders: list[tuple[int, Job, int]] = []
        leader_rows: set[int] = set()
        followers: list[tuple[int, Job, int, int]] = []
        for row, job, reuse in placed:
            prompt = list(job.prompt)
            best, donor = reuse, None
            candidates = [i for i, r in enumerate(self._slots) if r is not None and i != row
                          and (i not in now or i in leader_rows)]
            for i in candidates:
                other = self._slots[i]
                assert other is not None
                held = other.tokens[: other.valid]
                if held[:MIN_SHARED] != prompt[:MIN_SHARED]:
                    continue
                shared = min(_common_prefix(held, prompt), len(prompt) - 1)
                if shared > best:
                    best, donor = shared, i
            if donor is None or best < reuse + MIN_SHARED:
                leaders.append((row, job, reuse))
                leader_rows.add(row)
            else:
                followers.append((row, job, best, donor))
        return leaders, followers

    def _copy_prefix(self, source: int, target: int, tokens: int) -> None:
        """The first `tokens` cached keys and values of `source` (sink slots too) into `target`."""
        end = self.offset + tokens
        for cache in (*self._keys, *self._values):
            cache[target, :, :end].copy_(cache[source, :, :end])
        row = self._slots[target]
        assert row is not None
        row.reused = tokens
        self.shared_tokens += tokens

    def _prefill(self, placed: list[tuple[int, Job, int]]) -> None:
        dev = self.device
        feeds = [list(job.prompt[reuse:]) for _, job, reuse in placed]
        width = _round_up(max(len(f) for f in feeds), 8)
        tokens = torch.tensor([f + [0] * (width - len(f)) for f in feeds], device=dev)
        starts = torch.tensor([reuse for _, _, reuse in placed], device=dev)
        positions = starts[:, None] + torch.arange(width, device=dev)[None, :]
        rows = torch.tensor([row for row, _, _ in placed], device=dev)
        lengths = torch.tensor([len(f) for f in feeds], device=dev)
        span = _bucket(int(positions.max()) + self.offset + 1, MIN_SPAN, self.capacity)
        hidden = self._forward(tokens, positions, rows, span, None)
        last = hidden[torch.arange(len(placed), device=dev), lengths - 1]
        logits = self.head(self.norm(last))
        params = self.params
        noise = None
        if params.temperature > 0:
            noise = torch.empty(logits.shape, device=dev).uniform_(
                1e-10, 1 - 1e-7, generator=self.generator)
        token, logprob = sample_next(logits, noise, params.temperature, params.top_p)
        budgets = torch.tensor([job.budget for _, job, _ in placed], device=dev)
        self._token[rows] = token
        self._pos[rows] = torch.tensor([len(job.prompt) for _, job, _ in placed], device=dev)
        self._count[rows] = 1
        self._budget[rows] = budgets
        self._out_tokens[rows, 0] = token
        self._out_logprobs[rows, 0] = logprob
        self._active[rows] = ~(torch.isin(token, self._stops) | (budgets <= 1))
        self.prefilled_tokens += sum(len(f) for f in feeds)
        self.reused_tokens += sum(reuse for _, _, reuse in placed)

    @property
    def decoding(self) -> bool:
        """Some admitted job has not finished."""
        return any(r is not None and r.job is not None for r in self._slots)

    @torch.inference_mode()
    def pump(self, admit: bool = True) -> None:
        """Admit waiting jobs (unless told not to), decode up to `sync_every` steps (fewer where
        a row's budget ends sooner), hand back finished rows."""
        if admit:
            self._admit()
        active = [i for i, r in enumerate(self._slots) if r is not None and r.job is not None]
        if not active:
            return
        n = _bucket(max(active) + 1, MIN_ROWS, self.rows)
        rows = [row for i in active if (row := self._slots[i]) is not None and row.job]
        # Decode steps left before the first row's budget runs out (prefill sampled one token).
        fewest = min(r.job.budget - 1 - (r.upper_pos - r.prompt_len) for r in rows if r.job)
        steps = min(self.sync_every, max(self.sync_every // 2, fewest, 1))
        # A step computes rows 0..n-1, idle ones too (counted at the pump's start: reading
        # which rows finish within it would wait for the device).
        self.row_steps += n * steps
        self.active_row_steps += len(active) * steps
        highest = max(r.upper_pos for r in rows)
        span = _bucket(highest + self.offset + steps + 1, MIN_SPAN, self.capacity)
        temperature, top_p = self.params.temperature, self.params.top_p
        for _ in range(steps):
            if temperature > 0:
                self._noise[:n].uniform_(1e-10, 1 - 1e-7, generator=self.generator)
            self._step(n, span, temperature, top_p)
            self.steps += 1
        self._harvest(active, steps)

    def _harvest(self, active: list[int], steps: int) -> None:
        still = self._active[: max(active) + 1].tolist()
        done = [i for i in active if not still[i]]
        for i in active:
            self._slots[i].upper_pos += steps  # type: ignore[union-attr]
        if not done:
            return
        index = torch.tensor(done, device=self.device)
        counts = self._count[index].tolist()
        tokens = self._out_tokens[index].tolist()
        logprobs = self._out_logprobs[index].tolist()
        for i, count, toks, lps in zip(done, counts, tokens, logprobs, strict=True):
            row = self._slots[i]
            assert row is not None and row.job is not None
            job = row.job
            out = trim(toks[:count], lps[:count], self.params.stop_token_ids, row.reused)
            if self.reuse_prefix and row.key is not None:
                # The last sampled token was never fed, so its keys are not in the cache.
                row.tokens = row.tokens + out.token_ids
                row.valid = row.prompt_len + len(out.token_ids) - 1
                row.job = None
            else:
                self._slots[i] = None
            job.finish(out)

    def generate(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: Sequence[int],
        params: SamplingParams,
        *,
        generator: torch.Generator | None = None,
        keys: Sequence[str | None] | None = None,
    ) -> list[Sampled]:
        """Sample a completion for every prompt (all submitted at once) and wait for them."""
        self.configure(params, generator)
        jobs = [Job(p, b, k) for p, b, k in zip(
            prompts, max_new_tokens, keys or [None] * len(prompts), strict=True)]
        for job in jobs:
            self.submit(job)
        while self.busy:
            self.pump()
        return [job.result for job in jobs if job.result is not None]
