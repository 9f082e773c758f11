"""Serving benchmark (issue 14, item 3): multi-turn episodes through the generation service,
continuous batching with prefix reuse against the previous scheduling, side by side.

Each episode plays `--turns` turns: a generate request with the whole conversation (what a worker
sends), then a simulated environment latency, then the environment's reply appended to the
conversation. Completion budgets vary per turn (seeded), so batch members finish at different
times. Both runs use the same service, model, decoder kernels and seeds; they differ only in
scheduling:
- `previous`: a batch is admitted only when the last one has finished completely, and every turn
  prefills the whole conversation (the decoder before this change);
- `continuous`: requests join between decode steps as rows free up, and a turn prefills only
  the tokens after its episode's cached prefix.

    python bench/serving_bench.py
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

for _root in ("trainer", "rollout", "operator"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / _root))

from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from mtrl_rollout.protocol import ChatMessage, GenerateRequest, SamplingParams  # noqa: E402
from mtrl_trainer.decoder import FastDecoder  # noqa: E402
from mtrl_trainer.generation import GenerationService, SamplingConfig  # noqa: E402
from mtrl_trainer.models import Policy  # noqa: E402
from mtrl_trainer.sampling import SamplingParams as DecodeParams  # noqa: E402
from mtrl_trainer.tokenizer import CharChatTokenizer  # noqa: E402

ATTEMPT = "bench"


def policy() -> Policy:
    tokenizer = CharChatTokenizer()
    torch.manual_seed(0)
    base = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=tokenizer.vocab_size, hidden_size=256, intermediate_size=512,
        num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
        max_position_embeddings=4096, tie_word_embeddings=False))
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                            task_type="CAUSAL_LM"))
    return Policy(model.eval(), tokenizer)


async def episode(service: GenerationService, index: int, args: argparse.Namespace,
                  rng: random.Random) -> tuple[int, int]:
    messages = [ChatMessage(role="user", content=f"episode {index}: " + "x" * args.prompt_chars)]
    turns = tokens = 0
    for turn in range(args.turns):
        request = GenerateRequest(
            run_id="bench", step=0, group_id="g", sample_id=f"{ATTEMPT}-{index}",
            policy_version=0, request_id=f"{index}-{turn}", turn=turn, messages=messages,
            sampling=SamplingParams(max_tokens=rng.randint(args.min_new, args.max_new)),
            reply_queue_url="unused")
        response = await service.sample(request)
        assert response.error is None, response.error
        turns += 1
        tokens += len(response.choices[0].token_ids)
        await asyncio.sleep(args.env_latency_s)  # the environment acts
        messages = [*messages, response.choices[0].message,
                    ChatMessage(role="user", content="y" * args.env_chars)]
    return turns, tokens


def run(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    p = policy()
    service = GenerationService(
        p, SamplingConfig(1.0, 1.0, args.max_new, 4096, max_batch=args.episodes),
        model_lock=threading.Lock(), attempt=ATTEMPT, seed=0)
    continuous = mode == "continuous"
    # Same kernels, rows and sampling; only the scheduling differs.
    service.decoder = FastDecoder(p.model, rows=args.episodes, max_length=4096,
                                  continuous=continuous, reuse_prefix=continuous)
    service.decoder.configure(DecodeParams(1.0, 1.0, p.tokenizer.stop_token_ids),
                              torch.Generator().manual_seed(0))

    async def play() -> list[tuple[int, int]]:
        return await asyncio.gather(*(episode(service, i, args, random.Random(i))
                                      for i in range(args.episodes)))

    started = time.perf_counter()
    played = asyncio.run(play())
    wall = time.perf_counter() - started
    service.close()
    decoder = service.decoder
    return {"turns": sum(t for t, _ in played), "tokens": sum(k for _, k in played),
            "wall_s": wall, "prefilled": decoder.prefilled_tokens, "reused": decoder.reused_tokens,
            "steps": decoder.steps}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--prompt-chars", type=int, default=200)
    parser.add_argument("--env-chars", type=int, default=40)
    parser.add_argument("--min-new", type=int, default=4)
    parser.add_argument("--max-new", type=int, default=48)
    parser.add_argument("--env-latency-s", type=float, default=0.05)
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = {mode: run(mode, args) for mode in ("previous", "continuous")}
    prev, cont = results["previous"], results["continuous"]
    print(f"> {args.episodes} episodes x {args.turns} turns, completions of {args.min_new}-"
          f"{args.max_new} tokens, {args.env_latency_s * 1000:.0f} ms environment latency per "
          "turn, CPU, 1 thread")
    print()
    print("| | previous (whole batches, full prefill) | continuous + prefix reuse | ratio |")
    print("|---|---:|---:|---:|")
    rows = [
        ("turns/s", prev["turns"] / prev["wall_s"], cont["turns"] / cont["wall_s"], True),
        ("completion tokens/s", prev["tokens"] / prev["wall_s"], cont["tokens"] / cont["wall_s"],
         True),
        ("wall time (s)", prev["wall_s"], cont["wall_s"], False),
        ("prompt tokens prefilled", prev["prefilled"], cont["prefilled"], False),
        ("prompt tokens reused from cache", prev["reused"], cont["reused"], None),
        ("decode steps", prev["steps"], cont["steps"], False),
    ]
    for name, a, b, higher in rows:
        ratio = "" if higher is None else f"{(b / a if higher else a / b):.2f}x"
        fmt = (lambda v: f"{v:,.1f}") if isinstance(a, float) else (lambda v: f"{v:,}")
        print(f"| {name} | {fmt(a)} | {fmt(b)} | {ratio} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
