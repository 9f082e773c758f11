"""Training memory benchmark (issue 14, item 4): peak memory of one loss forward + backward with
the whole [B, T, V] fp32 logits (before) and with logprobs of the trained positions only,
chunked (`mtrl_trainer.logprobs`, after), at two vocabulary sizes.

Each measurement runs in a fresh process: the peak is the process's maximum resident set
(`ru_maxrss`) minus its resident set just before the step, after a warm-up step on a tiny batch.
Tiny body (hidden 64, 2 layers) so the vocabulary dominates, as it does for Qwen2-0.5B at long
context; half of the positions are trained (the rest: prompt and environment tokens).

    python bench/memory_bench.py
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def measure(variant: str, vocab: int, tokens: int) -> dict[str, float]:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    sys.path.insert(0, str(ROOT / "trainer"))
    from mtrl_trainer.logprobs import SequenceLogprobs, full_logprobs

    torch.manual_seed(0)
    base = Qwen2ForCausalLM(Qwen2Config(
        vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
        max_position_embeddings=tokens))
    model = get_peft_model(base, LoraConfig(r=8, target_modules=["q_proj", "v_proj"],
                                            task_type="CAUSAL_LM"))
    scorer = SequenceLogprobs(model)

    def step(length: int) -> None:
        ids = torch.randint(0, vocab, (1, length))
        attention = torch.ones_like(ids)
        where = (torch.arange(length) >= length // 2).float()[None]  # completion half
        if variant == "full-logits":
            logprobs = full_logprobs(model, ids, attention, 1.0)
        else:
            logprobs = scorer(ids, attention, where, 1.0)
        (logprobs * where).sum().backward()

    step(16)
    resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    before_kib = resident_pages * resource.getpagesize() // 1024
    started = time.perf_counter()
    step(tokens)
    seconds = time.perf_counter() - started
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"peak_mib": max(0, peak_kib - before_kib) / 1024, "seconds": seconds}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=1024)
    parser.add_argument("--vocab", type=int, nargs="+", default=[32000, 151936])
    parser.add_argument("--one", nargs=2, metavar=("VARIANT", "VOCAB"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one[0], int(args.one[1]), args.tokens)))
        return 0
    results: dict[tuple[str, int], dict[str, float]] = {}
    for vocab in args.vocab:
        for variant in ("full-logits", "chunked"):
            done = subprocess.run(
                [sys.executable, __file__, "--tokens", str(args.tokens), "--one", variant,
                 str(vocab)], capture_output=True, text=True, check=True,
                env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})
            results[variant, vocab] = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"> one sequence of {args.tokens} tokens, half of them trained, loss forward + backward, "
          "CPU; peak = max resident set during the step minus the resident set before it")
    print()
    print("| vocabulary | full logits: peak MiB | chunked: peak MiB | ratio | full logits: s "
          "| chunked: s |")
    print("|---:|---:|---:|---:|---:|---:|")
    for vocab in args.vocab:
        full, chunked = results["full-logits", vocab], results["chunked", vocab]
        ratio = full["peak_mib"] / max(chunked["peak_mib"], 1e-9)
        print(f"| {vocab:,} | {full['peak_mib']:,.0f} | {chunked['peak_mib']:,.0f} | {ratio:.1f}x "
              f"| {full['seconds']:.2f} | {chunked['seconds']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
