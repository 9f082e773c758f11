"""Trainer benchmark (GUIDE P6): generation and training throughput of one GRPO step.

Qwen2-0.5B-shaped model built from its config with random weights (throughput does not depend
on the weights), LoRA r32 on every projection, 128 completions per step (16 prompts x group 8),
256-token completions. Generation uses the trainer's static-KV-cache decoder with a compiled
(CUDA-graph) decode step; training is the trainer's own GRPO update. If `trl` is importable, the
same step is timed with TRL's GRPOTrainer (HF generate, no vLLM) and its losses are checked for
NaN. `--tiny` runs a tiny config for a few steps on CPU as a smoke test.

    python bench/trainer_bench.py --out BENCH_trainer.json
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch
from peft import LoraConfig, get_peft_model
from transformers import Qwen2Config, Qwen2ForCausalLM

# Runs from a plain checkout too (the GPU machine has torch but not this package installed).
for _package_root in ("trainer", "rollout"):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / _package_root))

from mtrl_trainer.batch import build_rows  # noqa: E402
from mtrl_trainer.decoder import StaticCacheDecoder  # noqa: E402
from mtrl_trainer.update import UpdateConfig, lora_parameters, train_step  # noqa: E402

QWEN2_05B = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
             "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
             "tie_word_embeddings": True, "rope_theta": 1_000_000.0,
             "max_position_embeddings": 32768}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
        "tie_word_embeddings": True, "max_position_embeddings": 2048}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_model(shape: dict[str, Any], device: torch.device, dtype: torch.dtype) -> Any:
    torch.manual_seed(0)
    base = Qwen2ForCausalLM(Qwen2Config(**shape)).to(device=device, dtype=dtype)
    return get_peft_model(base, LoraConfig(r=32, lora_alpha=64, lora_dropout=0.0,
                                           target_modules=TARGETS, task_type="CAUSAL_LM"))


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def ours(args: argparse.Namespace, shape: dict[str, Any], device: torch.device,
         dtype: torch.dtype) -> dict[str, Any]:
    from mtrl_rollout.protocol import RolloutResult, TurnRecord

    model = build_model(shape, device, dtype)
    decoder = StaticCacheDecoder(model)
    optimizer = torch.optim.AdamW(lora_parameters(model), lr=1e-5, weight_decay=0.0)
    rng = random.Random(0)
    vocab = shape["vocab_size"]
    prompts = [p for _ in range(args.completions // args.group)
               for p in [[rng.randrange(vocab) for _ in range(args.prompt_tokens)]] * args.group]
    config = UpdateConfig(epsilon=0.2, epsilon_high=0.28, beta=0.0, temperature=1.0,
                          micro_batches=args.micro_batches)
    gen = torch.Generator(device).manual_seed(0)
    steps: list[dict[str, float]] = []
    for step in range(args.warmup + args.steps):
        model.eval()
        sync(device)
        t0 = time.perf_counter()
        # No stop tokens: every completion is the full length, as in the TRL reference runs.
        outs = decoder.generate(prompts, [args.new_tokens] * len(prompts),
                                stop_token_ids=frozenset(), temperature=1.0, generator=gen)
        sync(device)
        t1 = time.perf_counter()
        results = [RolloutResult(
            run_id="bench", step=step, group_id=str(i // args.group), sample_id=str(i),
            policy_version=step, aggregate_reward_score=rng.random(), metrics_list=[],
            stop_reason="done",
            trajectory=[TurnRecord(turn=0, policy_version=step, prompt_token_ids=prompt,
                                   completion_token_ids=o.token_ids,
                                   completion_logprobs=[min(x, 0.0) for x in o.logprobs],
                                   finish_reason="length")],
        ) for i, (prompt, o) in enumerate(zip(prompts, outs, strict=True))]
        rewards = torch.tensor([r.aggregate_reward_score for r in results])
        grouped = rewards.view(-1, args.group)
        adv = ((grouped - grouped.mean(1, keepdim=True)) / (grouped.std(1, keepdim=True) + 1e-4))
        rows = build_rows(results, adv.flatten().tolist(), loss_type="dapo",
                          max_completion_length=args.new_tokens, max_sequence_length=8192,
                          micro_batches=args.micro_batches)
        t2 = time.perf_counter()
        stats = train_step(model, optimizer, rows, config, pad_token_id=0, device=device)
        sync(device)
        t3 = time.perf_counter()
        generated = sum(len(o.token_ids) for o in outs)
        trained = sum(len(r.token_ids) for r in rows)
        if step >= args.warmup:
            steps.append({"gen_s": t1 - t0, "train_s": t3 - t2, "step_s": t3 - t0,
                          "gen_tokens": generated, "train_tokens": trained,
                          "loss": stats.loss, "grad_norm": stats.grad_norm})
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    gen_s = sum(s["gen_s"] for s in steps)
    train_s = sum(s["train_s"] for s in steps)
    gen_tps = sum(s["gen_tokens"] for s in steps) / gen_s
    # Decode is bound by reading the weights once per step for the whole batch.
    bound = args.hbm_tbps * 1e12 / weight_bytes * len(prompts)
    return {
        "gen_tok_s": gen_tps,
        "train_tok_s": sum(s["train_tokens"] for s in steps) / train_s,
        "step_s": sum(s["step_s"] for s in steps) / len(steps),
        "decode_bound_tok_s": bound,
        "decode_bound_fraction": gen_tps / bound,
        "losses_finite": all(math.isfinite(s["loss"]) and math.isfinite(s["grad_norm"])
                             for s in steps),
        "steps": steps,
    }


def trl_side(args: argparse.Namespace, shape: dict[str, Any], device: torch.device,
             dtype: torch.dtype) -> dict[str, Any]:
    """TRL's GRPOTrainer on the same model, with a word-level tokenizer built in memory."""
    try:
        import trl
        from datasets import Dataset
        from tokenizers import Tokenizer, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast, TrainerCallback
    except ImportError as exc:
        return {"skipped": f"trl not importable ({exc})"}
    vocab = shape["vocab_size"]
    words = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words, unk_token="t0", pad_token="t1",
                                        eos_token="t2")
    rng = random.Random(0)
    prompts = [" ".join(f"t{rng.randrange(3, vocab)}" for _ in range(args.prompt_tokens))
               for _ in range(args.completions // args.group * (args.warmup + args.steps))]
    model = build_model(shape, device, dtype).merge_and_unload()
    times: list[float] = []
    losses: list[float] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            sync(device)
            times.append(time.perf_counter())

        def on_step_end(self, *_: Any, **__: Any) -> None:
            sync(device)
            times[-1] = time.perf_counter() - times[-1]

        def on_log(self, _a: Any, _s: Any, _c: Any, logs: dict[str, float] | None = None,
                   **__: Any) -> None:
            for key in ("loss", "grad_norm"):
                if logs and key in logs:
                    losses.append(float(logs[key]))

    config = trl.GRPOConfig(
        output_dir="/tmp/trl-bench", per_device_train_batch_size=args.completions,
        num_generations=args.group, max_completion_length=args.new_tokens,
        max_steps=args.warmup + args.steps, logging_steps=1, report_to=[], save_strategy="no",
        bf16=dtype == torch.bfloat16, use_cpu=device.type == "cpu", learning_rate=1e-5,
    )
    trainer = trl.GRPOTrainer(
        model=model, reward_funcs=lambda completions, **_: [rng.random() for _ in completions],
        args=config, train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
        peft_config=LoraConfig(r=32, lora_alpha=64, target_modules=TARGETS,
                               task_type="CAUSAL_LM"),
        callbacks=[Timer()],
    )
    try:
        trainer.train()
    except Exception as exc:  # the GUIDE's NaN trap ends in a CUDA assert at step 2
        return {"error": f"{type(exc).__name__}: {exc}"[:500], "step_s": times[:1],
                "losses": losses}
    timed = times[args.warmup:]
    step_s = sum(timed) / len(timed)
    return {"step_s": step_s, "completion_tok_s": args.completions * args.new_tokens / step_s,
            "losses_finite": all(math.isfinite(v) for v in losses), "losses": losses,
            "trl_version": trl.__version__}


def table(report: dict[str, Any]) -> str:
    o, t = report["ours"], report.get("trl", {})
    rows = [
        ("generation tok/s", f"{o['gen_tok_s']:,.0f}", f"{t['completion_tok_s']:,.0f}"
         if "completion_tok_s" in t else "-"),
        ("training tok/s", f"{o['train_tok_s']:,.0f}", "-"),
        ("step time (s)", f"{o['step_s']:.2f}", f"{t['step_s']:.2f}" if "step_s" in t
         and isinstance(t["step_s"], float) else "-"),
        ("decode bandwidth bound (tok/s)", f"{o['decode_bound_tok_s']:,.0f}", "-"),
        ("fraction of bound", f"{o['decode_bound_fraction']:.1%}", "-"),
        ("losses finite", str(o["losses_finite"]), str(t.get("losses_finite", "-"))),
    ]
    lines = ["| metric | mtrl trainer | TRL GRPOTrainer |", "|---|---:|---:|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    if "completion_tok_s" in t:
        lines.append(f"\ngeneration speed-up over TRL: "
                     f"{o['gen_tok_s'] / t['completion_tok_s']:.1f}x")
    for key in ("skipped", "error"):
        if key in t:
            lines.append(f"\nTRL: {t[key]}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny config, few steps (CPU smoke)")
    parser.add_argument("--out", type=Path, help="write the JSON report here")
    parser.add_argument("--completions", type=int, default=128)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps (compilation)")
    parser.add_argument("--hbm-tbps", type=float, default=4.3,
                        help="effective HBM bandwidth for the decode bound (H200: ~4.3)")
    parser.add_argument("--no-trl", action="store_true")
    args = parser.parse_args()
    if args.tiny:
        args.completions, args.new_tokens, args.prompt_tokens = 16, 16, 8
        args.micro_batches, args.steps = 2, 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shape = TINY if args.tiny else QWEN2_05B
    report: dict[str, Any] = {
        "config": {**vars(args), "out": str(args.out), "shape": shape},
        "device": torch.cuda.get_device_name() if device.type == "cuda" else platform.processor(),
        "torch": torch.__version__,
        "ours": ours(args, shape, device, dtype),
    }
    if not args.no_trl:
        report["trl"] = trl_side(args, shape, device, dtype)
    print(table(report))
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
