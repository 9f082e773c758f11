"""GPU readiness check (issue 14, item 5; target P6 in bench/NOTES.md), one run, every number.

Checks, in this order, and writes `gpu_check.json` and `gpu_check.md` to `--out-dir` after each
one (a run cut short keeps what it measured):
1. the compiled decode step equals the eager one (sampled tokens with the same noise, and their
   logprobs) in bf16;
2. the attention kernel actually used: the decoder's layout (grouped-query heads folded into the
   query axis, float mask) against the previous one (boolean mask with `enable_gqa=True`);
3. completion tokens/s and step time, for this project's GRPO step and for TRL's `GRPOTrainer`,
   both as completion tokens of a step divided by the whole step's time (generation, scoring,
   update), 128 completions x 256 new tokens, Qwen2-0.5B shapes, LoRA r32 on every projection,
   the same prompts, the same weights (one seeded initialisation built twice), 8 micro-batches
   of 16 on both sides;
4. losses and gradient norms finite on both sides;
5. the fraction of the memory-bandwidth decode bound reached (bandwidth measured here with a
   device copy; on GPU also against the nominal 4.3 TB/s of an H200);
6. the clip fraction and the mean |trainer - sampler logprob| at step 1: how well sampler and
   trainer agree in bf16.
Both sides train without cuDNN's attention kernel (`update.training_attention`: its backward
makes NaN query gradients on H100/H200 for left-padded batches, pytorch/pytorch#196678), whose
bug is reproduced on its own, cuDNN against the memory-efficient kernel. TRL's chunked log-prob
kernel is also compared with `log_softmax` on its own; if TRL's losses or gradient norms are not
finite, TRL takes one more step under autograd's anomaly detection, which names the first
backward function to return NaN and the forward code that made it; and on a GPU TRL's step 1
runs once more with torch's default kernels (cuDNN's attention), under anomaly detection too
(the dry run takes both tries, to exercise them); see docs/trainer.md.

Needs torch, transformers and peft only (plus trl and datasets for the TRL side, carried as
wheels: `bench/gpu_check.sh`); no pydantic, boto3 or mlflow. `--tiny` runs the same code on a tiny
config (the CPU dry run).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import platform
import random
import re
import sys
import time
import warnings
from pathlib import Path
from typing import Any

# The GPU machine has none of these: make them unimportable here too, so a dry run elsewhere proves
# the check needs none (`find_spec` then reports them missing, as accelerate, transformers and TRL
# ask; TRL's profiling imports mlflow when it is there, and mlflow needs pydantic).
for _absent in ("pydantic", "boto3", "mlflow"):
    sys.modules.setdefault(_absent, None)  # type: ignore[arg-type]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
# The GPU machine has not installed the project: its trainer package, and the API package's
# constants (`mtrl_api/__init__.py` imports nothing, so no pydantic), come from the tree.
sys.path[:0] = [str(ROOT / "trainer"), str(ROOT / "api")]

from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import Qwen2Config, Qwen2ForCausalLM  # noqa: E402

from mtrl_trainer.batch import EpisodeSequence, rows_from_sequences  # noqa: E402
from mtrl_trainer.decoder import FastDecoder  # noqa: E402
from mtrl_trainer.grpo import group_advantages  # noqa: E402
from mtrl_trainer.logprobs import SequenceLogprobs  # noqa: E402
from mtrl_trainer.sampling import SamplingParams  # noqa: E402
from mtrl_trainer.update import (  # noqa: E402
    UpdateConfig,
    lora_parameters,
    train_step,
    training_attention,
)

QWEN2_05B = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
             "num_attention_heads": 14, "num_key_value_heads": 2, "vocab_size": 151936,
             "tie_word_embeddings": True, "rope_theta": 1_000_000.0,
             "max_position_embeddings": 32768}
TINY = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512,
        "tie_word_embeddings": True, "max_position_embeddings": 2048}
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
EOS = 2  # the stop token on both sides (TRL's tokenizer below: t2)
H200_NOMINAL_TBPS = 4.3  # effective HBM bandwidth of an H200, for the P6 bound
EPSILON, EPSILON_HIGH = 0.2, 0.28
SDPA_OPS = ("scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention")


# ---------------------------------------------------------------------- shared setup

def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def base_model(shape: dict[str, Any], device: torch.device, dtype: torch.dtype) -> Any:
    """The one initialisation both sides start from: transformers' own (normal, std 0.02) on the
    CPU generator with seed 0, so two builds are bit-identical."""
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**shape, eos_token_id=EOS, pad_token_id=1))
    return model.to(device=device, dtype=dtype)


def lora(model: Any) -> Any:
    return get_peft_model(model, LoraConfig(r=32, lora_alpha=64, lora_dropout=0.0,
                                            target_modules=TARGETS, task_type="CAUSAL_LM"))


def checksum(model: Any) -> float:
    return float(sum(p.detach().double().sum() for n, p in model.named_parameters()
                     if "lora_" not in n))


def prompts_for(args: argparse.Namespace, vocab: int, steps: int) -> list[list[int]]:
    """`completions / group` distinct prompts per step, each repeated `group` times."""
    rng = random.Random(0)
    out = []
    for _ in range(steps * args.completions // args.group):
        prompt = [rng.randrange(3, vocab) for _ in range(args.prompt_tokens)]
        out += [prompt] * args.group
    return out


# ---------------------------------------------------------------------- 1. compiled == eager

def decoder_length(args: argparse.Namespace) -> int:
    """The decoder's length: a prompt, its completion and a little room (one value for both
    modes, so --eager measures the same cache as the compiled check)."""
    return args.prompt_tokens + args.new_tokens + 16


def check_compiled(model: Any, args: argparse.Namespace, device: torch.device) -> dict[str, Any]:
    prompts = prompts_for(args, model.config.vocab_size, 1)[:: args.group][: args.check_rows]
    budgets = [args.check_tokens] * len(prompts)
    # The sampling the benchmark uses (so its compiled graph is this one), with the same noise
    # on both sides: equal logits give equal draws.
    params = SamplingParams(temperature=1.0, stop_token_ids=frozenset({EOS}))
    length = decoder_length(args)
    model.eval()
    eager_decoder = FastDecoder(model, rows=args.completions, max_length=length, compile_step=False)
    started = time.perf_counter()
    eager = eager_decoder.generate(prompts, budgets, params,
                                   generator=torch.Generator(device).manual_seed(1))
    eager_s = time.perf_counter() - started
    compiled_decoder = FastDecoder(model, rows=args.completions, max_length=length,
                                   compile_step=True)
    sync(device)
    started = time.perf_counter()
    compiled = compiled_decoder.generate(prompts, budgets, params,
                                         generator=torch.Generator(device).manual_seed(1))
    sync(device)
    first_s = time.perf_counter() - started
    rows_equal, worst, diverged = 0, 0.0, []
    for a, b in zip(eager, compiled, strict=True):
        same = next((i for i, (x, y) in enumerate(zip(a.token_ids, b.token_ids, strict=False))
                     if x != y), min(len(a.token_ids), len(b.token_ids)))
        rows_equal += a.token_ids == b.token_ids
        if a.token_ids != b.token_ids:
            diverged.append(same)
        if same:
            worst = max(worst, max(abs(x - y) for x, y in zip(a.logprobs[:same], b.logprobs[:same],
                                                                strict=True)))
    return {
        "rows": len(prompts), "new_tokens": args.check_tokens, "rows_equal": rows_equal,
        "first_divergence": diverged, "max_abs_logprob_diff": worst,
        "tolerance": args.logprob_tolerance,
        "passed": rows_equal == len(prompts) and worst <= args.logprob_tolerance,
        "eager_s": eager_s, "compile_and_first_run_s": first_s,
        "decoder": compiled_decoder,
    }


# ---------------------------------------------------------------------- 2. attention kernel

def sdpa_ops(fn: Any, device: torch.device) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        sync(device)
    names = {e.key for e in prof.key_averages()}
    return sorted(n for n in names if n.startswith("aten::") and any(s in n for s in SDPA_OPS)
                  and n != "aten::scaled_dot_product_attention")


def time_us(fn: Any, device: torch.device, repeat: int = 50) -> float:
    fn()
    sync(device)
    started = time.perf_counter()
    for _ in range(repeat):
        fn()
    sync(device)
    return (time.perf_counter() - started) / repeat * 1e6


def check_attention(model: Any, args: argparse.Namespace, device: torch.device,
                    dtype: torch.dtype) -> dict[str, Any]:
    config = model.config
    heads, kv = config.num_attention_heads, config.num_key_value_heads
    head_dim = config.hidden_size // heads
    group, batch = heads // kv, args.completions
    span = 1 << max(6, (args.prompt_tokens + args.new_tokens - 1).bit_length())
    gen = torch.Generator(device).manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device).to(dtype)

    q, k, v = rand(batch, heads, 1, head_dim), rand(batch, kv, span, head_dim), rand(
        batch, kv, span, head_dim)
    valid = torch.arange(span, device=device)[None, :] < torch.randint(
        1, span, (batch, 1), generator=gen, device=device)
    bool_mask = valid[:, None, None, :]
    float_mask = torch.zeros(valid.shape, dtype=dtype, device=device).masked_fill(
        ~valid, float("-inf"))[:, None, None, :].expand(batch, 1, group, span)

    def previous() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=bool_mask, enable_gqa=True)

    def folded() -> torch.Tensor:
        return F.scaled_dot_product_attention(q.reshape(batch, kv, group, head_dim), k, v,
                                              attn_mask=float_mask)

    same = torch.allclose(previous().float(), folded().reshape(batch, heads, 1, head_dim).float(),
                          atol=2e-2 if dtype != torch.float32 else 1e-5)
    # The kernel inside the decoder's own step (eager, so the profiler sees the aten call).
    decoder = FastDecoder(model, rows=8, max_length=args.prompt_tokens + 32, compile_step=False)
    prompt = prompts_for(args, config.vocab_size, 1)[:1]
    in_decoder = sdpa_ops(lambda: decoder.generate(prompt, [16], SamplingParams(0.0)), device)
    return {
        "shape": {"batch": batch, "q_heads": heads, "kv_heads": kv, "head_dim": head_dim,
                  "keys": span},
        "previous_layout": {"ops": sdpa_ops(previous, device), "us": time_us(previous, device)},
        "folded_layout": {"ops": sdpa_ops(folded, device), "us": time_us(folded, device)},
        "decoder_step_ops": in_decoder,
        "same_output": same,
    }


# ---------------------------------------------------------------------- 3-6. ours

def ours(model: Any, decoder: FastDecoder, args: argparse.Namespace,
         device: torch.device) -> dict[str, Any]:
    vocab = model.config.vocab_size
    scorer = SequenceLogprobs(model)
    optimizer = torch.optim.AdamW(lora_parameters(model), lr=1e-5, weight_decay=0.0)
    config = UpdateConfig(epsilon=EPSILON, epsilon_high=EPSILON_HIGH, beta=0.0, temperature=1.0,
                          micro_batches=args.micro_batches)
    params = SamplingParams(temperature=1.0, stop_token_ids=frozenset({EOS}))
    gen = torch.Generator(device).manual_seed(0)
    rng = random.Random(0)
    all_prompts = prompts_for(args, vocab, args.warmup + args.steps)
    steps: list[dict[str, Any]] = []
    for step in range(args.warmup + args.steps):
        prompts = all_prompts[step * args.completions: (step + 1) * args.completions]
        model.eval()
        decoder.invalidate()  # new weights since the last step
        sync(device)
        t0 = time.perf_counter()
        outs = decoder.generate(prompts, [args.new_tokens] * len(prompts), params, generator=gen)
        sync(device)
        t1 = time.perf_counter()
        rewards = torch.tensor([rng.random() for _ in outs])
        adv = group_advantages(rewards, args.group).values.tolist()
        sequences = [EpisodeSequence(i, list(p) + o.token_ids,
                                     [0] * len(p) + [1] * len(o.token_ids),
                                     [0.0] * len(p) + [min(x, 0.0) for x in o.logprobs], a)
                     for i, (p, o, a) in enumerate(zip(prompts, outs, adv, strict=True))]
        rows = rows_from_sequences(sequences, loss_type="dapo",
                                   max_completion_length=args.new_tokens,
                                   max_sequence_length=args.prompt_tokens + args.new_tokens,
                                   micro_batches=args.micro_batches)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        stats = train_step(scorer, optimizer, rows, config, pad_token_id=1, device=device)
        sync(device)
        t2 = time.perf_counter()
        steps.append({
            "step": step + 1, "timed": step >= args.warmup, "gen_s": t1 - t0, "train_s": t2 - t1,
            "step_s": t2 - t0, "completion_tokens": sum(len(o.token_ids) for o in outs),
            "loss": stats.loss, "grad_norm": stats.grad_norm,
            "clip_fraction": stats.clip_fraction, "logprob_gap": stats.logprob_gap,
            "train_peak_gib": (torch.cuda.max_memory_allocated() / 2**30
                               if device.type == "cuda" else None),
        })
    timed = [s for s in steps if s["timed"]]
    tokens = sum(s["completion_tokens"] for s in timed)
    return {
        "steps": steps,
        "step_s": sum(s["step_s"] for s in timed) / len(timed),
        "completion_tok_s": tokens / sum(s["step_s"] for s in timed),
        "generation_tok_s": tokens / sum(s["gen_s"] for s in timed),
        "finite": all(math.isfinite(s["loss"]) and math.isfinite(s["grad_norm"]) for s in steps),
        "clip_fraction_step1": steps[0]["clip_fraction"],
        "logprob_gap_step1": steps[0]["logprob_gap"],
        "train_peak_gib": max((s["train_peak_gib"] or 0.0) for s in steps) or None,
        "decode_steps": decoder.steps,
    }


# ---------------------------------------------------------------------- 3-4. TRL

def number(value: Any) -> float:
    """A logged value (transformers 5 formats them as strings) as a float, NaN if not one."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def nan_origin(error: BaseException | None, caught: list[warnings.WarningMessage]) -> dict[str, Any]:
    """What autograd's anomaly mode says about a NaN gradient: its error names the backward
    function ("Function 'MmBackward0' returned nan values in its 0th output.") and a warning
    before it holds the traceback of the forward call that built that function."""
    text = str(error) if error else ""
    named = re.search(r"Function '(\w+)' returned nan values in its (\d+)\w* output", text)
    traces = [str(w.message) for w in caught if "Traceback of forward call" in str(w.message)]
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)\n\s*(.*)', traces[-1] if traces else "")
    return {
        "backward_function": named.group(1) if named else None,
        "output_index": int(named.group(2)) if named else None,
        # The innermost frames: the module and line whose forward made the NaN's backward.
        "forward_frames": [f"{Path(f).name}:{line} {fn}: {code.strip()}"
                           for f, line, fn, code in frames[-8:]],
        "error": text[:300] or None,
    }


