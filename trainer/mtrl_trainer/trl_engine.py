"""`spec.trainer.engine: trl`: TRL's GRPOTrainer does the update; the run's workers play.

TRL calls `rollout_func(prompts, trainer)` once per generation batch (one optimizer step here:
`steps_per_generation` is left at `gradient_accumulation_steps`) with each prompt repeated
`num_generations` times in a row, and groups rewards by `view(-1, num_generations)`. Each
prompt is one task row (JSON) of the same per-step order the reference trainer plays
(`Tasks.for_step`), so both engines train on the same tasks at the same step. `rollout_func`
publishes one rollout request per prompt, a group per run of `num_generations`, and waits;
meanwhile this process serves the workers' policy requests with the model TRL trains (the
same `GenerationService` as the reference trainer; transformers on CPU or one GPU). It returns
each episode as TRL wants it: the tokens before the model's first turn as `prompt_ids`, the
rest as `completion_ids` with `env_mask` 0 on the environment's tokens, the sampler's
`logprobs`, and the episode's reward as `reward`, which one reward function hands back.

Everything around the update is the reference trainer's own (`loop.Run`): the model and its
LoRA, the AdamW optimizer (TRL is given it, so a checkpoint restores its state), checkpoints in
the run's S3 folder and resume, validation and pass@k, metrics.jsonl and the progress the
operator reads, episode failures, SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
import time
import warnings
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
from datasets import Dataset
from transformers import PreTrainedTokenizer, PrinterCallback, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from mtrl_rollout.protocol import RolloutResult
from mtrl_rollout.trajectory import flatten
from mtrl_trainer.config import ConfigError
from mtrl_trainer.dataset import Task, load_tasks
from mtrl_trainer.loop import Run, Terminated, most_frequent, nothing_trained
from mtrl_trainer.orchestration import Pending, Rollouts
from mtrl_trainer.progress import ProgressReport
from mtrl_trainer.stats import components, mean_std, success_rate, turn_seconds
from mtrl_trainer.tokenizer import CharChatTokenizer, HFChatTokenizer
from mtrl_trainer.update import MAX_GRAD_NORM, check_finite, training_attention

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass(frozen=True)
class Episode:
    """One episode in TRL's terms."""

    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[int]  # 1 where the policy sampled the token
    logprobs: list[float]
    reward: float


def episode_of(result: RolloutResult | None, pad_id: int, end_id: int) -> Episode:
    """An episode as one prompt and one completion. A missing or failed episode (or one of its
    group's: a group trains whole or not at all) becomes one masked token with reward 0, which
    the caller gives its whole group, so its advantages are 0 and nothing is learned from it.
    Where a chat template re-renders history (the tokens of a later turn do not extend the
    earlier ones), the last sequence is the episode: it holds the whole history, and only its
    own turns are trained."""
    sequences = flatten(result.trajectory) if result is not None else []
    if not sequences or not any(sequences[-1].loss_mask):
        return Episode([pad_id], [end_id], [0], [0.0], 0.0)
    seq = sequences[-1]
    first = seq.loss_mask.index(1)
    return Episode(list(seq.token_ids[:first]), list(seq.token_ids[first:]),
                   list(seq.loss_mask[first:]), [float(x) for x in seq.logprobs[first:]],
                   float(result.aggregate_reward_score) if result is not None else 0.0)


def rollout_output(pending: Pending, rollouts: Rollouts, pad_id: int, end_id: int
                   ) -> dict[str, list[Any]]:
    """`rollout_func`'s answer, in the order of the prompts: the episodes of complete groups
    as played, every other group's as masked placeholders."""
    usable = {r.sample_id: r for r in rollouts.results}
    size = pending.group_size
    episodes: list[Episode] = []
    for start in range(0, len(pending.requests), size):
        members = [usable.get(r.sample_id) for r in pending.requests[start:start + size]]
        if all(m is not None for m in members):
            episodes += [episode_of(m, pad_id, end_id) for m in members]
        else:
            episodes += [episode_of(None, pad_id, end_id)] * size
    return {
        "prompt_ids": [e.prompt_ids for e in episodes],
        "completion_ids": [e.completion_ids for e in episodes],
        "logprobs": [e.logprobs for e in episodes],
        "env_mask": [e.env_mask for e in episodes],
        "reward": [e.reward for e in episodes],
    }


