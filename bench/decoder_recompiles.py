"""Does the compiled decode step recompile as an episode grows? (CPU, tiny Qwen2 shapes.)

The decode step is compiled once with dynamic shapes (`trainer/mtrl_trainer/decoder.py`); a
recompile costs what the first compile did (270 s on an H200 for Qwen2-0.5B shapes,
BENCHMARKS.md). This generates with growing budgets in one decoder and prints, per call, the
seconds taken, the graphs compiled so far and, with TORCH_LOGS=recompiles, the guard that failed.

    TORCH_LOGS=recompiles .venv/bin/python bench/decoder_recompiles.py
"""

from __future__ import annotations

import random
import sys
import time
from pathlib import Path

import torch
from torch._dynamo.utils import counters

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "trainer"), str(ROOT / "api")]

import gpu_check  # noqa: E402  (the GPU check's model: one seeded tiny Qwen2 with LoRA r32)

from mtrl_trainer.decoder import FastDecoder  # noqa: E402
from mtrl_trainer.sampling import SamplingParams  # noqa: E402

PROMPT, LONGEST, ROWS = 8, 256, 16


def main() -> None:
    cpu = torch.device("cpu")
    model = gpu_check.lora(gpu_check.base_model(gpu_check.TINY, cpu, torch.bfloat16))
    model.eval()
    rng = random.Random(0)
    decoder = FastDecoder(model, rows=ROWS, max_length=PROMPT + LONGEST + 16, compile_step=True)
    params = SamplingParams(temperature=1.0, stop_token_ids=frozenset({gpu_check.EOS}))
    print(f"cache capacity {decoder.capacity} positions; spans are powers of two up to it")
    for rows, budget in ((2, 8), (2, 8), (ROWS, 16), (ROWS, 64), (ROWS, LONGEST), (ROWS, 64)):
        prompts = [[rng.randrange(3, 500) for _ in range(PROMPT)] for _ in range(rows)]
        started = time.perf_counter()
        decoder.generate(prompts, [budget] * rows, params,
                         generator=torch.Generator().manual_seed(1))
        print(f"{rows:3d} rows x {budget:3d} new tokens: {time.perf_counter() - started:6.1f} s, "
              f"graphs compiled so far: {counters['stats']['unique_graphs']}", flush=True)


if __name__ == "__main__":
    main()