def trl_in_child(shape: dict[str, Any], args: argparse.Namespace, device: torch.device,
                 dtype: torch.dtype, anomaly: bool = False,
                 cudnn: bool = False) -> dict[str, Any]:
    """`trl_side` in a fresh process: on the GPU TRL's step 2 was seen to die in a CUDA
    device-side assert (GUIDE), which leaves that process's CUDA context unusable; a child keeps
    the check and TRL's second try (anomaly detection) on a clean one."""
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(
            1, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            return pool.submit(trl_side, shape, args, device, dtype, anomaly, cudnn).result()
        except Exception as exc:  # the child died (BrokenProcessPool) or could not send back
            return {"error": f"TRL's process: {type(exc).__name__}: {exc}"[:500],
                    "finite": False}


def trl_side(shape: dict[str, Any], args: argparse.Namespace, device: torch.device,
             dtype: torch.dtype, anomaly: bool = False, cudnn: bool = False) -> dict[str, Any]:
    """TRL's GRPOTrainer (HF generate, no vLLM) on the same weights, prompts and batch layout;
    with `anomaly`, one step under autograd's anomaly detection, and where its NaN came from.
    Its attention runs without cuDNN's kernel, as `engine: trl` trains
    (update.training_attention; here its generation too), unless `cudnn` (torch's default)."""
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
                                        eos_token=f"t{EOS}")
    # TRL repeats each dataset prompt `num_generations` times itself.
    prompts = [" ".join(f"t{i}" for i in p)
               for p in prompts_for(args, vocab, args.warmup + args.steps)[:: args.group]]
    model = base_model(shape, device, dtype)
    weights = checksum(model)
    times: list[float] = []
    logged: list[dict[str, float]] = []
    rng = random.Random(0)

    class Timer(TrainerCallback):
        def on_step_begin(self, *_: Any, **__: Any) -> None:
            sync(device)
            times.append(time.perf_counter())

        def on_step_end(self, *_: Any, **__: Any) -> None:
            sync(device)
            times[-1] = time.perf_counter() - times[-1]

        def on_log(self, _a: Any, _s: Any, _c: Any, logs: dict[str, Any] | None = None,
                   **__: Any) -> None:
            if logs and "loss" in logs:
                logged.append({k: number(v) for k, v in logs.items()})

    config = trl.GRPOConfig(
        output_dir=str(args.out_dir / "trl"), per_device_train_batch_size=args.completions //
        args.micro_batches, gradient_accumulation_steps=args.micro_batches,
        num_generations=args.group, max_completion_length=args.new_tokens,
        max_steps=1 if anomaly else args.warmup + args.steps, logging_steps=1, report_to=[],
        save_strategy="no",
        bf16=dtype == torch.bfloat16, use_cpu=device.type == "cpu", learning_rate=1e-5,
        gradient_checkpointing=False, shuffle_dataset=False, loss_type="dapo", beta=0.0,
        epsilon=EPSILON, epsilon_high=EPSILON_HIGH, temperature=1.0, scale_rewards="group",
    )
    trainer = trl.GRPOTrainer(
        model=model, reward_funcs=lambda completions, **_: [rng.random() for _ in completions],
        args=config, train_dataset=Dataset.from_dict({"prompt": prompts}),
        processing_class=tokenizer,
        peft_config=LoraConfig(r=32, lora_alpha=64, lora_dropout=0.0, target_modules=TARGETS,
                               task_type="CAUSAL_LM"),
        callbacks=[Timer()],
    )
    error = None
    failure: Exception | None = None
    caught: list[warnings.WarningMessage] = []
    with contextlib.ExitStack() as stack:
        if not cudnn:
            stack.enter_context(training_attention())
        if anomaly:  # its forward traceback comes as a warning: keep it (else they print)
            caught = stack.enter_context(warnings.catch_warnings(record=True))
            warnings.simplefilter("always")
            stack.enter_context(torch.autograd.detect_anomaly(check_nan=True))
        try:
            trainer.train()
        except Exception as exc:  # TRL's NaN at step 1 ends in a CUDA assert at step 2
            failure, error = exc, f"{type(exc).__name__}: {exc}"[:500]
    timed = times[args.warmup:]
    lengths = [entry.get("completions/mean_length", args.new_tokens) for entry in logged]
    tokens = sum(lengths[args.warmup:]) * args.completions if len(lengths) > args.warmup else 0
    out: dict[str, Any] = {
        "trl_version": trl.__version__, "cudnn_attention": cudnn,
        "weights_checksum": weights, "steps_s": times,
        "logs": logged, "error": error,
        "finite": bool(logged) and all(math.isfinite(e.get("loss", math.nan))
                                       and math.isfinite(e.get("grad_norm", math.nan))
                                       for e in logged),
    }
    if anomaly:
        out["nan_origin"] = nan_origin(failure, caught)
    if timed and tokens:
        out["step_s"] = sum(timed) / len(timed)
        out["completion_tok_s"] = tokens / sum(timed)
    return out


