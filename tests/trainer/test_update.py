"""The update on a tiny random policy: masks, reference KL, and behaviour/recomputed logprobs."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from mtrl_api.run import ModelSpec  # noqa: E402
from mtrl_rollout.protocol import ChatMessage, RolloutResult, TurnRecord  # noqa: E402
from mtrl_trainer.batch import build_rows, pad  # noqa: E402
from mtrl_trainer.decoder import FastDecoder  # noqa: E402
from mtrl_trainer.logprobs import SequenceLogprobs, full_logprobs, shared_prefixes  # noqa: E402
from mtrl_trainer.models import Policy, load_policy  # noqa: E402
from mtrl_trainer.sampling import SamplingParams  # noqa: E402
from mtrl_trainer.update import Diverged, UpdateConfig, step_loss, train_step  # noqa: E402

CPU = torch.device("cpu")


def policy(preset: str = "tiny-qwen2", perturb: bool = True, checkpointing: bool = True) -> Policy:
    spec = ModelSpec.model_validate({"name": f"random:{preset}", "dtype": "float32",
                                     "lora": {"rank": 4, "alpha": 8, "dropout": 0.0},
                                     "gradientCheckpointing": checkpointing})
    p = load_policy(spec, seed=3, device=CPU)
    if perturb:  # a trained-looking adapter, so policy != reference
        gen = torch.Generator().manual_seed(0)
        for name, param in p.model.named_parameters():
            if "lora_B" in name:
                param.data.normal_(0, 0.2, generator=gen)
    p.model.eval()
    return p


def config(beta: float = 0.0) -> UpdateConfig:
    return UpdateConfig(epsilon=0.2, epsilon_high=0.28, beta=beta, temperature=0.7,
                        micro_batches=1)


def two_turn_result(p: Policy, temperature: float = 0.7) -> RolloutResult:
    """A real two-turn episode: turn 2's prompt = turn 1's prompt + completion + user text."""
    decoder = FastDecoder(p.model, rows=2, max_length=256)
    gen = torch.Generator().manual_seed(1)
    messages = [ChatMessage(role="user", content="Say a")]
    turns = []
    for turn in range(2):
        prompt = p.tokenizer.encode_chat(messages)
        out = decoder.generate([prompt], [6], SamplingParams(temperature, 1.0,
                                                             p.tokenizer.stop_token_ids),
                               generator=gen)[0]
        turns.append(TurnRecord(turn=turn, policy_version=0, prompt_token_ids=prompt,
                                completion_token_ids=out.token_ids,
                                completion_logprobs=[min(x, 0.0) for x in out.logprobs],
                                finish_reason="stop" if out.stopped else "length"))
        messages += [ChatMessage(role="assistant", content=p.tokenizer.decode(out.token_ids)),
                     ChatMessage(role="user", content="Again")]
    return RolloutResult(run_id="r", step=0, group_id="g", sample_id="s", policy_version=0,
                         aggregate_reward_score=1.0, metrics_list=[], stop_reason="done",
                         trajectory=turns)


@pytest.mark.parametrize("preset", ["tiny-qwen2", "tiny-llama"])
def test_decoder_logprobs_equal_recomputed_ones(preset: str) -> None:
    """Behaviour logprobs (static-cache decoder, left-padded batch) == the training forward's,
    so the policy ratio is exactly 1 before any update."""
    p = policy(preset)
    prompts = [p.tokenizer.encode_chat([ChatMessage(role="user", content=text)])
               for text in ("hi", "a much longer prompt than the first")]
    outs = FastDecoder(p.model, rows=2, max_length=128).generate(
        prompts, [9, 5], SamplingParams(temperature=0.7), generator=torch.Generator().manual_seed(0))
    assert [len(o.token_ids) for o in outs] == [9, 5]
    for prompt, out in zip(prompts, outs, strict=True):
        ids = torch.tensor([prompt + out.token_ids])
        with torch.no_grad():
            recomputed = full_logprobs(p.model, ids, torch.ones_like(ids), 0.7)[0, len(prompt):]
        assert recomputed.tolist() == pytest.approx(out.logprobs, abs=1e-4)


def test_environment_tokens_are_masked() -> None:
    p = policy()
    result = two_turn_result(p)
    t1, t2 = result.trajectory
    [row] = build_rows([result], [1.0], loss_type="dapo", max_completion_length=12,
                       max_sequence_length=512, micro_batches=1)
    assert row.token_ids == t2.prompt_token_ids + t2.completion_token_ids  # one sequence
    env = len(t2.prompt_token_ids) - len(t1.prompt_token_ids) - len(t1.completion_token_ids)
    assert env > 0
    expected = ([0] * len(t1.prompt_token_ids) + [1] * len(t1.completion_token_ids)
                + [0] * env + [1] * len(t2.completion_token_ids))
    assert row.mask == expected
    assert all(w == 0 for w, m in zip(row.weights, row.mask, strict=True) if not m)
    assert sum(row.weights) == pytest.approx(1.0)  # dapo: 1 / trained tokens each


def test_loss_ignores_environment_tokens_and_starts_at_ratio_one() -> None:
    p = policy()
    result = two_turn_result(p)
    rows = build_rows([result], [1.0], loss_type="dapo", max_completion_length=12,
                      max_sequence_length=512, micro_batches=1)
    sums = step_loss(SequenceLogprobs(p.model), rows, config(), pad_token_id=0, device=CPU,
                     backward=False)
    # Ratio 1 everywhere: the dapo loss is -advantage averaged over trained tokens.
    assert sums.loss == pytest.approx(-1.0, abs=1e-4) and sums.clipped == 0
    assert sums.tokens == sum(rows[0].mask)
    # Absurd behaviour logprobs on environment tokens change nothing (and make no NaN).
    row = rows[0]
    noisy = [lp if m else -1e4 for lp, m in zip(row.old_logprobs, row.mask, strict=True)]
    altered = [type(row)(row.token_ids, row.mask, noisy, row.weights, 1.0, 0)]
    again = step_loss(SequenceLogprobs(p.model), altered, config(beta=0.5), pad_token_id=0, device=CPU,
                      backward=False)
    assert math.isfinite(again.loss)


def test_a_step_whose_gradient_is_not_finite_stops_before_it_updates() -> None:
    """One NaN weight in the adapter (what TRL's step 1 made on an H200, BENCHMARKS.md) gives a
    NaN gradient norm: the step raises Diverged naming it, and no weight moves."""
    p = policy()
    rows = build_rows([two_turn_result(p)], [1.0], loss_type="dapo", max_completion_length=12,
                      max_sequence_length=512, micro_batches=1)
    scorer = SequenceLogprobs(p.model)
    trainable = [q for q in p.model.parameters() if q.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=0.1)
    stats = train_step(scorer, optimizer, rows, config(), pad_token_id=0, device=CPU,
                       step=1, total=3)
    assert math.isfinite(stats.grad_norm)  # the same step, finite, trains
    lora_a = next(q for n, q in p.model.named_parameters() if "lora_A" in n)
    lora_a.data[0, 0] = float("nan")
    before = [q.detach().clone() for q in trainable]
    with pytest.raises(Diverged, match=r"^training diverged: the gradient norm of step 2/3 is "
                                       r"nan; its update was not applied"):
        train_step(scorer, optimizer, rows, config(), pad_token_id=0, device=CPU,
                   step=2, total=3)
    # (an update with NaN gradients would turn every weight NaN, here 0 on the left)
    assert all(torch.equal(a.nan_to_num(), b.nan_to_num())
               for a, b in zip(trainable, before, strict=True))


def test_the_update_differentiates_attention_without_cudnn_s_kernel() -> None:
    """cuDNN's attention backward returns NaN query gradients on H100/H200 for some masked
    batches (update.training_attention): the forward passes a step differentiates run with
    cuDNN's kernel off, and it is on again for the decoder after."""
    p = policy()
    rows = build_rows([two_turn_result(p)], [1.0], loss_type="dapo", max_completion_length=12,
                      max_sequence_length=512, micro_batches=1)
    scorer = SequenceLogprobs(p.model)
    seen: list[bool] = []
    scorer.register_forward_pre_hook(
        lambda *_: seen.append(torch.backends.cuda.cudnn_sdp_enabled()))
    optimizer = torch.optim.AdamW([q for q in p.model.parameters() if q.requires_grad], lr=0.1)
    assert torch.backends.cuda.cudnn_sdp_enabled()
    stats = train_step(scorer, optimizer, rows, config(), pad_token_id=0, device=CPU)
    assert math.isfinite(stats.grad_norm)
    assert seen and not any(seen)
    assert torch.backends.cuda.cudnn_sdp_enabled()


def test_kl_is_zero_with_adapter_disabled_reference_of_an_untrained_adapter() -> None:
    fresh = policy(perturb=False)  # LoRA B = 0: the policy is its own reference
    rows = build_rows([two_turn_result(fresh)], [1.0], loss_type="dapo",
                      max_completion_length=12, max_sequence_length=512, micro_batches=1)
    kl = step_loss(SequenceLogprobs(fresh.model), rows, config(beta=1.0), pad_token_id=0,
                   device=CPU, backward=False).kl
    assert kl == 0.0
    trained = policy(perturb=True)
    rows = build_rows([two_turn_result(trained)], [1.0], loss_type="dapo",
                      max_completion_length=12, max_sequence_length=512, micro_batches=1)
    kl = step_loss(SequenceLogprobs(trained.model), rows, config(beta=1.0), pad_token_id=0,
                   device=CPU, backward=False).kl
    assert kl > 1e-4
    # disable_adapter() is scoped: the adapter is back on afterwards.
    assert trained.model.active_adapter == "default"
    assert any(getattr(m, "disable_adapters", None) is False for m in trained.model.modules())


def test_chunked_logprobs_equal_full_logits_values_and_gradients() -> None:
    """Only trained positions, a few rows of logits at a time: same values and same LoRA
    gradients as the whole [B, T, V] logits."""
    p = policy()
    p.model.train()
    gen = torch.Generator().manual_seed(2)
    ids = torch.randint(0, p.tokenizer.vocab_size, (3, 20), generator=gen)
    attention = torch.ones_like(ids)
    attention[2, 15:] = 0  # a right-padded row
    where = (torch.rand(ids.shape, generator=gen) < 0.5).float() * attention
    weights = torch.rand(ids.shape, generator=gen)

    def grads(values: torch.Tensor) -> list[torch.Tensor]:
        p.model.zero_grad(set_to_none=True)
        (values * where * weights).sum().backward()
        return [q.grad.clone() for q in p.model.parameters() if q.requires_grad]

    full = full_logprobs(p.model, ids, attention, 0.7) * where
    full_grads = grads(full)
    # A budget of 3 rows of logits: 20+ trained positions take several chunks.
    chunked = SequenceLogprobs(p.model, logit_budget=3 * p.tokenizer.vocab_size)(
        ids, attention, where, 0.7)
    assert torch.allclose(chunked, full, atol=1e-5)
    for a, b in zip(grads(chunked), full_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), float((a - b).abs().max())


def test_rows_are_grouped_by_the_prefix_they_share() -> None:
    prompt = list(range(100, 140))
    rows = [[*prompt, 1, 2, 3], list(range(50)), [*prompt, 1, 2], prompt[:35] + [7] * 9,
            [*prompt, 9], list(range(50))]
    assert shared_prefixes(rows, min_shared=32) == [
        ([0, 2, 3, 4], 35),  # the group narrows to what all its rows share
        ([1, 5], 49)]  # equal rows: each keeps its last token
    assert shared_prefixes(rows, min_shared=36) == [([0, 2, 4], 40), ([1, 5], 49), ([3], 0)]
    assert shared_prefixes([prompt], min_shared=8) == [([0], 0)]


@pytest.mark.parametrize("preset", ["tiny-qwen2", "tiny-llama", "tiny-gpt-oss"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_rows_that_share_a_prompt_run_it_once_for_the_same_values_and_gradients(
        preset: str, checkpointing: bool) -> None:
    """A group's games open with the same prompt: the body runs it once and only each row's
    own tokens on top; the logprobs and the LoRA gradients are those of whole rows. Under
    gradient checkpointing (no cache) the rows run whole."""
    gen = torch.Generator().manual_seed(4)
    p = policy(preset, checkpointing=checkpointing)
    p.model.train()
    vocab = p.tokenizer.vocab_size
    prompt = torch.randint(0, vocab, (40,), generator=gen)
    ids = torch.cat([prompt.expand(4, -1), torch.randint(0, vocab, (4, 12), generator=gen)], dim=1)
    ids[3] = torch.randint(0, vocab, (52,), generator=gen)  # a row of another game
    attention = torch.ones_like(ids)
    attention[1, 47:] = 0  # right-padded
    where = (torch.rand(ids.shape, generator=gen) < 0.6).float() * attention
    where[:, :40] = 0  # the prompt is not trained

    def grads(values: torch.Tensor) -> list[torch.Tensor]:
        p.model.zero_grad(set_to_none=True)
        (values * where).sum().backward()
        return [q.grad.clone() for q in p.model.parameters() if q.requires_grad]

    whole = full_logprobs(p.model, ids, attention, 0.7) * where
    whole_grads = grads(whole)
    seen: list[int] = []  # tokens through the embedding
    hook = p.model.get_input_embeddings().register_forward_hook(
        lambda module, args, out: seen.append(args[0].numel()))
    shared = SequenceLogprobs(p.model)(ids, attention, where, 0.7)
    hook.remove()
    assert sum(seen) == (ids.numel() if checkpointing else 40 + 3 * 12 + 52), seen
    assert torch.allclose(shared, whole, atol=1e-5), float((shared - whole).abs().max())
    for a, b in zip(grads(shared), whole_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-4, rtol=1e-4), float((a - b).abs().max())


def test_gradient_checkpointing_keeps_less_for_backward_for_the_same_gradients() -> None:
    """model.gradientCheckpointing (on by default) keeps only each decoder layer's input for
    backward, which recomputes the rest; the loss and the LoRA gradients are unchanged."""
    results = {}
    for checkpointing in (True, False):
        p = policy(checkpointing=checkpointing)
        p.model.train()
        rows = build_rows([two_turn_result(p)], [1.0], loss_type="dapo", max_completion_length=12,
                          max_sequence_length=512, micro_batches=1)
        part = pad(rows, 0, CPU)
        kept: list[int] = []
        with torch.autograd.graph.saved_tensors_hooks(
            lambda t, kept=kept: kept.append(t.numel() * t.element_size()) or t, lambda t: t,
        ):
            SequenceLogprobs(p.model)(part.input_ids, part.attention_mask, part.mask, 0.7)
        p.model.zero_grad(set_to_none=True)
        sums = step_loss(SequenceLogprobs(p.model), rows, config(), pad_token_id=0, device=CPU)
        grads = [q.grad.clone() for q in p.model.parameters() if q.requires_grad]
        results[checkpointing] = sums.loss, grads, sum(kept)
    (loss_on, grads_on, kept_on), (loss_off, grads_off, kept_off) = results[True], results[False]
    assert kept_on * 3 < kept_off, (kept_on, kept_off)
    assert loss_on == pytest.approx(loss_off, abs=1e-6)
    for a, b in zip(grads_on, grads_off, strict=True):
        assert torch.allclose(a, b, atol=1e-6), float((a - b).abs().max())


def test_gpt_oss_policy_samples_and_trains_with_the_default_adapter_targets() -> None:
    """The run spec's default LoRA targets on GPT-OSS (its experts are not nn.Linear: only the
    attention projections get adapters); sampler and trainer agree before the update."""
    p = policy("tiny-gpt-oss")
    result = two_turn_result(p)
    rows = build_rows([result], [1.0], loss_type="dapo", max_completion_length=12,
                      max_sequence_length=512, micro_batches=1)
    sums = step_loss(SequenceLogprobs(p.model), rows, config(), pad_token_id=0, device=CPU)
    assert sums.loss == pytest.approx(-1.0, abs=1e-4) and sums.clipped == 0
    assert sums.gap < 1e-4 * sums.tokens
    grads = [q.grad for q in p.model.parameters() if q.requires_grad]
    assert grads and all(g is not None and torch.isfinite(g).all() for g in grads)
