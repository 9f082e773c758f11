"""The training run: resume, then per step play rollouts, update, report, checkpoint."""

from __future__ import annotations

import asyncio
import logging
import random
import threading
from dataclasses import dataclass

import torch
from torch.nn.parallel import DistributedDataParallel

from mtrl_rollout.batching import Outbox
from mtrl_rollout.generation import GenerationServer
from mtrl_rollout.offload import Codec
from mtrl_rollout.results import ResultCollector
from mtrl_rollout.sqs import Sqs
from mtrl_trainer import s3
from mtrl_trainer.batch import Row, build_rows
from mtrl_trainer.checkpoint import (
    CheckpointStore,
    TrainerState,
    capture_rng,
    highest_checkpoint,
    restore_rng,
)
from mtrl_trainer.config import ConfigError, TrainerConfig
from mtrl_trainer.dataset import Tasks, load_tasks
from mtrl_trainer.distributed import World, broadcast, device_for
from mtrl_trainer.generation import GenerationService, SamplingConfig
from mtrl_trainer.grpo import group_advantages
from mtrl_trainer.logprobs import SequenceLogprobs
from mtrl_trainer.models import Policy, load_policy
from mtrl_trainer.orchestration import Orchestrator, Rollouts, RolloutSettings
from mtrl_trainer.progress import (
    ConfigMapSink,
    FileSink,
    MetricsHistory,
    Progress,
    ProgressReport,
    ProgressSink,
)
from mtrl_trainer.sharding import Endpoint, ShardRouter, serve_share
from mtrl_trainer.stats import components, mean_std, success_rate
from mtrl_trainer.update import UpdateConfig, UpdateStats, lora_parameters, train_step

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    rows: list[Row]
    zero_variance_groups: int
    groups: int


def prepare(rollouts: Rollouts, config: TrainerConfig, micro_batches: int) -> Prepared:
    """Advantages per complete group; zero-variance groups are left out of the update."""
    grpo, spec = config.spec.grpo, config.spec
    if not rollouts.groups:
        return Prepared([], 0, 0)
    rewards = torch.tensor(
        [r.aggregate_reward_score for group in rollouts.groups for r in group], dtype=torch.float64
    )
    adv = group_advantages(rewards, grpo.group_size, grpo.scale_rewards)
    kept, advantages = [], []
    for g, group in enumerate(rollouts.groups):
        if not adv.zero_variance[g]:
            kept += group
            advantages += adv.values[g * grpo.group_size : (g + 1) * grpo.group_size].tolist()
    rows = build_rows(
        kept, advantages, loss_type=grpo.loss_type,
        max_completion_length=grpo.max_new_tokens * spec.rollout.max_turns,
        max_sequence_length=spec.model.max_sequence_length, micro_batches=micro_batches,
    )
    return Prepared(rows, int(adv.zero_variance.sum()), len(rollouts.groups))