def trl_logprob_kernel(shape: dict[str, Any], args: argparse.Namespace, device: torch.device,
                       dtype: torch.dtype) -> dict[str, Any]:
    """TRL 1.16 scores completions with its own chunked log-prob function (`add_fused_lm_head`),
    a Triton kernel on CUDA and torch ops elsewhere: the one part of TRL's step that differs
    between the GPU (NaN gradients at step 1, docs/trainer.md) and the CPU (finite). Here it runs alone on
    one micro-batch's positions and the model's own head, against log_softmax, values and
    gradients."""
    try:
        from trl.kernels import ChunkedLogProbFunction
    except ImportError as exc:
        return {"skipped": f"trl not importable ({exc})"}
    head = base_model(shape, device, dtype).get_output_embeddings().weight.detach()
    gen = torch.Generator(device).manual_seed(0)
    count = args.completions // args.micro_batches * args.new_tokens
    hidden = torch.randn(count, head.shape[1], generator=gen, device=device).to(dtype)
    targets = torch.randint(0, head.shape[0], (count,), generator=gen, device=device)
    upstream = torch.randn(count, generator=gen, device=device)
    fused_in = hidden.clone().requires_grad_(True)
    fused = ChunkedLogProbFunction.apply(fused_in, head, None, targets, 1.0, 32768, None, 1.0,
                                         ("log_probs",))[0]
    (fused.float() * upstream).sum().backward()
    ref_in = hidden.clone().requires_grad_(True)
    ref = torch.log_softmax((ref_in @ head.T).float(), -1).gather(-1, targets[:, None])[:, 0]
    (ref * upstream).sum().backward()
    assert fused_in.grad is not None and ref_in.grad is not None
    return {
        "positions": count, "path": "triton" if device.type == "cuda" else "torch",
        "values_finite": bool(torch.isfinite(fused).all()),
        "grads_finite": bool(torch.isfinite(fused_in.grad).all()),
        "max_abs_value_diff": float((fused.detach().float() - ref.detach()).abs().max()),
        "max_abs_grad_diff": float((fused_in.grad.float() - ref_in.grad.float()).abs().max()),
    }


