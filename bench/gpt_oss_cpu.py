"""GPT-OSS-20B shapes on CPU (issue 14 target): the AWS pipeline's model generates through the
fast decoder and trains one GRPO step.

Every width of `openai/gpt-oss-20b`'s config (hidden 2880, 64 query / 8 key-value heads of 64,
32 experts of which 4 per token, 201,088-token vocabulary, 128-token sliding window on every
other layer, attention sinks, YaRN rope) with 2 of its 24 layers (one sliding, one full):
2.8 B parameters, 5.6 GB in bf16. Random weights (throughput and code paths do not depend on
them), LoRA r8 on the attention projections (the experts are not `nn.Linear`).

    python bench/gpt_oss_cpu.py
"""

from __future__ import annotations

import argparse
import math
import resource
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "trainer"))

from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, GptOssConfig

from mtrl_trainer.batch import EpisodeSequence, rows_from_sequences
from mtrl_trainer.decoders import make_decoder
from mtrl_trainer.logprobs import SequenceLogprobs
from mtrl_trainer.sampling import SamplingParams
from mtrl_trainer.update import UpdateConfig, lora_parameters, train_step

# openai/gpt-oss-20b config.json, layers reduced.
GPT_OSS_20B = {"hidden_size": 2880, "intermediate_size": 2880, "num_attention_heads": 64,
               "num_key_value_heads": 8, "head_dim": 64, "num_local_experts": 32,
               "num_experts_per_tok": 4, "vocab_size": 201088, "sliding_window": 128,
               "max_position_embeddings": 131072, "rope_theta": 150000.0,
               "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
                                "beta_slow": 1.0, "truncate": False,
                                "original_max_position_embeddings": 4096},
               "tie_word_embeddings": False}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--prompt-tokens", type=int, default=24)
    parser.add_argument("--new-tokens", type=int, default=8)
    args = parser.parse_args()
    started = time.perf_counter()
    config = GptOssConfig(**GPT_OSS_20B, num_hidden_layers=args.layers,
                          layer_types=["sliding_attention", "full_attention"] * (args.layers // 2))
    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    params = sum(p.numel() for p in base.parameters())
    model = get_peft_model(base, LoraConfig(r=8, lora_alpha=16, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj"], task_type="CAUSAL_LM"))
    built_s = time.perf_counter() - started

    decoder = make_decoder(model, rows=args.prompts, max_length=args.prompt_tokens + args.new_tokens)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, config.vocab_size, (args.prompt_tokens,), generator=gen).tolist()
               for _ in range(args.prompts)]
    model.eval()
    t0 = time.perf_counter()
    outs = decoder.generate(prompts, [args.new_tokens] * len(prompts), SamplingParams(1.0),
                            generator=gen)
    gen_s = time.perf_counter() - t0
    advantages = [1.0, -1.0] * (len(prompts) // 2) + [0.5] * (len(prompts) % 2)
    rows = rows_from_sequences(
        [EpisodeSequence(i, p + o.token_ids, [0] * len(p) + [1] * len(o.token_ids),
                         [0.0] * len(p) + [min(x, 0.0) for x in o.logprobs], a)
         for i, (p, o, a) in enumerate(zip(prompts, outs, advantages, strict=True))],
        loss_type="dapo", max_completion_length=args.new_tokens,
        max_sequence_length=args.prompt_tokens + args.new_tokens, micro_batches=1)
    optimizer = torch.optim.AdamW(lora_parameters(model), lr=1e-4, weight_decay=0.0)
    t1 = time.perf_counter()
    stats = train_step(SequenceLogprobs(model), optimizer, rows,
                       UpdateConfig(0.2, 0.28, 0.0, 1.0, 1), pad_token_id=0,
                       device=torch.device("cpu"))
    train_s = time.perf_counter() - t1
    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    finite = math.isfinite(stats.loss) and math.isfinite(stats.grad_norm)
    print(f"> GPT-OSS-20B widths, {args.layers} layers (sliding + full), bf16 on CPU, "
          f"{params / 1e9:.2f} B parameters")
    print()
    print("| decoder | completions | tokens | generate (s) | train step (s) | loss, grad norm "
          "finite | mean \\|trainer - sampler logprob\\| | peak RSS (GiB) | build (s) |")
    print("|---|---:|---:|---:|---:|---|---:|---:|---:|")
    print(f"| {type(decoder).__name__} | {len(outs)} | {sum(len(o.token_ids) for o in outs)} | "
          f"{gen_s:.1f} | {train_s:.1f} | {'yes' if finite else 'NO'} "
          f"({stats.loss:.3g}, {stats.grad_norm:.3g}) | {stats.logprob_gap:.3f} | "
          f"{peak_gib:.1f} | {built_s:.0f} |")
    return 0 if finite else 1


if __name__ == "__main__":
    sys.exit(main())
