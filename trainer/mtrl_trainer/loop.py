"""The training run: resume, then per step play rollouts, update, report, checkpoint."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import math
import random
import signal
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch.nn.parallel import DistributedDataParallel

from mtrl_api import EPISODES_FAILED_PREFIX, NOTHING_TRAINED_PREFIX
from mtrl_rollout.batching import Outbox
from mtrl_rollout.generation import GenerationServer
from mtrl_rollout.offload import Codec
from mtrl_rollout.protocol import GenerateRequest, GenerateResponse, RolloutResult
from mtrl_rollout.ratelimit import TokenBucket
from mtrl_rollout.results import ResultCollector
from mtrl_rollout.sqs import Sqs
from mtrl_trainer import s3
from mtrl_trainer.batch import Row, build_rows
from mtrl_trainer.checkpoint import (
    CheckpointState,
    CheckpointStore,
    capture_rng,
    highest_checkpoint,
    restore_rng,
)
from mtrl_trainer.config import ConfigError, TrainerConfig
from mtrl_trainer.dataset import Tasks, load_tasks
from mtrl_trainer.distributed import World, broadcast, device_for
from mtrl_trainer.evaluation import Evaluation, evaluation, plays
from mtrl_trainer.generation import GenerationService, SamplingConfig
from mtrl_trainer.grpo import group_advantages, turn_advantages
from mtrl_trainer.logprobs import SequenceLogprobs
from mtrl_trainer.models import Policy, load_policy
from mtrl_trainer.orchestration import Orchestrator, Pending, Rollouts, RolloutSettings
from mtrl_trainer.progress import (
    ConfigMapSink,
    EvaluationLog,
    FileSink,
    MetricsHistory,
    Progress,
    ProgressReport,
    ProgressSink,
)
from mtrl_trainer.sampling import SamplingParams
from mtrl_trainer.sharding import Endpoint, ShardRouter, serve_share
from mtrl_trainer.stats import components, mean_std, success_rate, turn_seconds
from mtrl_trainer.update import UpdateConfig, UpdateStats, lora_parameters, train_step

log = logging.getLogger(__name__)
T = TypeVar("T")
MAX_ERROR = 1024  # characters of an episode's error carried in a progress report


class Terminated(Exception):
    """SIGTERM stopped the run; the message says where it stopped and what was saved."""


class EpisodesFailed(Exception):
    """The run's episodes keep failing: the environment's own error, and how often."""


class NothingTrained(EpisodesFailed):
    """Every step played, none updated the adapter: the run cannot report success."""


def nothing_trained(steps: int, failure: str, zero_variance: bool) -> EpisodesFailed:
    """Why a run that played `steps` steps trained nothing: its episodes kept failing (the
    last failing step's words), or every group's rewards were equal (GRPO's advantages are
    all zero then)."""
    if failure:
        return EpisodesFailed(f"{EPISODES_FAILED_PREFIX} the run trained nothing in {steps} "
                              f"steps: {failure}")
    why = ("every group's rewards were equal, so every advantage was zero" if zero_variance
           else "no step had a complete group to train on")
    return NothingTrained(f"{NOTHING_TRAINED_PREFIX} the run played {steps} steps and made no "
                          f"optimizer update: {why}; see status.progress.zeroVarianceFraction")


def most_frequent(errors: list[str]) -> str:
    """The error most episodes of a step reported, with how many did."""
    if not errors:
        return ""
    text, count = Counter(errors).most_common(1)[0]
    return text[:MAX_ERROR] if count == len(errors) else f"{text[:MAX_ERROR]} ({count} times)"


@dataclass(frozen=True)
class Prepared:
    rows: list[Row]
    zero_variance_groups: int
    groups: int
    trained_groups: int = 0


Advantage = float | dict[int, float]  # one per episode, or per turn


def advantages(
    groups: list[list[RolloutResult]], config: TrainerConfig
) -> tuple[list[list[Advantage]], list[bool]]:
    """Each result's advantage, and per group whether it has no learning signal (all its
    advantages are 0). Per turn (advantageLevel: turn) for groups whose every turn has a
    reward, else per episode."""
    grpo = config.spec.grpo
    if not groups:
        return [], []
    rewards = torch.tensor([r.aggregate_reward_score for group in groups for r in group],
                           dtype=torch.float64)
    episode = group_advantages(rewards, grpo.group_size, grpo.scale_rewards)
    out: list[list[Advantage]] = []
    flat: list[bool] = []
    for g, group in enumerate(groups):
        turns = [sorted(r.trajectory, key=lambda t: t.turn) for r in group]
        if grpo.advantage_level == "turn" and all(
                t.reward is not None for episode_turns in turns for t in episode_turns):
            per_turn = turn_advantages([[t.reward or 0.0 for t in ts] for ts in turns],
                                       grpo.scale_rewards)
            out.append([{t.turn: a for t, a in zip(ts, adv, strict=True)}
                        for ts, adv in zip(turns, per_turn, strict=True)])
            flat.append(not any(a for adv in per_turn for a in adv))
        else:
            size = grpo.group_size
            out.append(episode.values[g * size : (g + 1) * size].tolist())
            flat.append(bool(episode.zero_variance[g]))
    return out, flat


def zero_variance(groups: list[list[RolloutResult]], config: TrainerConfig) -> list[bool]:
    """Per group: no learning signal."""
    return advantages(groups, config)[1]


def prepare(rollouts: Rollouts, config: TrainerConfig, micro_batches: int) -> Prepared:
    """Advantages per complete group; zero-variance groups are left out of the update, and at
    most promptsPerStep informative groups are trained on (dynamic sampling may play more)."""
    grpo, spec = config.spec.grpo, config.spec
    if not rollouts.groups:
        return Prepared([], 0, 0)
    values, flat = advantages(rollouts.groups, config)
    kept: list[RolloutResult] = []
    kept_advantages: list[Advantage] = []
    trained = [g for g in range(len(rollouts.groups)) if not flat[g]][: grpo.prompts_per_step]
    for g in trained:
        kept += rollouts.groups[g]
        kept_advantages += values[g]
    rows = build_rows(
        kept, kept_advantages, loss_type=grpo.loss_type,
        max_completion_length=grpo.max_new_tokens * spec.rollout.max_turns,
        max_sequence_length=spec.model.max_sequence_length, micro_batches=micro_batches,
    )
    return Prepared(rows, sum(flat), len(rollouts.groups), len(trained))


def extra_groups(informative: int, complete: int, wanted: int) -> int:
    """Groups to play in the next round of dynamic sampling: the missing informative ones,
    scaled by the share of informative groups so far (all that is wanted when none was), at
    most a step's worth."""
    missing = wanted - informative
    if missing <= 0:
        return 0
    return min(wanted, math.ceil(missing * complete / informative) if informative else wanted)