def cudnn_attention_check(device: torch.device) -> dict[str, Any]:
    """cuDNN's attention backward against the memory-efficient kernel's on the inputs of
    pytorch/pytorch#196678 (NaN query gradients on H100/H200 from torch 2.11 with an explicit
    mask, a length 64 past a multiple of 128 and a query row of very low logsumexp): a batch
    shaped like TRL's (prompts left-padded, so their first rows are fully masked, 256-token
    completions) at 448 and 384 positions, and the issue's own case (every logit near -120)
    at 704 and 640. Non-finite query-gradient elements per kernel (math: the reference); CUDA
    only."""
    if device.type != "cuda":
        return {"skipped": "needs CUDA"}
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def case(length: int, low_logits: bool) -> dict[str, Any]:
        gen = torch.Generator(device).manual_seed(0)
        dim, pad = 64, 64
        q, k, v = (torch.randn(2, 2, length, dim, generator=gen, device=device) for _ in range(3))
        causal = torch.ones(length, length, dtype=torch.bool, device=device).tril()
        mask = causal[None, None].repeat(2, 1, 1, 1)
        if low_logits:
            q, k = q * 0.1, k * 0.1
            q[..., 0], k[..., 0] = 1.0, -120 * math.sqrt(dim)
        else:  # the second sequence's prompt is `pad` tokens shorter: left padding
            mask[1, :, :, :pad] = False
        out: dict[str, Any] = {}
        for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                              ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                              ("math", SDPBackend.MATH)):
            leaf = q.to(torch.bfloat16).requires_grad_()
            try:
                with sdpa_kernel([backend]):
                    o = F.scaled_dot_product_attention(leaf, k.to(torch.bfloat16),
                                                       v.to(torch.bfloat16), attn_mask=mask)
                o.float().backward(torch.randn(o.shape, generator=gen, device=device))
                assert leaf.grad is not None
                out[name] = int((~torch.isfinite(leaf.grad)).sum())
            except RuntimeError as exc:  # no such kernel for these inputs, or here
                out[name] = "no kernel" if "backend" in str(exc) or "kernel" in str(exc) \
                    else f"{type(exc).__name__}: {exc}"[:160]
        return out

    return {"left_padding_448": case(448, False), "left_padding_384": case(384, False),
            "low_logits_704": case(704, True), "low_logits_640": case(640, True)}


