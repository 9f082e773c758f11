"""One GRPO optimizer step on a fixed batch, under torchrun (any world size) or alone.

Prints rank 0's step loss, a digest of the updated LoRA weights and the token positions rank 0's
embedding saw as JSON, so a test can compare world sizes. With `--shared-prefix` the rows come in
groups that open alike and run without gradient checkpointing, so each rank runs its share of a
group's opening once (`SequenceLogprobs.hidden_states`). Used by test_distributed.py."""

from __future__ import annotations

import json
import random
import sys

import torch
from torch.nn.parallel import DistributedDataParallel

from mtrl_api.run import ModelSpec
from mtrl_trainer.batch import Row
from mtrl_trainer.distributed import broadcast, close_world, init_world
from mtrl_trainer.logprobs import SequenceLogprobs
from mtrl_trainer.models import load_policy
from mtrl_trainer.update import UpdateConfig, lora_parameters, train_step


def scored_row(rng: random.Random, token_ids: list[int], mask: list[int], count: int,
               micro_batch: int) -> Row:
    """A row of a batch of `count`: random old logprobs on its trained tokens, weights that sum
    to 1 over the batch, a random advantage."""
    trained = sum(mask)
    return Row(
        token_ids=token_ids,
        mask=mask,
        old_logprobs=[-rng.uniform(3, 6) if m else 0.0 for m in mask],
        weights=[m / (trained * count) for m in mask],
        advantage=rng.uniform(-1, 1),
        micro_batch=micro_batch,
    )


def fixed_rows(vocab: int, count: int = 6, micro_batches: int = 2) -> list[Row]:
    rng = random.Random(0)
    rows = []
    for i in range(count):
        length = rng.randint(6, 14)
        mask = [0] * 3 + [rng.choice((0, 1, 1)) for _ in range(length - 3)]
        tokens = [rng.randrange(vocab) for _ in range(length)]
        rows.append(scored_row(rng, tokens, mask, count, i % micro_batches))
    return rows


def grouped_rows(vocab: int, groups: int = 2, size: int = 4, opening: int = 40) -> list[Row]:
    """`groups` groups of `size` rows, each group's rows opening with the same `opening` tokens
    and one micro-batch per group, as a step's episodes are dealt."""
    rng = random.Random(1)
    rows = []
    for g in range(groups):
        prefix = [rng.randrange(vocab) for _ in range(opening)]
        for _ in range(size):
            own = rng.randint(6, 14)
            mask = [0] * opening + [rng.choice((0, 1, 1)) for _ in range(own)]
            tokens = prefix + [rng.randrange(vocab) for _ in range(own)]
            rows.append(scored_row(rng, tokens, mask, groups * size, g))
    return rows


def main() -> int:
    shared = "--shared-prefix" in sys.argv[1:]
    world = init_world()
    torch.manual_seed(0)
    spec = ModelSpec.model_validate({"name": "random:tiny-qwen2", "dtype": "float32",
                                     "lora": {"rank": 4, "alpha": 8, "dropout": 0.0},
                                     "gradientCheckpointing": not shared})
    policy = load_policy(spec, seed=5, device=torch.device("cpu"))
    embedded = [0]
    policy.model.get_input_embeddings().register_forward_hook(
        lambda _module, args, _out: embedded.__setitem__(0, embedded[0] + args[0].numel()))
    scorer = SequenceLogprobs(policy.model)
    model = DistributedDataParallel(scorer) if world.size > 1 else scorer
    optimizer = torch.optim.AdamW(lora_parameters(policy.model), lr=1e-2, weight_decay=0.0)
    make_rows = grouped_rows if shared else fixed_rows
    rows = broadcast(make_rows(policy.tokenizer.vocab_size) if world.is_leader else None, world)
    stats = train_step(
        model, optimizer, rows,
        UpdateConfig(epsilon=0.2, epsilon_high=0.28, beta=0.05, temperature=1.0, micro_batches=2),
        pad_token_id=0, device=torch.device("cpu"), rank=world.rank, world_size=world.size,
    )
    digest = float(sum(p.double().sum() for p in lora_parameters(policy.model)))
    if world.is_leader:
        print(json.dumps({"loss": stats.loss, "grad_norm": stats.grad_norm, "digest": digest,
                          "tokens": stats.trained_tokens, "embedded": embedded[0]}))
    close_world(world)
    return 0


if __name__ == "__main__":
    sys.exit(main())