class Run:
    def __init__(self, config: TrainerConfig, world: World) -> None:
        # One attempt id for every process of this start, rank 0's: sample ids carry it, and
        # each rank's sampler refuses requests of another attempt.
        self.config = config = dataclasses.replace(config, attempt=broadcast(config.attempt,
                                                                             world))
        self.world = world
        spec = config.spec
        self.device = device_for(world, config.device)
        random.seed(spec.grpo.seed)
        torch.manual_seed(spec.grpo.seed)
        self.policy: Policy = load_policy(spec.model, seed=spec.grpo.seed, device=self.device)
        self.optimizer = torch.optim.AdamW(
            lora_parameters(self.policy.model), lr=spec.grpo.learning_rate, weight_decay=0.0
        )
        self.store = CheckpointStore(config.output_uri, spec.output.keep_checkpoints)
        self.state = self._resume()
        if self.state.step:
            self.optimizer.load_state_dict(self.state.optimizer)
            restore_rng(self.state.rng)
        # Wrap after loading: DDP broadcasts rank 0's (restored) weights at construction.
        scorer = SequenceLogprobs(self.policy.model)
        self.model = DistributedDataParallel(scorer) if world.size > 1 else scorer
        self.model_lock = threading.Lock()
        grpo = spec.grpo
        # Every rank samples its share of the episodes (sharding.py).
        self.service = GenerationService(
            self.policy,
            SamplingConfig(grpo.temperature, grpo.top_p, grpo.max_new_tokens,
                           spec.model.max_sequence_length),
            model_lock=self.model_lock, attempt=config.attempt,
            seed=grpo.seed + self.state.step + 1000 * world.rank,
        )
        self.service.policy_version = self.state.step
        self.endpoint = Endpoint.bootstrap(world) if world.size > 1 else None
        # At the previous step's report: wall clock, tokens sampled, seconds decoding. A step's
        # figures run from report to report, so time spent sampling ahead is counted too.
        self._reported_at, self._tokens_at, self._decoding_at = time.monotonic(), 0, 0.0
        self._decoder_at = self._decoder_counters()
        self._terminated = asyncio.Event()  # set by SIGTERM, on rank 0's loop
        self._failing_steps = 0  # in a row: more than maxFailedEpisodeFraction failed
        self._last_failure = ""
        self._zero_variance_seen = False
        self._checkpointed_step = self.state.step
        self._greedy_now = False  # a greedy evaluation plays: rank 0 samples every request
        self.update_config = UpdateConfig(
            epsilon=grpo.epsilon, epsilon_high=grpo.epsilon_high, beta=grpo.kl_beta,
            temperature=grpo.temperature, micro_batches=grpo.gradient_accumulation_steps,
            correction=grpo.rollout_correction.mode,
            correction_threshold=grpo.rollout_correction.threshold,
        )

    def _resume(self) -> CheckpointState:
        """This run's newest checkpoint (a retry of the run); else, when spec.output.resumeFrom
        is set, the highest-step checkpoint under it; else a fresh start."""
        output = self.config.spec.output
        state = self.store.load_latest(self.policy.model)
        if state is not None:
            log.info("resumed from checkpoint at step %d", state.step)
            return state
        if output.resume_from is None:
            return CheckpointState()
        found = highest_checkpoint(output.resume_from)
        if found is None:
            raise ConfigError(f"spec.output.resumeFrom: no committed checkpoint under "
                              f"{output.resume_from}")
        source, _ = found
        try:
            state = CheckpointStore(source, output.keep_checkpoints).load_latest(self.policy.model)
        except RuntimeError as exc:  # an adapter of another shape (rank, target modules, model)
            raise ConfigError(f"spec.output.resumeFrom: the checkpoint in {source} does not fit "
                              f"spec.model: {exc}") from exc
        if state is None:
            raise ConfigError(f"spec.output.resumeFrom: the checkpoint in {source} was deleted "
                              "while this run started")
        if state.step >= self.config.spec.grpo.max_steps:
            raise ConfigError(f"spec.output.resumeFrom: its checkpoint in {source} is at step "
                              f"{state.step}, at or past spec.grpo.maxSteps "
                              f"{self.config.spec.grpo.max_steps}: this run would train "
                              "nothing; raise maxSteps or resume from an earlier checkpoint")
        log.info("resumed from checkpoint at step %d of %s", state.step, source)
        state.trained_steps = 0  # that run's updates are not this run's
        return state

    @property
    def optimizer_steps(self) -> int:
        states = self.optimizer.state.values()
        return int(max((float(s["step"]) for s in states if "step" in s), default=0))

    def _update(self, rows: list[Row], version: int) -> UpdateStats | None:
        """The optimizer step, and the new policy version on this rank's sampler, with no
        completion in flight (same rows and version on every rank)."""
        with self.service.paused(), self.model_lock:
            stats = None
            if rows:
                stats = train_step(
                    self.model, self.optimizer, rows, self.update_config,
                    pad_token_id=self.policy.tokenizer.pad_token_id, device=self.device,
                    rank=self.world.rank, world_size=self.world.size,
                    step=version, total=self.config.spec.grpo.max_steps,
                )
            self.service.update_policy(version)
            return stats

    def follow(self) -> None:
        """Ranks other than 0: sample this rank's share of the episodes (a thread) and train on
        the rows rank 0 broadcasts, step by step."""
        assert self.endpoint is not None
        endpoint, rank, sample = self.endpoint, self.world.rank, self.service.sample
        serving = threading.Thread(target=lambda: asyncio.run(serve_share(endpoint, rank, sample)),
                                   name="share", daemon=True)
        serving.start()
        total = self.config.spec.grpo.max_steps
        for step in range(self.state.step, total):
            self._update(broadcast(None, self.world), step + 1)
            # Every rank logs a step line: HyperPod's log monitoring watches each node's
            # workers, and a node without one would look hung (builders/trainer.py).
            log.info("step %d/%d rank %d", step + 1, total, rank)
        serving.join()  # rank 0 hangs up once the run (and its last validation) is done
        self.service.close()

    @contextlib.asynccontextmanager
    async def plumbing(self) -> AsyncIterator[tuple[Orchestrator, Progress]]:
        """What a leading rank plays through, whichever engine updates: the run's queues, the
        policy server answering the workers, the orchestrator and the progress sinks; SIGTERM
        sets `_terminated`."""
        config, spec = self.config, self.config.spec
        grpo = spec.grpo
        sqs = Sqs()
        codec = Codec(s3=s3.client() if config.payload_bucket else None,
                      bucket=config.payload_bucket, prefix=config.payload_prefix)
        outbox = Outbox(sqs)
        collector = ResultCollector(sqs, config.result_queue_url, config.dlq_url, codec=codec)
        service = self.service
        router = ShardRouter(self.world, service.sample)
        if self.endpoint is not None:
            await router.start(self.endpoint)
        rate = spec.rollout.max_policy_requests_per_second

        async def sample(request: GenerateRequest) -> GenerateResponse:
            # Only rank 0's decoder turns greedy for a greedy evaluation: it serves them all.
            return await (service.sample if self._greedy_now else router.sample)(request)

        server = GenerationServer(sqs, config.generate_queue_url, config.dlq_url, sample,
                                  codec=codec, rate=TokenBucket(rate) if rate else None)
        orchestrator = Orchestrator(RolloutSettings(
            run_id=config.run_id, attempt=config.attempt,
            rollout_queue_url=config.rollout_queue_url, result_queue_url=config.result_queue_url,
            environment=spec.rollout.environment, max_turns=spec.rollout.max_turns,
            max_length=spec.model.max_sequence_length,
            episode_timeout_s=spec.rollout.episode_timeout_seconds,
            collect_grace_s=config.collect_grace_s,
            max_steps_off_policy=grpo.max_steps_off_policy,
            max_episodes_in_flight=spec.rollout.max_episodes_in_flight,
        ), outbox, collector, codec)
        progress = Progress(self._sinks(), attempt=config.operator_attempt,
                            launch=config.operator_launch)
        self._evaluations = EvaluationLog(config.output_uri, self.state.step)
        stop = asyncio.Event()
        serving = asyncio.create_task(server.serve(stop))
        self._reported_at = time.monotonic()
        self._tokens_at, self._decoding_at = service.tokens, service.decode_seconds
        self._decoder_at = self._decoder_counters()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self._terminated.set)
        try:
            yield orchestrator, progress
        finally:
            stop.set()
            await serving
            await router.aclose()
            service.close()
            await collector.aclose()
            await outbox.aclose()
            sqs.close()

    async def lead(self) -> None:
        grpo = self.config.spec.grpo
        tasks = load_tasks(self.config.spec.dataset, self.config.spec.rollout.environment)
        ahead: dict[int, Pending] = {}
        async with self.plumbing() as (orchestrator, progress):
            try:
                if (self.config.spec.dataset.eval_on_start and tasks.validation
                        and self.state.step == 0):
                    await self._evaluate_base(tasks, orchestrator, progress)
                for step in range(self.state.step, grpo.max_steps):
                    # Play ahead: the episodes of the next maxStepsOffPolicy steps are out,
                    # sampled by the policy of the moment, while this step waits and trains.
                    for later in range(step, min(step + grpo.max_steps_off_policy + 1,
                                                 grpo.max_steps)):
                        if later not in ahead:
                            ahead[later] = await orchestrator.publish(
                                "s", later,
                                tasks.for_step(later, grpo.prompts_per_step, grpo.seed),
                                grpo.group_size, self.state.step)
                    await self._step(step, ahead.pop(step), tasks, orchestrator, progress)
                    if self._terminated.is_set():
                        raise Terminated()
                if not self.state.trained_steps:
                    raise nothing_trained(grpo.max_steps, self._last_failure,
                                          self._zero_variance_seen)
                # the last checkpoint is saved
                progress.succeeded(self.state.step, grpo.max_steps, self.state.trained_steps)
            except Terminated:
                raise Terminated(await self._save_on_termination(progress)) from None

    async def _evaluate_base(self, tasks: Tasks, orchestrator: Orchestrator,
                             progress: Progress) -> None:
        """spec.dataset.evalOnStart: the validation split played by the base policy, reported
        as step 0 ("b": its sample ids are apart from the later evaluations')."""
        total = self.config.spec.grpo.max_steps
        result = await self._evaluate("b", 0, tasks, orchestrator)
        log.info("step 0/%d validation success %s before training", total,
                 "-" if result.success_rate is None else f"{result.success_rate:.4f}")
        progress.report(ProgressReport(
            step=0, total_steps=total, reward_mean=None, reward_std=None, success_rate=None,
            zero_variance_fraction=None, validation_success_rate=result.success_rate,
            validation_pass_at_k=result.pass_at_k,
            validation_greedy_success_rate=result.greedy_success_rate,
            tokens_per_second=None, components=[], policy_version=0))

    async def _evaluate(self, kind: str, step: int, tasks: Tasks,
                        orchestrator: Orchestrator) -> Evaluation:
        """The validation split played by the policy of step `step` (0: the base policy): each
        task max(evalPassAtK) times at the run's temperature, then (dataset.evalGreedy) once
        greedily; every play goes to eval.jsonl. `kind` keeps the sample ids apart."""
        dataset, version = self.config.spec.dataset, self.state.step
        ks, first = dataset.eval_pass_at_k, max(step - 1, 0)
        sampled = await self._interruptible(orchestrator.play(
            kind, first, tasks.validation, max(ks), version))
        self._evaluations.add(step, plays(step, "sampled", sampled.results))
        if not dataset.eval_greedy:
            return evaluation(sampled.results, ks, None)
        async with self._greedy():
            greedy = await self._interruptible(orchestrator.play(
                f"{kind}g", first, tasks.validation, 1, version))
        self._evaluations.add(step, plays(step, "greedy", greedy.results))
        return evaluation(sampled.results, ks, greedy.results)

    @contextlib.asynccontextmanager
    async def _greedy(self) -> AsyncIterator[None]:
        """Rank 0's sampler decodes greedily, and serves every request, until the block ends.
        Nothing else is sampled meanwhile: dataset.evalGreedy needs maxStepsOffPolicy 0, and a
        straggler of a step already gathered is never trained on."""
        decoder = self.service.decoder
        params, generator = decoder.params, decoder.generator
        await asyncio.to_thread(self._configure_sampler,
                                dataclasses.replace(params, temperature=0.0), generator)
        self._greedy_now = True
        try:
            yield
        finally:
            self._greedy_now = False
            await asyncio.to_thread(self._configure_sampler, params, generator)

    def _configure_sampler(self, params: SamplingParams, generator: torch.Generator | None
                           ) -> None:
        with self.model_lock:  # the engine holds it while anything decodes
            self.service.decoder.configure(params, generator)

    async def _sample(
        self, step: int, pending: Pending, tasks: Tasks, orchestrator: Orchestrator,
    ) -> tuple[Rollouts, int, int]:
        """The step's rollouts: its published requests, then (dynamic sampling) more rounds
        while it lacks informative groups. Also the rounds played and the groups published."""
        grpo, version = self.config.spec.grpo, self.state.step
        rollouts = await orchestrator.gather(pending, version)
        rounds, groups = 1, len(pending.requests) // grpo.group_size
        while rounds <= grpo.dynamic_sampling_rounds:
            count = extra_groups(sum(not z for z in zero_variance(rollouts.groups, self.config)),
                                 len(rollouts.groups), grpo.prompts_per_step)
            if not count:
                break
            more = await orchestrator.publish(
                "s", step, tasks.extra_for_step(step, rounds, count, grpo.seed), grpo.group_size,
                version, first_group=groups)
            rollouts.extend(await orchestrator.gather(more, version))
            rounds, groups = rounds + 1, groups + count
        return rollouts, rounds, groups

    async def _step(
        self, step: int, pending: Pending, tasks: Tasks, orchestrator: Orchestrator,
        progress: Progress,
    ) -> None:
        grpo = self.config.spec.grpo
        version = self.state.step
        rollouts, rounds, groups = await self._interruptible(
            self._sample(step, pending, tasks, orchestrator))
        failed = self._judge_failures(step, rollouts)
        prepared = prepare(rollouts, self.config, grpo.gradient_accumulation_steps)
        rows = await asyncio.to_thread(broadcast, prepared.rows, self.world)
        update_started = time.monotonic()
        stats = await asyncio.to_thread(self._update, rows, step + 1)
        update_s = time.monotonic() - update_started
        self.state.step = step + 1
        self.state.trained_steps += stats is not None
        self._zero_variance_seen |= prepared.zero_variance_groups > 0
        evaluated = await self._validate_if_due(tasks, orchestrator)
        rewards = [r.aggregate_reward_score for r in rollouts.results]
        reward_mean, reward_std = mean_std(rewards)
        step_s, tokens_sampled, decode_s = self._since_last_report()
        training = {
            "engine": "mtrl",
            "stepSeconds": round(step_s, 3),
            "completionTokens": tokens_sampled,
            "trainedPolicyVersion": version,
            "oldestPolicyVersion": rollouts.oldest_policy_version,
            "staleSamples": rollouts.counts.stale,
            "samplingRounds": rounds,
            "sampledGroups": groups,
            "trainedGroups": prepared.trained_groups,
            # Mean |trainer - sampler logprob| per trained token before the update: near 0 in
            # fp32, bf16 kernels add some; more says the sampler decoded from other keys.
            "logprobGap": float(f"{stats.logprob_gap:.3g}") if stats else None,
            "isWeightMean": stats.is_weight_mean if stats else None,
            "isTruncatedFraction": stats.is_truncated_fraction if stats else None,
            "rolloutSeconds": round(rollouts.seconds, 3),
            "rolloutWaitSeconds": round(rollouts.waited_seconds, 3),
            "updateSeconds": round(update_s, 3),
            "decodeSeconds": round(decode_s, 3),
            "turnSeconds": turn_seconds(rollouts.results),
            **self._decoder_since_last_report(tokens_sampled, decode_s),
            "failedEpisodes": rollouts.counts.failed,
            "lateEpisodes": rollouts.counts.late,
        }
        self.state.history.append({
            "step": self.state.step, "attempt": self.config.attempt, "policyVersion": version,
            "rewardMean": reward_mean, "updated": stats is not None,
            "loss": stats.loss if stats else None, "optimizerSteps": self.optimizer_steps,
            **rollouts.counts.__dict__, "oldestPolicyVersion": rollouts.oldest_policy_version,
        })
        log.info("step %d/%d reward %.4f loss %s groups %d (zero-variance %d, dropped %d, "
                 "stale %d) lag %s waited %.1fs updated %.1fs", self.state.step, grpo.max_steps,
                 reward_mean or 0.0, f"{stats.loss:.4f}" if stats else "-", prepared.groups,
                 prepared.zero_variance_groups, rollouts.counts.dropped_groups,
                 rollouts.counts.stale,
                 "-" if rollouts.oldest_policy_version is None
                 else version - rollouts.oldest_policy_version,
                 rollouts.waited_seconds, update_s)
        progress.report(ProgressReport(
            step=self.state.step, total_steps=grpo.max_steps, reward_mean=reward_mean,
            reward_std=reward_std, success_rate=success_rate(rollouts.results),
            zero_variance_fraction=(prepared.zero_variance_groups / prepared.groups
                                    if prepared.groups else None),
            validation_success_rate=evaluated.success_rate,
            validation_pass_at_k=evaluated.pass_at_k,
            validation_greedy_success_rate=evaluated.greedy_success_rate,
            tokens_per_second=tokens_sampled / decode_s if decode_s else None,
            components=components(rollouts.results), policy_version=self.state.step,
            training=training, failed_episode_fraction=failed,
            episode_error=most_frequent(rollouts.errors), trained_steps=self.state.trained_steps,
        ))
        await self._close_step(progress)

    async def _validate_if_due(self, tasks: Tasks, orchestrator: Orchestrator) -> Evaluation:
        """After step `state.step`: the validation split played, every evalIntervalSteps and at
        the end (success rate, pass@k and the greedy success rate); SIGTERM meanwhile skips it,
        since the step trained and is reported and saved."""
        spec, step = self.config.spec, self.state.step
        interval = spec.dataset.eval_interval_steps
        if not (tasks.validation and interval and (step % interval == 0
                                                   or step == spec.grpo.max_steps)):
            return Evaluation()
        with contextlib.suppress(Terminated):
            return await self._evaluate("v", step, tasks, orchestrator)
        return Evaluation()

    async def _close_step(self, progress: Progress) -> None:
        """After a step's report: its checkpoint when due (or SIGTERM came), then the end of the
        run if its episodes kept failing."""
        spec = self.config.spec
        if (self.state.step % spec.output.checkpoint_interval_steps == 0
                or self.state.step == spec.grpo.max_steps or self._terminated.is_set()):
            await self._checkpoint(progress)
        if self._failing_steps >= spec.rollout.max_failing_steps:
            raise EpisodesFailed(
                f"{EPISODES_FAILED_PREFIX} {self._failing_steps} steps in a row lost more than "
                f"spec.rollout.maxFailedEpisodeFraction {spec.rollout.max_failed_episode_fraction:g}"
                f" of their episodes; {self._last_failure}")

    def _since_last_report(self) -> tuple[float, int, float]:
        """Since the previous step's report: wall seconds, completion tokens sampled for the
        workers, seconds spent decoding them (time sampling ahead counts too)."""
        now, tokens, decoding = (time.monotonic(), self.service.tokens,
                                 self.service.decode_seconds)
        since = (now - self._reported_at, tokens - self._tokens_at, decoding - self._decoding_at)
        self._reported_at, self._tokens_at, self._decoding_at = now, tokens, decoding
        return since

    def _decoder_counters(self) -> tuple[int, int, int, int, int, float, float]:
        d, service = self.service.decoder, self.service
        return (d.prefilled_tokens, d.reused_tokens, d.row_steps, d.active_row_steps,
                service.sampled, service.sample_seconds, d.prefill_seconds)

    def _decoder_since_last_report(self, tokens: int, decode_s: float
                                   ) -> dict[str, float | None]:
        """Since the previous step's report, how well the decoder used its work: the share of
        prompt tokens served from cached prefixes (`prefixReuse`), and the share of the rows its
        decode steps computed that were still generating (`decodeRowOccupancy`; the rest are
        idle rows below the highest busy one, computed for nothing); and how long a request
        took from reaching the sampler to its answer, waiting to be admitted included
        (`turnSampleSeconds`, the trainer's part of the workers' `turnSeconds`); prefill and
        sampling apart: prompt tokens computed per second of prefill
        (`prefillTokensPerSecond`), completion tokens per second of the rest of decoding
        (`sampleTokensPerSecond`). `tokens` and `decode_s` are the same window's, from
        `_since_last_report`."""
        now = self._decoder_counters()
        prefilled, reused, rows, active, sampled, sample_s, prefill_s = (
            a - b for a, b in zip(now, self._decoder_at, strict=True))
        self._decoder_at = now
        sampling_s = decode_s - prefill_s
        return {"prefixReuse": round(reused / (prefilled + reused), 4) if prefilled + reused
                else None,
                "prefilledTokens": prefilled,
                "prefillSeconds": round(prefill_s, 3),
                "prefillTokensPerSecond": round(prefilled / prefill_s, 1) if prefill_s > 0
                else None,
                "sampleTokensPerSecond": round(tokens / sampling_s, 1) if sampling_s > 0
                else None,
                "decodeRowOccupancy": round(active / rows, 4) if rows else None,
                "turnSampleSeconds": round(sample_s / sampled, 4) if sampled else None}

    async def _checkpoint(self, progress: Progress) -> None:
        self.state.optimizer = self.optimizer.state_dict()
        self.state.rng = capture_rng()
        await asyncio.to_thread(self.store.save, self.policy.model, self.state)
        self._checkpointed_step = self.state.step
        progress.checkpointed(f"{self.config.output_uri}/checkpoints/"
                              f"step-{self.state.step:06d}/")

    async def _interruptible(self, work: Awaitable[T]) -> T:
        """`work`, unless SIGTERM comes first: then it is cancelled and Terminated raised.
        Only waits are interrupted (for rollouts, for validation); an update and a
        checkpoint always finish, so what is saved is a whole step."""
        task = asyncio.ensure_future(work)
        terminated = asyncio.ensure_future(self._terminated.wait())
        try:
            await asyncio.wait({task, terminated}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            terminated.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise Terminated()

    async def _save_on_termination(self, progress: Progress) -> str:
        """A checkpoint at the step the run is on (unless it has one), and what to say."""
        step, total = self.state.step, self.config.spec.grpo.max_steps
        if step > self._checkpointed_step:
            await self._checkpoint(progress)
        saved = (f"checkpoint saved at step {step}" if step else
                 "no step finished, nothing to save")
        return f"terminated by SIGTERM at step {step}/{total}: {saved}"

    def _judge_failures(self, step: int, rollouts: Rollouts) -> float | None:
        """The step's failed-episode fraction; counts failing steps in a row."""
        spec = self.config.spec
        counts = rollouts.counts
        if not counts.published:
            return None
        # A result that never came is a lost episode too: its worker crashed, could not write
        # it (a role without s3:PutObject for a large payload), or it could not be read here.
        lost = counts.failed + counts.late
        failed = lost / counts.published
        if failed > spec.rollout.max_failed_episode_fraction:
            self._failing_steps += 1
            self._last_failure = (f"step {step + 1}: {lost} of {counts.published} "
                                  f"episodes failed: {most_frequent(rollouts.errors)}")
            log.warning("failing step (%d in a row): %s", self._failing_steps,
                        self._last_failure)
        else:
            self._failing_steps = 0
        return failed

    def _sinks(self) -> list[ProgressSink]:
        sinks: list[ProgressSink] = [MetricsHistory(self.config.output_uri, self.state.step)]
        if self.config.progress_file is not None:
            sinks.append(FileSink(self.config.progress_file))
        mlflow = self.config.spec.output.mlflow
        if mlflow is not None:
            from mtrl_trainer.tracking import MlflowSink

            try:
                sinks.append(MlflowSink(
                    mlflow, uid=self.config.run_id, name=self.config.run_name,
                    namespace=self.config.namespace or "default",
                    run_spec=self.config.spec.model_dump(by_alias=True, mode="json",
                                                         exclude_none=True)))
            except Exception:
                log.warning("MLflow at %s is out of reach: the run is not logged there",
                            mlflow.tracking_uri, exc_info=True)
        if self.config.progress_config_map and self.config.namespace:
            try:
                sinks.append(ConfigMapSink(self.config.progress_config_map, self.config.namespace))
            except Exception:
                log.warning("no Kubernetes credentials: progress goes to the file only",
                            exc_info=True)
        return sinks