# ---------------------------------------------------------------------- 5. decode bound

def bandwidth_bytes_per_s(device: torch.device, tiny: bool) -> float:
    """A device-to-device copy: it reads and writes every byte once."""
    size = (256 << 20) if tiny or device.type == "cpu" else (2 << 30)
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    seconds = time_us(lambda: dst.copy_(src), device, repeat=10) / 1e6
    return 2 * size / seconds


def decode_bound(model: Any, args: argparse.Namespace, measured: float,
                 nominal: float | None) -> dict[str, Any]:
    """Per decode step the weights are read once for the whole batch, plus every row's keys and
    values (at the mean length of the completion phase)."""
    config = model.config
    weight_bytes = sum(p.numel() * p.element_size() for p in {id(p): p for p in
                                                              model.parameters()}.values())
    head_dim = config.hidden_size // config.num_attention_heads
    mean_len = args.prompt_tokens + args.new_tokens / 2
    element = next(model.parameters()).element_size()
    kv_bytes = (2 * config.num_hidden_layers * args.completions * config.num_key_value_heads
                * head_dim * mean_len * element)
    per_step = weight_bytes + kv_bytes
    out = {"weight_bytes": weight_bytes, "kv_bytes_per_step": kv_bytes,
           "measured_bandwidth_gbps": measured / 1e9,
           "bound_tok_s_measured": measured / per_step * args.completions}
    if nominal:
        out["bound_tok_s_nominal"] = nominal / per_step * args.completions
    return out