def episode_reward(prompts: list[Any], completions: list[Any], reward: list[float],
                   **_: Any) -> list[float]:
    """TRL's reward function: the reward the worker's environment gave each episode."""
    return list(reward)


def grpo_arguments(spec: Any, steps: int, output_dir: str, *, cpu: bool) -> dict[str, Any]:
    """GRPOConfig's arguments for the run's spec (the same meaning as the reference trainer's
    wherever TRL has the concept; docs/trainer.md, "Engines")."""
    grpo, rollout = spec.grpo, spec.rollout
    completions = grpo.prompts_per_step * grpo.group_size
    if completions % grpo.gradient_accumulation_steps:
        raise ConfigError(
            f"spec.grpo.gradientAccumulationSteps {grpo.gradient_accumulation_steps} must divide "
            f"promptsPerStep x groupSize ({completions}) with trainer.engine trl: TRL's "
            "micro-batches are equal")
    return dict(
        output_dir=output_dir, report_to="none", save_strategy="no", logging_steps=1,
        max_steps=steps, seed=grpo.seed, data_seed=grpo.seed, shuffle_dataset=False,
        num_generations=grpo.group_size,
        per_device_train_batch_size=completions // grpo.gradient_accumulation_steps,
        gradient_accumulation_steps=grpo.gradient_accumulation_steps,
        learning_rate=grpo.learning_rate, lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=0.0, max_grad_norm=MAX_GRAD_NORM,
        beta=grpo.kl_beta, epsilon=grpo.epsilon, epsilon_high=grpo.epsilon_high,
        loss_type=grpo.loss_type, scale_rewards=grpo.scale_rewards,
        temperature=grpo.temperature, top_p=grpo.top_p,
        # dr_grpo's constant: the reference trainer's most completion tokens of an episode
        max_completion_length=grpo.max_new_tokens * rollout.max_turns,
        num_iterations=1, mask_truncated_completions=False,
        # load_policy already set dtype and activation checkpointing as the spec says
        bf16=False, fp16=False, activation_checkpointing=False, use_cpu=cpu,
        remove_unused_columns=False, dataloader_num_workers=0, dataloader_pin_memory=False,
        disable_tqdm=True,
    )


def hf_tokenizer(tokenizer: Any) -> Any:
    """The Hugging Face tokenizer TRL wants for the policy's (it decodes completions for its
    logs and reads the pad and end ids)."""
    if isinstance(tokenizer, HFChatTokenizer):
        return tokenizer.hf
    if isinstance(tokenizer, CharChatTokenizer):
        return _char_tokenizer(tokenizer)
    raise TypeError(f"no Hugging Face tokenizer for {type(tokenizer).__name__}")


def _char_tokenizer(chars: CharChatTokenizer) -> Any:
    class CharTokenizer(PreTrainedTokenizer):  # type: ignore[misc]
        """CharChatTokenizer's ids and text, as transformers' slow-tokenizer interface."""

        def __init__(self) -> None:
            self._tokens = list(chars.SPECIALS) + list(chars.ALPHABET)
            self._ids = {t: i for i, t in enumerate(self._tokens)}
            super().__init__(pad_token="<|pad|>", eos_token="<|end|>")

        @property
        def vocab_size(self) -> int:
            return len(self._tokens)

        def get_vocab(self) -> dict[str, int]:
            return dict(self._ids)

        def _tokenize(self, text: str, **_: Any) -> list[str]:
            return [self._tokens[i] for i in chars.encode(text)]

        def _convert_token_to_id(self, token: str) -> int:
            return self._ids.get(token, self._ids["?"])

        def _convert_id_to_token(self, index: int) -> str:
            return self._tokens[index]

        def convert_tokens_to_string(self, tokens: list[str]) -> str:
            return "".join(tokens)

    return CharTokenizer()