class Run:
    def __init__(self, config: TrainerConfig, world: World) -> None:
        self.config = config
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
        self.update_config = UpdateConfig(
            epsilon=grpo.epsilon, epsilon_high=grpo.epsilon_high, beta=grpo.kl_beta,
            temperature=grpo.temperature, micro_batches=grpo.gradient_accumulation_steps,
        )

    def _resume(self) -> TrainerState:
        """This run's newest checkpoint (a retry of the run); else, when spec.output.resumeFrom
        is set, the highest-step checkpoint under it; else a fresh start."""
        output = self.config.spec.output
        state = self.store.load_latest(self.policy.model)
        if state is not None:
            log.info("resumed from checkpoint at step %d", state.step)
            return state
        if output.resume_from is None:
            return TrainerState()
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
        log.info("resumed from checkpoint at step %d of %s", state.step, source)
        return state

    @property
    def optimizer_steps(self) -> int:
        states = self.optimizer.state.values()
        return int(max((float(s["step"]) for s in states if "step" in s), default=0))

    def _update(self, rows: list[Row], version: int) -> UpdateStats | None:
        """The optimizer step, and the new policy version on this rank's sampler, with no
        completion in flight (same rows and version on every rank)."""
        with self.model_lock:
            stats = None
            if rows:
                stats = train_step(
                    self.model, self.optimizer, rows, self.update_config,
                    pad_token_id=self.policy.tokenizer.pad_token_id, device=self.device,
                    rank=self.world.rank, world_size=self.world.size,
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

    async def lead(self) -> None:
        config, spec = self.config, self.config.spec
        grpo = spec.grpo
        tasks = load_tasks(spec.dataset, spec.rollout.environment)
        sqs = Sqs()
        codec = Codec(s3=s3.client() if config.payload_bucket else None,
                      bucket=config.payload_bucket)
        outbox = Outbox(sqs)
        collector = ResultCollector(sqs, config.result_queue_url, config.dlq_url, codec=codec)
        service = self.service
        router = ShardRouter(self.world, service.sample)
        if self.endpoint is not None:
            await router.start(self.endpoint)
        server = GenerationServer(sqs, config.generate_queue_url, config.dlq_url, router.sample,
                                  codec=codec, max_batch=256, max_wait_s=0.02)
        orchestrator = Orchestrator(RolloutSettings(
            run_id=config.run_id, attempt=config.attempt,
            rollout_queue_url=config.rollout_queue_url, result_queue_url=config.result_queue_url,
            environment=spec.rollout.environment, max_turns=spec.rollout.max_turns,
            max_length=spec.model.max_sequence_length,
            episode_timeout_s=spec.rollout.episode_timeout_seconds,
            collect_grace_s=config.collect_grace_s, max_staleness=grpo.max_staleness,
        ), outbox, collector, codec)
        progress = Progress(self._sinks(), attempt=config.operator_attempt)
        stop = asyncio.Event()
        serving = asyncio.create_task(server.serve(stop))
        try:
            for step in range(self.state.step, grpo.max_steps):
                await self._step(step, tasks, orchestrator, service, progress)
            progress.succeeded(self.state.step, grpo.max_steps)  # the last checkpoint is saved
        finally:
            stop.set()
            await serving
            await router.aclose()
            service.close()
            await collector.aclose()
            await outbox.aclose()
            sqs.close()

    async def _step(
        self, step: int, tasks: Tasks, orchestrator: Orchestrator, service: GenerationService,
        progress: Progress,
    ) -> None:
        spec, grpo = self.config.spec, self.config.spec.grpo
        version = self.state.step
        tokens0, decode0 = service.tokens, service.decode_seconds
        rollouts = await orchestrator.play(
            "s", step, tasks.for_step(step, grpo.prompts_per_step, grpo.seed), grpo.group_size,
            version,
        )
        prepared = prepare(rollouts, self.config, grpo.gradient_accumulation_steps)
        rows = await asyncio.to_thread(broadcast, prepared.rows, self.world)
        stats = await asyncio.to_thread(self._update, rows, step + 1)
        self.state.step = step + 1
        validation = None
        interval = spec.dataset.eval_interval_steps
        if tasks.validation and interval and (self.state.step % interval == 0
                                              or self.state.step == grpo.max_steps):
            played = await orchestrator.play("v", step, tasks.validation, 1, self.state.step)
            validation = success_rate(played.results)
        rewards = [r.aggregate_reward_score for r in rollouts.results]
        reward_mean, reward_std = mean_std(rewards)
        decode_s = service.decode_seconds - decode0
        self.state.history.append({
            "step": self.state.step, "attempt": self.config.attempt, "policyVersion": version,
            "rewardMean": reward_mean, "updated": stats is not None,
            "loss": stats.loss if stats else None, "optimizerSteps": self.optimizer_steps,
            **rollouts.counts.__dict__,
        })
        log.info("step %d/%d reward %.4f loss %s groups %d (zero-variance %d, dropped %d) %.1fs",
                 self.state.step, grpo.max_steps, reward_mean or 0.0,
                 f"{stats.loss:.4f}" if stats else "-", prepared.groups,
                 prepared.zero_variance_groups, rollouts.counts.dropped_groups, rollouts.seconds)
        progress.report(ProgressReport(
            step=self.state.step, total_steps=grpo.max_steps, reward_mean=reward_mean,
            reward_std=reward_std, success_rate=success_rate(rollouts.results),
            zero_variance_fraction=(prepared.zero_variance_groups / prepared.groups
                                    if prepared.groups else None),
            validation_success_rate=validation,
            tokens_per_second=(service.tokens - tokens0) / decode_s if decode_s else None,
            components=components(rollouts.results), policy_version=self.state.step,
        ))
        if (self.state.step % spec.output.checkpoint_interval_steps == 0
                or self.state.step == grpo.max_steps):
            self.state.optimizer = self.optimizer.state_dict()
            self.state.rng = capture_rng()
            await asyncio.to_thread(self.store.save, self.policy.model, self.state)
            progress.checkpointed(f"{self.config.output_uri}/checkpoints/"
                                  f"step-{self.state.step:06d}/")

    def _sinks(self) -> list[ProgressSink]:
        sinks: list[ProgressSink] = [MetricsHistory(self.config.output_uri, self.state.step)]
        if self.config.progress_file is not None:
            sinks.append(FileSink(self.config.progress_file))
        if self.config.progress_config_map and self.config.namespace:
            try:
                sinks.append(ConfigMapSink(self.config.progress_config_map, self.config.namespace))
            except Exception:
                log.warning("no Kubernetes credentials: progress goes to the file only",
                            exc_info=True)
        return sinks