# ---------------------------------------------------------------------- report

def fmt(value: Any, spec: str = ",.0f") -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "NO"
    return format(value, spec) if isinstance(value, int | float) else str(value)


def markdown(report: dict[str, Any]) -> str:
    c, a = report.get("compiled", {}), report.get("attention", {})
    o, t, b = report.get("ours", {}), report.get("trl", {}), report.get("bound", {})
    lines = [f"> device: {report['device']}, torch {report['torch']}, transformers "
             f"{report['transformers']}, shapes: {report['shape_name']}, "
             f"{report['args']['completions']} completions x {report['args']['new_tokens']} new "
             f"tokens, prompt {report['args']['prompt_tokens']} tokens", "",
             "| # | check | mtrl trainer | TRL GRPOTrainer |", "|---|---|---:|---:|"]

    def row(n: str, name: str, mine: str, theirs: str = "-") -> None:
        lines.append(f"| {n} | {name} | {mine} | {theirs} |")

    if c:
        row("1", f"compiled = eager decode (bf16, same noise, {c['rows']} rows x "
            f"{c['new_tokens']} tokens)",
            f"{fmt(c['passed'])}: {c['rows_equal']}/{c['rows']} rows equal, max "
            f"\\|Δlogprob\\| {c['max_abs_logprob_diff']:.2e} (tol {c['tolerance']})")
        row("1", "compile + first run (s) / eager run (s)",
            f"{c['compile_and_first_run_s']:.1f} / {c['eager_s']:.1f}")
    if a:
        row("2", "attention kernel, previous layout (bool mask, enable_gqa)",
            f"{', '.join(a['previous_layout']['ops'])} ({a['previous_layout']['us']:.0f} µs)")
        row("2", "attention kernel, decoder layout (folded groups, float mask)",
            f"{', '.join(a['folded_layout']['ops'])} ({a['folded_layout']['us']:.0f} µs)")
        row("2", "kernel in the decoder's own step", ", ".join(a["decoder_step_ops"]))
    if o:
        row("3", "completion tokens/s (whole step)", fmt(o["completion_tok_s"]),
            fmt(t.get("completion_tok_s")))
        row("3", "step time (s)", fmt(o["step_s"], ".2f"), fmt(t.get("step_s"), ".2f"))
        row("3", "generation-only tokens/s", fmt(o["generation_tok_s"]))
        if t.get("completion_tok_s"):
            row("3", "speed-up (whole step, same formula)",
                f"{o['completion_tok_s'] / t['completion_tok_s']:.1f}x")
        row("4", "losses and grad norms finite", fmt(o["finite"]), fmt(t.get("finite")))
        row("4", "step-1 loss / grad norm",
            f"{o['steps'][0]['loss']:.4g} / {o['steps'][0]['grad_norm']:.4g}",
            " / ".join(fmt(t['logs'][0].get(k), ".4g") for k in ("loss", "grad_norm"))
            if t.get("logs") else "-")
        row("4", "training peak memory (GiB)", fmt(o.get("train_peak_gib"), ".1f"))
    if b:
        row("5", "decode bound, measured bandwidth "
            f"({b['measured_bandwidth_gbps']:,.0f} GB/s copy)", fmt(b["bound_tok_s_measured"]))
        row("5", "fraction of that bound (generation tok/s)",
            f"{o['generation_tok_s'] / b['bound_tok_s_measured']:.1%}" if o else "-")
        if "bound_tok_s_nominal" in b:
            row("5", f"decode bound at {H200_NOMINAL_TBPS} TB/s (nominal)",
                fmt(b["bound_tok_s_nominal"]))
            row("5", "fraction of the nominal bound",
                f"{o['generation_tok_s'] / b['bound_tok_s_nominal']:.1%}" if o else "-")
    if o:
        row("6", "clip fraction at step 1", f"{o['clip_fraction_step1']:.4f}",
            fmt(t["logs"][0].get("clip_ratio/region_mean"), ".4f") if t.get("logs") else "-")
        row("6", "mean \\|trainer - sampler logprob\\| at step 1", f"{o['logprob_gap_step1']:.2e}")
    k = report.get("trl_kernel", {})
    if k and "skipped" not in k:
        row("4", f"TRL's chunked log-prob kernel ({k['path']}) vs log_softmax, "
            f"{k['positions']} positions: values / grads finite, max \\|Δ\\| value / grad", "-",
            f"{fmt(k['values_finite'])} / {fmt(k['grads_finite'])}, "
            f"{k['max_abs_value_diff']:.1e} / {k['max_abs_grad_diff']:.1e}")
    for key, kernels in (("trl_anomaly", "without cuDNN's attention"),
                         ("trl_cudnn", "with torch's default attention kernels")):
        tried = report.get(key, {})
        if origin := tried.get("nan_origin"):
            norm = fmt(tried["logs"][0].get("grad_norm"), ".4g") if tried.get("logs") else "-"
            row("4", f"TRL's step 1 {kernels}, under anomaly detection: grad norm; the first "
                "backward function to return NaN; its forward call", "-",
                f"{norm}; {origin['backward_function'] or 'none'}; "
                f"{' < '.join(reversed(origin['forward_frames'][-3:])) or '-'}")
    cudnn = report.get("cudnn_attention", {})
    for case, counts in cudnn.items() if "skipped" not in cudnn else ():
        row("4", f"pytorch#196678 ({case.replace('_', ' ')} positions): non-finite query "
            "gradients, cuDNN / memory-efficient / math attention",
            " / ".join(fmt(counts[k], ",") for k in ("cudnn", "efficient", "math")))
    if "project_imported" in report:
        lines += ["", "> pydantic, boto3 and mlflow were unimportable (as on the GPU machine); "
                  "mtrl_operator / mtrl_rollout imported: "
                  f"{', '.join(report['project_imported']) or 'none'}"]
    for key in ("skipped", "error"):
        if t.get(key):
            lines += ["", f"TRL: {t[key]}"]
    return "\n".join(lines)