class TrlRun(Run):
    """The reference trainer's run with TRL's GRPOTrainer doing the steps."""

    async def lead(self) -> None:
        if self.world.size > 1:
            raise ConfigError("trainer.engine trl runs one process: set spec.trainer.nodes to 1 "
                              "and gpusPerNode to 0 or 1")
        os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is experimental
        os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")  # TRL's trainers ping the hub
        # TRL toggles checkpointing by transformers 5's deprecated names on every step: the
        # warnings would be the log's last lines, which a killed trainer's message is made of
        warnings.filterwarnings("ignore", r"`\w*checkpointing\w*` is deprecated", FutureWarning)
        spec, grpo = self.config.spec, self.config.spec.grpo
        tasks = load_tasks(spec.dataset, spec.rollout.environment)
        first = self.state.step
        rows = [json.dumps(task) for step in range(first, grpo.max_steps)
                for task in tasks.for_step(step, grpo.prompts_per_step, grpo.seed)]
        async with self.plumbing() as (orchestrator, progress):
            self._loop = asyncio.get_running_loop()
            self._orchestrator, self._tasks, self._progress = orchestrator, tasks, progress
            self._pause = contextlib.ExitStack()
            try:
                if spec.dataset.eval_on_start and tasks.validation and first == 0:
                    await self._evaluate_base(tasks, orchestrator, progress)
                if first < grpo.max_steps:
                    await self._train(rows, grpo.max_steps - first)
                if self._terminated.is_set():
                    raise Terminated()
                if not self.state.trained_steps:
                    raise nothing_trained(grpo.max_steps, self._last_failure,
                                          self._zero_variance_seen)
                progress.succeeded(self.state.step, grpo.max_steps, self.state.trained_steps)
            except Terminated:  # from a wait in TRL's thread, or after the step it finished
                raise Terminated(await self._save_on_termination(progress)) from None

    async def _train(self, rows: list[str], steps: int) -> None:
        """TRL's training loop, in a thread: this one's event loop serves the workers."""
        with tempfile.TemporaryDirectory(prefix="trl-") as scratch:
            trainer = GRPOTrainer(
                model=self.policy.model, reward_funcs=[episode_reward],
                args=GRPOConfig(**grpo_arguments(self.config.spec, steps, scratch,
                                                 cpu=self.device.type == "cpu")),
                train_dataset=Dataset.from_dict({"prompt": rows}),
                processing_class=hf_tokenizer(self.policy.tokenizer),
                rollout_func=self._rollout, callbacks=[_Reports(self)],
                optimizers=(self.optimizer, None),
            )
            trainer.remove_callback(PrinterCallback)  # report() logs each step
            try:
                await asyncio.to_thread(trainer.train)
            finally:
                self._pause.close()

    def _on_loop(self, work: Coroutine[Any, Any, T]) -> T:
        """From TRL's thread: `work` on the run's event loop, and its result."""
        return asyncio.run_coroutine_threadsafe(work, self._loop).result()

    def _await(self, work: Awaitable[T]) -> T:
        """From TRL's thread: `work` on the run's event loop, unless SIGTERM comes first."""
        return self._on_loop(self._interruptible(work))

    def _sample_again(self) -> None:
        """The update is done: the policy server samples with its weights."""
        self._pause.close()
        with self.model_lock:
            self.service.update_policy(self.state.step)

    def _train_next(self) -> None:
        """TRL trains next, until `_sample_again`: no straggler is sampled meanwhile, the model
        is in train mode and attention runs without cuDNN's kernel (update.training_attention)."""
        self._pause.enter_context(self.service.paused())
        self._pause.enter_context(training_attention())
        with self.model_lock:
            self.policy.model.train()

    def _rollout(self, prompts: list[str], trainer: Any) -> dict[str, list[Any]]:
        """TRL's rollout_func: the workers play each prompt's task with the policy as it is."""
        grpo = self.config.spec.grpo
        self._sample_again()
        tasks: list[Task] = [json.loads(p) for p in prompts[::grpo.group_size]]
        started = time.monotonic()
        pending = self._await(self._orchestrator.publish(
            "s", self.state.step, tasks, grpo.group_size, self.state.step))
        rollouts = self._await(self._orchestrator.gather(pending, self.state.step))
        self._played = (rollouts, time.monotonic() - started)
        self._train_next()
        tok = self.policy.tokenizer
        return rollout_output(pending, rollouts, tok.pad_token_id, min(tok.stop_token_ids))

    def check_gradients(self) -> None:
        """Before TRL's optimizer step (after its clipping): `Diverged` on a NaN or infinite
        gradient norm, as the reference trainer stops, so no such update reaches the weights
        (TRL itself would step, log `grad_norm: nan` and sample noise next)."""
        grads = [p.grad.detach().float() for p in self.policy.model.parameters()
                 if p.requires_grad and p.grad is not None]
        norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g)
                                                           for g in grads]))) if grads else 0.0
        check_finite(norm, self.state.step + 1, self.config.spec.grpo.max_steps)

    def report(self, logs: dict[str, float]) -> bool:
        """After each optimizer step (TRL's log of it): progress, validation, checkpoint; True
        once SIGTERM asks to stop."""
        grpo = self.config.spec.grpo
        rollouts, seconds = self._played
        step_s, tokens_sampled, decode_s = self._since_last_report()
        self.state.step += 1
        step = self.state.step
        self._sample_again()  # validation plays with the new weights
        failed = self._judge_failures(step - 1, rollouts)
        rewards = [r.aggregate_reward_score for r in rollouts.results]
        reward_mean, reward_std = mean_std(rewards)
        flat = [len({r.aggregate_reward_score for r in g}) == 1 for g in rollouts.groups]
        # TRL steps its optimizer whatever the advantages; all-zero ones change nothing.
        self.state.trained_steps += flat.count(False) > 0
        self._zero_variance_seen |= any(flat)
        evaluated = self._on_loop(self._validate_if_due(self._tasks, self._orchestrator))
        self.state.history.append({
            "step": step, "attempt": self.config.attempt, "policyVersion": step - 1,
            "rewardMean": reward_mean, "updated": True, "loss": logs.get("loss"),
            "optimizerSteps": self.optimizer_steps, **rollouts.counts.__dict__,
        })
        log.info("step %d/%d reward %.4f loss %s groups %d (zero-variance %d, dropped %d)",
                 step, grpo.max_steps, reward_mean or 0.0, logs.get("loss"),
                 len(rollouts.groups), sum(flat), rollouts.counts.dropped_groups)
        self._progress.report(ProgressReport(
            step=step, total_steps=grpo.max_steps, reward_mean=reward_mean,
            reward_std=reward_std, success_rate=success_rate(rollouts.results),
            zero_variance_fraction=sum(flat) / len(flat) if flat else None,
            validation_success_rate=evaluated.success_rate,
            validation_pass_at_k=evaluated.pass_at_k,
            validation_greedy_success_rate=evaluated.greedy_success_rate,
            tokens_per_second=tokens_sampled / decode_s if decode_s else None,
            components=components(rollouts.results),
            policy_version=step, failed_episode_fraction=failed,
            episode_error=most_frequent(rollouts.errors), trained_steps=self.state.trained_steps,
            training={"engine": "trl", "stepSeconds": round(step_s, 3),
                      "completionTokens": tokens_sampled, "rolloutSeconds": round(seconds, 3),
                      "decodeSeconds": round(decode_s, 3),
                      "turnSeconds": turn_seconds(rollouts.results),
                      **self._decoder_since_last_report(tokens_sampled, decode_s),
                      "failedEpisodes": rollouts.counts.failed,
                      "lateEpisodes": rollouts.counts.late,
                      **{f"trl/{k}": v for k, v in logs.items()}},
        ))
        self._on_loop(self._close_step(self._progress))
        return self._terminated.is_set()


class _Reports(TrainerCallback):  # type: ignore[misc]
    """Before each optimizer step, its gradients are checked; TRL logs each step
    (logging_steps 1) after it is taken: report it."""

    def __init__(self, run: TrlRun) -> None:
        self.run = run

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **_: Any) -> Any:
        self.run.check_gradients()
        return control

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None,
               **_: Any) -> Any:
        if logs and "loss" in logs and self.run.report(logs):
            control.should_training_stop = True
        return control
