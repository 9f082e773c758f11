"""spec.trainer.engine trl: TRL's GRPOTrainer trains, through its rollout_func, on episodes
the real worker plays, and reports as the reference trainer does."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("trl")

from mtrl_api.run import MultiTurnRLRunSpec
from mtrl_rollout.protocol import RolloutRequest, RolloutResult, TurnRecord
from mtrl_trainer.config import ConfigError
from mtrl_trainer.orchestration import Pending, judge, sample_id
from mtrl_trainer.tokenizer import CharChatTokenizer
from mtrl_trainer.trl_engine import (
    TrlRun,
    _Reports,
    episode_of,
    grpo_arguments,
    hf_tokenizer,
    rollout_output,
)
from mtrl_trainer.update import Diverged

from .conftest import TrainingRun, on_engine, run_spec
from .test_learning import STEPS, assert_learned, train

PAD, END = 0, 1


def _turn(turn: int, prompt: list[int], completion: list[int]) -> TurnRecord:
    return TurnRecord(turn=turn, policy_version=0, prompt_token_ids=prompt,
                      completion_token_ids=completion,
                      completion_logprobs=[-0.5] * len(completion), finish_reason="stop")


def _result(request: RolloutRequest, reward: float, turns: list[TurnRecord],
            stop: str = "done") -> RolloutResult:
    return RolloutResult(run_id="r", step=0, group_id=request.group_id,
                         sample_id=request.sample_id, policy_version=0,
                         aggregate_reward_score=reward, metrics_list=[], stop_reason=stop,
                         trajectory=turns)


def test_an_episode_is_its_first_prompt_then_everything_after_with_the_environment_masked(
        ) -> None:
    request = RolloutRequest(run_id="r", step=0, group_id="a-s0-g0", sample_id="a-s0-g0-0",
                             policy_version=0, data={}, max_length=64)
    # turn 0: prompt [5, 6] -> [7, 8]; the environment answers [9]; turn 1: -> [10]
    episode = episode_of(_result(request, 0.75, [_turn(0, [5, 6], [7, 8]),
                                                 _turn(1, [5, 6, 7, 8, 9], [10])]), PAD, END)
    assert episode.prompt_ids == [5, 6]
    assert episode.completion_ids == [7, 8, 9, 10]
    assert episode.env_mask == [1, 1, 0, 1]
    assert episode.logprobs == [-0.5, -0.5, 0.0, -0.5]
    assert episode.reward == 0.75


def test_a_group_with_a_failed_or_missing_episode_is_masked_whole_in_the_prompts_order() -> None:
    requests = [RolloutRequest(run_id="r", step=0, group_id=f"a-s0-g{g}",
                               sample_id=sample_id("a", "s", 0, g, i), policy_version=0,
                               data={}, max_length=64) for g in range(3) for i in range(2)]
    got = {
        requests[0].sample_id: _result(requests[0], 1.0, [_turn(0, [5], [7])]),
        requests[1].sample_id: _result(requests[1], 0.0, [_turn(0, [5], [8, 8])]),
        requests[2].sample_id: _result(requests[2], 1.0, [_turn(0, [5], [7])]),
        requests[3].sample_id: _result(requests[3], 0.0, [_turn(0, [5], [7])], stop="error"),
        requests[4].sample_id: _result(requests[4], 1.0, [_turn(0, [5], [7])]),
        # requests[5] never came back
    }
    rollouts = judge(requests, got, 2, oldest=0)
    out = rollout_output(Pending(requests, 2, 0.0), rollouts, PAD, END)
    assert out["completion_ids"] == [[7], [8, 8], [END], [END], [END], [END]]
    assert out["env_mask"] == [[1], [1, 1], [0], [0], [0], [0]]
    assert out["reward"] == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]  # no spread: no advantage
    assert [len(p) for p in out["prompt_ids"]] == [1] * 6
    assert all(len(lp) == len(c) for lp, c in zip(out["logprobs"], out["completion_ids"],
                                                  strict=True))


def test_the_spec_means_the_same_to_trl() -> None:
    spec = MultiTurnRLRunSpec.model_validate(run_spec("b", gradientAccumulationSteps=4,
                                                      klBeta=0.04, lossType="dr_grpo"))
    args = grpo_arguments(spec, 12, "/tmp/x", cpu=True)
    grpo = spec.grpo
    assert args["num_generations"] == grpo.group_size
    # one generation batch (promptsPerStep x groupSize episodes) is one optimizer step
    assert args["per_device_train_batch_size"] * args["gradient_accumulation_steps"] == \
        grpo.prompts_per_step * grpo.group_size
    assert (args["learning_rate"], args["beta"], args["epsilon"], args["epsilon_high"],
            args["loss_type"], args["scale_rewards"], args["temperature"]) == \
        (grpo.learning_rate, 0.04, grpo.epsilon, grpo.epsilon_high, "dr_grpo", "group",
         grpo.temperature)
    assert args["max_completion_length"] == grpo.max_new_tokens * spec.rollout.max_turns
    assert args["lr_scheduler_type"] == "constant" and args["max_steps"] == 12
    from trl import GRPOConfig

    assert GRPOConfig(**args).steps_per_generation == grpo.gradient_accumulation_steps


def test_micro_batches_that_do_not_divide_a_step_are_a_configuration_error() -> None:
    spec = MultiTurnRLRunSpec.model_validate(run_spec("b", gradientAccumulationSteps=5))
    with pytest.raises(ConfigError, match=r"gradientAccumulationSteps 5 must divide .* \(32\)"):
        grpo_arguments(spec, 12, "/tmp/x", cpu=True)


def test_the_character_tokenizer_decodes_for_trl_as_it_does_for_the_workers() -> None:
    chars = CharChatTokenizer()
    hf = hf_tokenizer(chars)
    ids = chars.encode("move e2e4\n")
    assert hf.batch_decode([[*ids, chars.end_token_id]], skip_special_tokens=True) == \
        [chars.decode(ids)]
    assert (hf.pad_token_id, hf.eos_token_id) == (chars.pad_token_id, chars.end_token_id)


def test_trl_stops_before_an_optimizer_step_whose_gradient_is_not_finite() -> None:
    """TRL steps whatever the gradient (an H200 run logged grad_norm nan at step 1, then died
    sampling at step 2): the engine's callback runs between TRL's clipping and its optimizer
    step, on the model TRL trains, and stops there as the reference trainer does."""
    import torch

    model = torch.nn.Linear(3, 2)
    model.bias.requires_grad_(False)
    run = SimpleNamespace(policy=SimpleNamespace(model=model), state=SimpleNamespace(step=4),
                          config=SimpleNamespace(spec=MultiTurnRLRunSpec.model_validate(
                              on_engine(run_spec("bucket", maxSteps=9), "trl"))))
    run.check_gradients = lambda: TrlRun.check_gradients(run)  # type: ignore[arg-type]
    reports, control = _Reports(run), object()  # type: ignore[arg-type]
    model(torch.ones(1, 3)).sum().backward()
    assert reports.on_pre_optimizer_step(None, None, control) is control
    assert model.weight.grad is not None
    model.weight.grad[1, 2] = float("inf")
    with pytest.raises(Diverged, match=r"^training diverged: the gradient norm of step 5/9 is inf"):
        reports.on_pre_optimizer_step(None, None, control)


def test_trl_trains_without_cudnn_attention_and_the_policy_server_samples_with_it() -> None:
    """cuDNN's attention backward makes NaN query gradients from left padding on an H200
    (update.training_attention): between a rollout and the next, while TRL trains, the
    process's attention has no cuDNN kernel and the policy server is paused; sampling again
    restores both."""
    import contextlib
    import threading

    import torch

    paused: list[bool] = []

    @contextlib.contextmanager
    def pause() -> Any:
        paused.append(True)
        yield
        paused.pop()

    model = torch.nn.Linear(2, 2).eval()
    run = SimpleNamespace(
        _pause=contextlib.ExitStack(), model_lock=threading.Lock(),
        policy=SimpleNamespace(model=model), state=SimpleNamespace(step=3),
        service=SimpleNamespace(paused=pause, update_policy=lambda version: None))
    assert torch.backends.cuda.cudnn_sdp_enabled()
    TrlRun._train_next(run)  # type: ignore[arg-type]
    assert not torch.backends.cuda.cudnn_sdp_enabled() and paused and model.training
    assert torch.backends.cuda.flash_sdp_enabled() and torch.backends.cuda.mem_efficient_sdp_enabled()
    TrlRun._sample_again(run)  # type: ignore[arg-type]
    assert torch.backends.cuda.cudnn_sdp_enabled() and not paused


@pytest.mark.slow
@pytest.mark.aws
def test_reward_rises_with_trl_through_real_worker(training_run: TrainingRun) -> None:
    spec = on_engine(run_spec(training_run.bucket, maxSteps=STEPS), "trl")
    assert_learned(train(training_run, spec))
    metrics = training_run.metrics(spec)
    assert all(m["engine"] == "trl" and m["trl/loss"] is not None for m in metrics), metrics
    validated = [m["step"] for m in metrics if m["validationSuccessRate"] is not None]
    assert validated == [4, 8, STEPS], validated
