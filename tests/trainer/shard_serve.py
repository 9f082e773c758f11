"""Sharded generation under torchrun (gloo): rank 0 routes two-turn episodes to every rank,
then all ranks take one DDP optimizer step, then a second round is sampled.

Prints one JSON line from rank 0: which rank served each sample id (and how many turns), the
prefix tokens each rank reused, and the policy versions of each round's responses. Used by
test_distributed.py; the Run wiring (loop.py) uses the same Endpoint / ShardRouter /
serve_share / GenerationService.update_policy.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from typing import Any

import torch
import torch.distributed as dist
from ddp_step import fixed_rows
from torch.nn.parallel import DistributedDataParallel

from mtrl_api.run import ModelSpec
from mtrl_rollout.protocol import ChatMessage, GenerateRequest, GenerateResponse
from mtrl_trainer.distributed import broadcast, close_world, init_world
from mtrl_trainer.generation import GenerationService, SamplingConfig
from mtrl_trainer.logprobs import SequenceLogprobs
from mtrl_trainer.models import load_policy
from mtrl_trainer.sharding import Endpoint, ShardRouter, serve_share
from mtrl_trainer.update import UpdateConfig, lora_parameters, train_step

ATTEMPT = "a1"
EPISODES = 12


def request(sample: int, turn: int, messages: list[ChatMessage], round_: int) -> GenerateRequest:
    return GenerateRequest(
        run_id="r", step=round_, group_id=str(sample // 4), sample_id=f"{ATTEMPT}-{round_}-{sample}",
        policy_version=round_, request_id=f"{round_}-{sample}-{turn}", turn=turn,
        messages=messages, reply_queue_url="unused")


async def play_round(router: ShardRouter, round_: int) -> list[GenerateResponse]:
    """Every episode: two turns, the second extending the first (what a worker sends)."""
    histories = [[ChatMessage(role="user", content=f"task {i}")] for i in range(EPISODES)]
    responses = []
    for turn in range(2):
        batch = [request(i, turn, h, round_) for i, h in enumerate(histories)]
        answers = await asyncio.gather(*map(router.sample, batch))
        for history, answer in zip(histories, answers, strict=True):
            assert answer.error is None, answer.error
            history += [answer.choices[0].message, ChatMessage(role="user", content="again")]
        responses += answers
    return responses


def main() -> int:
    world = init_world()
    torch.manual_seed(0)
    spec = ModelSpec.model_validate({"name": "random:tiny-qwen2", "dtype": "float32",
                                     "lora": {"rank": 4, "alpha": 8, "dropout": 0.0}})
    policy = load_policy(spec, seed=5, device=torch.device("cpu"))
    scorer = SequenceLogprobs(policy.model)
    model = DistributedDataParallel(scorer) if world.size > 1 else scorer
    optimizer = torch.optim.AdamW(lora_parameters(policy.model), lr=1e-2, weight_decay=0.0)
    lock = threading.Lock()
    service = GenerationService(policy, SamplingConfig(1.0, 1.0, 8, 256, max_batch=16),
                                model_lock=lock, attempt=ATTEMPT, seed=world.rank)
    endpoint = Endpoint.bootstrap(world)

    def update() -> None:
        rows = broadcast(fixed_rows(policy.tokenizer.vocab_size) if world.is_leader else None, world)
        with lock:
            train_step(model, optimizer, rows, UpdateConfig(0.2, 0.28, 0.0, 1.0, 2), pad_token_id=0,
                       device=torch.device("cpu"), rank=world.rank, world_size=world.size)
            service.update_policy(1)

    report: dict[str, Any] = {}
    if world.is_leader:
        async def lead() -> None:
            router = ShardRouter(world, service.sample)
            await router.start(endpoint, timeout_s=120)
            before = await play_round(router, 0)
            await asyncio.to_thread(update)
            after = await play_round(router, 1)
            report["versions"] = [sorted({r.policy_version for r in before}),
                                  sorted({r.policy_version for r in after})]
            await router.aclose()

        asyncio.run(lead())
    else:
        sample = service.sample
        serving = threading.Thread(
            target=lambda: asyncio.run(serve_share(endpoint, world.rank, sample)), daemon=True)
        serving.start()
        update()
        serving.join()  # rank 0 hangs up after its last round
    service.close()
    mine = {"served": dict(service.served), "reused": service.decoder.reused_tokens}
    everyone: list[Any] = [None] * world.size
    if world.size > 1:
        dist.all_gather_object(everyone, mine)
    else:
        everyone = [mine]
    if world.is_leader:
        print(json.dumps({**report, "ranks": everyone}))
    close_world(world)
    return 0


if __name__ == "__main__":
    sys.exit(main())
