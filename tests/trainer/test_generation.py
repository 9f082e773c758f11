"""The generation service: continuous admission, prefix reuse across an episode's turns, weight
updates between completions, and errors that never leave an episode waiting."""

from __future__ import annotations

import asyncio
import threading

import pytest

torch = pytest.importorskip("torch")

from mtrl_api.run import ModelSpec  # noqa: E402
from mtrl_rollout.protocol import ChatMessage, GenerateRequest  # noqa: E402
from mtrl_trainer.generation import GenerationService, SamplingConfig  # noqa: E402
from mtrl_trainer.models import load_policy  # noqa: E402

ATTEMPT = "att"


def service(max_new: int = 8) -> GenerationService:
    spec = ModelSpec.model_validate({"name": "random:tiny-qwen2", "dtype": "float32",
                                     "lora": {"rank": 4, "alpha": 8, "dropout": 0.0}})
    policy = load_policy(spec, seed=1, device=torch.device("cpu"))
    return GenerationService(policy, SamplingConfig(1.0, 1.0, max_new, 256, max_batch=8),
                             model_lock=threading.Lock(), attempt=ATTEMPT, seed=0)


def request(sample: str, turn: int, messages: list[ChatMessage], **fields: object) -> GenerateRequest:
    return GenerateRequest(run_id="r", step=0, group_id="g", sample_id=sample, policy_version=0,
                           request_id=f"{sample}-{turn}", turn=turn, messages=messages,
                           reply_queue_url="unused", **fields)


def test_turns_of_an_episode_reuse_its_prefix_and_updates_bump_the_version() -> None:
    svc = service()

    async def play() -> None:
        history = [ChatMessage(role="user", content="hello there")]
        first = await svc.sample(request(f"{ATTEMPT}-1", 0, history))
        assert first.error is None and first.policy_version == 0
        history += [first.choices[0].message, ChatMessage(role="user", content="and again")]
        reused_before = svc.decoder.reused_tokens
        second = await svc.sample(request(f"{ATTEMPT}-1", 1, history))
        # The second prompt extends the first prompt and completion, so only new text is fed.
        cached = len(first.prompt_token_ids) + len(first.choices[0].token_ids) - 1
        assert svc.decoder.reused_tokens - reused_before == cached
        assert second.prompt_token_ids[:cached] == (
            first.prompt_token_ids + first.choices[0].token_ids)[:cached]
        with svc._lock:  # what Run._update does after the optimizer step
            svc.update_policy(1)
        history += [second.choices[0].message, ChatMessage(role="user", content="last")]
        reused_before = svc.decoder.reused_tokens
        third = await svc.sample(request(f"{ATTEMPT}-1", 2, history))
        assert third.policy_version == 1
        assert svc.decoder.reused_tokens == reused_before  # stale keys are never reused

    asyncio.run(play())
    svc.close()
    assert svc.served[f"{ATTEMPT}-1"] == 3


def test_an_update_waits_only_for_the_completions_being_decoded() -> None:
    """Asynchronous GRPO feeds the sampler without pause: eight episodes ask again the moment
    they are answered. An update (Run._update: paused, then the model lock) still gets the lock
    after the completions in flight, not when the stream ends; what is answered after it is
    sampled by the new version, and no completion straddles the two."""
    svc = service(max_new=4)
    episodes, turns = 8, 6
    served_at_update: list[int] = []

    def update() -> None:
        with svc.paused(), svc._lock:
            served_at_update.append(sum(svc.served.values()))
            svc.update_policy(1)

    async def play() -> list[int]:
        versions: list[int] = []
        streaming = asyncio.Event()  # a few answers are out: the stream is going

        async def episode(i: int) -> None:
            for turn in range(turns):
                hello = [ChatMessage(role="user", content=f"episode {i} turn {turn}")]
                answer = await svc.sample(request(f"{ATTEMPT}-{i}", turn, hello))
                assert answer.error is None
                versions.append(answer.policy_version)
                if len(versions) >= 4:
                    streaming.set()

        async def updater() -> None:
            await streaming.wait()
            await asyncio.to_thread(update)

        await asyncio.gather(updater(), *(episode(i) for i in range(episodes)))
        return versions

    versions = asyncio.run(play())
    svc.close()
    assert served_at_update[0] < episodes * turns // 2, served_at_update
    assert versions == sorted(versions) and versions[-1] == 1 and versions[0] == 0


def test_refusals_and_a_failing_decoder_answer_with_errors() -> None:
    svc = service()
    hello = [ChatMessage(role="user", content="hi")]

    async def play() -> list[str | None]:
        answers = await asyncio.gather(
            svc.sample(request("other-1", 0, hello)),  # a killed predecessor's episode
            svc.sample(request(f"{ATTEMPT}-2", 0, hello, max_length=3)),  # no budget left
            svc.sample(request(f"{ATTEMPT}-3", 0, hello)),
        )
        return [a.error for a in answers]

    errors = asyncio.run(play())
    assert errors[0] == "request from another trainer attempt"
    assert errors[1] == "episode token budget exhausted"
    assert errors[2] is None

    def broken(admit: bool = True) -> None:
        raise RuntimeError("device lost")

    svc.decoder.pump = broken  # type: ignore[method-assign]
    error = asyncio.run(asyncio.wait_for(play_one(svc, hello), 30))
    assert error is not None and "device lost" in error
    svc.close()


async def play_one(svc: GenerationService, messages: list[ChatMessage]) -> str | None:
    return (await svc.sample(request(f"{ATTEMPT}-4", 0, messages))).error