def save(report: dict[str, Any], out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    clean = {k: v for k, v in report.items()}
    if "compiled" in clean:
        clean["compiled"] = {k: v for k, v in clean["compiled"].items() if k != "decoder"}
    (out_dir / "gpu_check.json").write_text(json.dumps(clean, indent=2, default=str))
    (out_dir / "gpu_check.md").write_text(markdown(report) + "\n")


def main() -> int:
    import transformers

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="tiny config (the CPU dry run)")
    parser.add_argument("--out-dir", type=Path, default=ROOT / "out" / "gpu-check")
    parser.add_argument("--completions", type=int, default=128)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--micro-batches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--warmup", type=int, default=1, help="untimed first steps (compile)")
    parser.add_argument("--check-rows", type=int, default=16)
    parser.add_argument("--check-tokens", type=int, default=64)
    parser.add_argument("--logprob-tolerance", type=float, default=0.05,
                        help="bf16 compiled vs eager, max |Δlogprob| on equal tokens")
    parser.add_argument("--no-trl", action="store_true")
    parser.add_argument("--eager", action="store_true",
                        help="skip checks 1 and 2 and decode eagerly: on an H200 compiling the "
                        "Qwen2-0.5B decode step alone took 270 s of an 8-minute lease")
    args = parser.parse_args()
    if args.tiny:
        args.completions, args.new_tokens, args.prompt_tokens = 16, 16, 8
        args.micro_batches, args.steps, args.check_rows, args.check_tokens = 2, 1, 2, 8
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16
    shape = TINY if args.tiny else QWEN2_05B
    report: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device.type == "cuda"
        else f"CPU ({platform.processor() or platform.machine()})",
        "torch": torch.__version__, "transformers": transformers.__version__,
        "shape_name": "tiny" if args.tiny else "Qwen2-0.5B", "shape": shape,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
    }
    started = time.perf_counter()
    model = lora(base_model(shape, device, dtype))
    report["weights_checksum"] = checksum(model)

    def stage(name: str, value: Any) -> None:
        report[name] = value
        report["elapsed_s"] = time.perf_counter() - started
        save(report, args.out_dir)
        print(f"[{report['elapsed_s']:6.1f}s] {name} done", flush=True)

    if args.eager:
        decoder = FastDecoder(model, rows=args.completions, max_length=decoder_length(args),
                              compile_step=False)
    else:
        stage("compiled", check_compiled(model, args, device))
        stage("attention", check_attention(model, args, device, dtype))
        decoder = report["compiled"]["decoder"]
    stage("ours", ours(model, decoder, args, device))
    nominal = H200_NOMINAL_TBPS * 1e12 if device.type == "cuda" and not args.tiny else None
    stage("bound", decode_bound(model, args, bandwidth_bytes_per_s(device, args.tiny), nominal))
    # pydantic and boto3 are blocked above; the project's packages that need them must not load.
    report["project_imported"] = sorted(m for m in ("mtrl_operator", "mtrl_rollout")
                                        if m in sys.modules)
    del model
    if device.type == "cuda":
        torch.cuda.empty_cache()
    stage("cudnn_attention", cudnn_attention_check(device))
    stage("trl", {"skipped": "--no-trl"} if args.no_trl
          else trl_in_child(shape, args, device, dtype))
    if not args.no_trl and "skipped" not in report["trl"]:
        stage("trl_kernel", trl_logprob_kernel(shape, args, device, dtype))
        # Non-finite on the GPU: its step 1 once more, under anomaly detection (the dry run
        # takes these paths always, so they are exercised before the GPU needs them).
        if not report["trl"]["finite"] or args.tiny:
            stage("trl_anomaly", trl_in_child(shape, args, device, dtype, anomaly=True))
        # With torch's default kernels (cuDNN's attention on an H200), as TRL runs by itself.
        if device.type == "cuda" or args.tiny:
            stage("trl_cudnn", trl_in_child(shape, args, device, dtype, anomaly=True,
                                            cudnn=True))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
