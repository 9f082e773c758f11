"""Both decoders on tiny random-weight models of each architecture, against an eager reference.

The reference is greedy decoding with a full `model(...)` forward of the whole sequence at every
token (transformers' eager attention, no cache). Greedy tokens must be equal and per-token
logprobs within 1e-4 (fp32 on CPU). Initialiser range 0.2 makes the random logits peaked, so a
greedy choice is not decided by float noise.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from mtrl_trainer.decoder import FastDecoder, UnsupportedModel  # noqa: E402
from mtrl_trainer.decoders import make_decoder  # noqa: E402
from mtrl_trainer.general import GeneralDecoder  # noqa: E402
from mtrl_trainer.sampling import SamplingParams  # noqa: E402

VOCAB = 101
COMMON = {"vocab_size": VOCAB, "hidden_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 512,
          "initializer_range": 0.2, "tie_word_embeddings": False}
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "llama": {"intermediate_size": 128},
    "qwen2": {"intermediate_size": 128},  # q/k/v biases
    "qwen3": {"intermediate_size": 128, "head_dim": 32},  # per-head q/k norms
    "mistral": {"intermediate_size": 128, "sliding_window": 6},
    "mixtral": {"intermediate_size": 64, "num_local_experts": 4, "num_experts_per_tok": 2},
    "qwen3_moe": {"intermediate_size": 128, "moe_intermediate_size": 32, "num_experts": 4,
                  "num_experts_per_tok": 2, "decoder_sparse_step": 1},
    # Attention sinks, alternating sliding-window / full layers, experts, YaRN rope.
    "gpt_oss": {"intermediate_size": 64, "num_local_experts": 4, "num_experts_per_tok": 2,
                "head_dim": 16, "sliding_window": 6,
                "layer_types": ["sliding_attention", "full_attention"]},
    # Same attribute names as Llama but norms after attention and MLP: fast path must refuse.
    "olmo2": {"intermediate_size": 128},
}
PROMPTS = [[5, 17, 33, 2, 9, 41, 7, 60, 12, 3, 88, 19], [70, 4], [11, 23, 5, 99, 64, 31, 8]]
BUDGETS = [10, 7, 12]
GREEDY = SamplingParams(temperature=0.0)


def tiny(model_type: str) -> Any:
    config = transformers.AutoConfig.for_model(model_type, **COMMON, **ARCHITECTURES[model_type])
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(
        config, dtype=torch.float32, attn_implementation="eager")
    return model.eval()


def reference(model: Any, prompt: list[int], budget: int) -> tuple[list[int], list[float]]:
    ids = list(prompt)
    tokens, logprobs = [], []
    with torch.no_grad():
        for _ in range(budget):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
            token = int(torch.argmax(logits))
            tokens.append(token)
            logprobs.append(float(torch.log_softmax(logits, -1)[token]))
            ids.append(token)
    return tokens, logprobs


def assert_matches(model: Any, outs: list[Any], prompts: list[list[int]], budgets: list[int]) -> None:
    for prompt, budget, out in zip(prompts, budgets, outs, strict=True):
        tokens, logprobs = reference(model, prompt, budget)
        assert out.token_ids == tokens
        assert out.logprobs == pytest.approx(logprobs, abs=1e-4)


FAST = [t for t in ARCHITECTURES if t != "olmo2"]


@pytest.mark.parametrize("model_type", FAST)
def test_fast_decoder_matches_eager_reference(model_type: str) -> None:
    model = tiny(model_type)
    # Two rows for three prompts: the third is admitted when a row frees (continuous batching).
    decoder = FastDecoder(model, rows=2, max_length=64, sync_every=3)
    outs = decoder.generate(PROMPTS, BUDGETS, GREEDY)
    assert_matches(model, outs, PROMPTS, BUDGETS)


@pytest.mark.parametrize("model_type", list(ARCHITECTURES))
def test_general_decoder_matches_eager_reference(model_type: str) -> None:
    model = tiny(model_type)
    outs = GeneralDecoder(model, rows=4, max_length=64).generate(PROMPTS, BUDGETS, GREEDY)
    assert_matches(model, outs, PROMPTS, BUDGETS)


def test_unsupported_architecture_goes_to_the_general_decoder() -> None:
    model = tiny("olmo2")
    with pytest.raises(UnsupportedModel):
        FastDecoder(model)
    assert isinstance(make_decoder(model), GeneralDecoder)
    assert isinstance(make_decoder(tiny("gpt_oss")), FastDecoder)


@pytest.mark.parametrize("model_type", ["qwen2", "gpt_oss"])
def test_next_turn_reuses_the_cached_prefix(model_type: str) -> None:
    """Turn 2's prompt = turn 1's prompt + completion + environment text: only the new tokens
    are prefilled, and the result is what a cold decode gives."""
    model = tiny(model_type)
    decoder = FastDecoder(model, rows=2, max_length=96, sync_every=4)
    prompt1 = PROMPTS[0]
    [first] = decoder.generate([prompt1], [9], GREEDY, keys=["episode-1"])
    prompt2 = prompt1 + first.token_ids + [44, 45, 46, 47]
    [second] = decoder.generate([prompt2], [9], GREEDY, keys=["episode-1"])
    assert second.reused_tokens == len(prompt1) + len(first.token_ids) - 1
    assert decoder.reused_tokens == second.reused_tokens
    assert_matches(model, [second], [prompt2], [9])
    # After a weight update nothing stale is reused.
    decoder.invalidate()
    [again] = decoder.generate([prompt2 + second.token_ids], [3], GREEDY, keys=["episode-1"])
    assert again.reused_tokens == 0


def test_busy_rows_stay_below_parked_prefixes() -> None:
    """A decode step computes every row below the highest busy one (rows 0..n-1, n a power of
    two), so busy rows keep to the low indices: a new episode takes row 0 and the prefix parked
    there moves up; a parked prefix comes down for its episode's next turn, still reused.
    row_steps and active_row_steps (metrics.jsonl's decodeRowOccupancy) count the rows."""
    model = tiny("qwen2")
    decoder = FastDecoder(model, rows=16, max_length=96, sync_every=4)
    first = decoder.generate([PROMPTS[1]] * 9, [8] * 9, GREEDY,
                             keys=[f"episode-{i}" for i in range(9)])

    def play(prompt: list[int], key: str) -> tuple[float, Any]:
        rows, active = decoder.row_steps, decoder.active_row_steps
        [out] = decoder.generate([prompt], [8], GREEDY, keys=[key])
        return (decoder.active_row_steps - active) / (decoder.row_steps - rows), out

    occupancy, another = play(PROMPTS[2], "another")
    assert occupancy == 1 / 8  # in row 0 (1/16 in row 9, above nine parked prefixes)
    # episode-0's prefix moved out of row 0; "another" is parked there now: they swap.
    for key, before, out in (("episode-0", PROMPTS[1], first[0]), ("another", PROMPTS[2], another)):
        prompt = before + out.token_ids + [44, 45]
        occupancy, turn = play(prompt, key)
        assert occupancy == 1 / 8
        assert turn.reused_tokens == len(before) + len(out.token_ids) - 1
        assert_matches(model, [turn], [prompt], [8])  # the moved keys and values are right
    # The general decoder computes a batch's finished rows until its last one ends.
    general = GeneralDecoder(tiny("qwen2"), rows=2, max_length=96)
    general.generate(PROMPTS[:2], [2, 8], GREEDY)
    assert (general.row_steps, general.active_row_steps) == (14, 8)


def test_parked_prefixes_move_down_and_the_least_recently_used_is_evicted() -> None:
    """A prefix comes down to a free low row for its next turn (moved, not swapped); with every
    row taken, a new episode evicts the least recently used prefix and keeps the others."""
    model = tiny("qwen2")

    def next_turn(before: list[int], out: Any) -> list[int]:
        return before + out.token_ids + [44, 45]

    decoder = FastDecoder(model, rows=4, max_length=96, sync_every=4)
    [a] = decoder.generate([PROMPTS[0]], [6], GREEDY, keys=["a"])  # row 0
    [b] = decoder.generate([PROMPTS[1]], [6], GREEDY, keys=["b"])  # row 0; a moves up to row 3
    prompts = [next_turn(PROMPTS[1], b), next_turn(PROMPTS[0], a)]
    turns = decoder.generate(prompts, [6, 6], GREEDY, keys=["b", "a"])  # b stays, a to row 1
    assert [t.reused_tokens for t in turns] == [len(p) - 3 for p in prompts]
    assert_matches(model, turns, prompts, [6, 6])

    decoder = FastDecoder(model, rows=2, max_length=96, sync_every=4)
    [a] = decoder.generate([PROMPTS[0]], [6], GREEDY, keys=["a"])
    [b] = decoder.generate([PROMPTS[1]], [6], GREEDY, keys=["b"])
    decoder.generate([PROMPTS[2]], [6], GREEDY, keys=["c"])  # evicts a, the oldest
    prompts = [next_turn(PROMPTS[1], b), next_turn(PROMPTS[0], a)]
    [b2] = decoder.generate(prompts[:1], [6], GREEDY, keys=["b"])
    [a2] = decoder.generate(prompts[1:], [6], GREEDY, keys=["a"])  # evicts c, not b (used since)
    assert (b2.reused_tokens, a2.reused_tokens) == (len(prompts[0]) - 3, 0)
    assert_matches(model, [b2, a2], prompts, [6, 6])
    [b3] = decoder.generate([next_turn(prompts[0], b2)], [6], GREEDY, keys=["b"])
    assert b3.reused_tokens == len(prompts[0]) + len(b2.token_ids) - 1


@pytest.mark.parametrize("model_type", ["qwen2", "gpt_oss"])
def test_a_group_s_shared_prompt_is_prefilled_once(model_type: str) -> None:
    """GRPO's group: the same first prompt several times, admitted together. One is prefilled in
    full; the others copy its keys and values and prefill one token. A prompt that shares only a
    head (a system prompt) copies that much; one that shares too little copies nothing. Every
    result is what a cold decode gives."""
    model = tiny(model_type)
    system = [(7 * i) % VOCAB for i in range(1, 25)]  # 24 tokens every prompt starts with
    task = [*system, 3, 14, 15, 92, 65, 35, 89, 79]
    other = [*system, 27, 18, 28]
    short = [*system[:10], 50, 51]  # shares 10 < MIN_SHARED tokens
    prompts = [task] * 4 + [other, short]
    decoder = FastDecoder(model, rows=8, max_length=96, sync_every=4)
    outs = decoder.generate(prompts, [6] * 6, GREEDY, keys=[f"e{i}" for i in range(6)])
    assert_matches(model, outs, prompts, [6] * 6)
    assert [o.reused_tokens for o in outs] == [0] + [len(task) - 1] * 3 + [len(system), 0]
    assert decoder.shared_tokens == 3 * (len(task) - 1) + len(system)
    assert decoder.prefilled_tokens == len(task) + 3 + (len(other) - len(system)) + len(short)
    # A later episode of the same task copies from a parked row, and its own next turn still
    # reuses its own prefix.
    [late] = decoder.generate([task], [6], GREEDY, keys=["late"])
    assert late.reused_tokens == len(task) - 1
    turn2 = task + late.token_ids + [44, 45]
    [again] = decoder.generate([turn2], [6], GREEDY, keys=["late"])
    assert again.reused_tokens == len(task) + len(late.token_ids) - 1
    assert_matches(model, [late, again], [task, turn2], [6, 6])
    # Off, nothing is shared.
    plain = FastDecoder(model, rows=8, max_length=96, sync_every=4, share_prompts=False)
    assert [o.token_ids for o in plain.generate(prompts, [6] * 6, GREEDY)] == \
        [o.token_ids for o in outs]
    assert plain.shared_tokens == 0


def test_decoding_stops_with_the_budget_not_the_sync_period() -> None:
    """Rows are handed back every `sync_every` steps, or sooner where a budget ends (at half the
    period at the least): a 12-token completion takes 11 decode steps (prefill samples the
    first) in a pump of 8 and one of 4, not two of 8; one of 9 tokens takes exactly 8."""
    model = tiny("qwen2")
    for budget, steps in ((12, 12), (9, 8), (3, 4)):
        decoder = FastDecoder(model, rows=2, max_length=64, sync_every=8)
        outs = decoder.generate(PROMPTS[:1], [budget], GREEDY)
        assert decoder.steps == steps
        assert_matches(model, outs, PROMPTS[:1], [budget])


def test_sampling_draws_from_the_tempered_distribution() -> None:
    """At temperature 0.7 the reported logprob is log softmax(logits / 0.7) of the drawn token."""
    model = tiny("qwen3")
    params = SamplingParams(temperature=0.7)
    outs = FastDecoder(model, rows=4, max_length=64).generate(
        PROMPTS, BUDGETS, params, generator=torch.Generator().manual_seed(0))
    for prompt, out in zip(PROMPTS, outs, strict=True):
        ids = torch.tensor([prompt + out.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / 0.7
        expected = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt):, None])[:, 0]
        assert out.logprobs == pytest.approx(expected.tolist(), abs=1e-4)


@pytest.mark.slow
def test_the_compiled_step_compiles_once_up_to_the_cache_s_whole_length() -> None:
    """Spans are powers of two capped at the cache's capacity; at the cap the attended slice
    used to be the whole cache, which the compiler specialises on: the first episode that long
    recompiled the step (270 s on an H200 for Qwen2-0.5B shapes). Greedy tokens also match."""
    from torch._dynamo.utils import counters

    model = tiny("qwen2")
    decoder = FastDecoder(model, rows=4, max_length=200, compile_step=True)
    before = counters["stats"]["unique_graphs"]
    short = decoder.generate(PROMPTS[:1], [4], GREEDY)
    assert counters["stats"]["unique_graphs"] == before + 1
    long = decoder.generate(PROMPTS[:1], [200 - len(PROMPTS[0])], GREEDY)
    assert decoder.capacity == 208 and decoder.steps > 128  # spans 64, 128, then 208: the cap
    assert counters["stats"]["unique_graphs"] == before + 1, "recompiled at a longer span"
    assert short[0].token_ids == long[0].token_ids[:4]
