import asyncio
import time

import aiohttp
import pytest

from mtrl_rollout.protocol import ChatMessage, RolloutRequest, StopReason
from mtrl_worker.environments.base import EpisodeLimitReached
from mtrl_worker.environments.target import TargetEnvironment
from mtrl_worker.environments.wordle import WordleEnvironment
from mtrl_worker.episode import run_episode
from mtrl_worker.proxy import PolicyProxy
from mtrl_worker.rewards import resolve_weights
from mtrl_worker.session import EpisodeSession

from .fakes import ScriptedGenerator


def _request(**overrides: object) -> RolloutRequest:
    fields = dict(
        run_id="uid",
        step=2,
        group_id="g1",
        sample_id="s1",
        policy_version=5,
        data={"secret": "crane"},
        max_length=1000,
    )
    return RolloutRequest(**(fields | overrides))


def _session(replies: list[str], max_turns: int = 6, **overrides: object):
    generator = ScriptedGenerator(replies)
    session = EpisodeSession(
        _request(**overrides),
        generator,
        reply_queue_url="http://q/reply",
        max_turns=max_turns,
        generate_timeout_s=30,
        deadline=time.time() + 60,
    )
    return session, generator


async def test_session_sends_ids_and_records_tokens() -> None:
    session, generator = _session(["hi", "yo"])
    user = [ChatMessage(role="user", content="x")]
    first = await session.chat(user, max_tokens=8)
    await session.chat(user)
    assert first.token_ids == [ord("h"), ord("i")] and first.logprobs == [-0.25, -0.25]
    sent = generator.requests[0]
    assert (sent.run_id, sent.step, sent.group_id, sent.sample_id, sent.policy_version) == (
        "uid",
        2,
        "g1",
        "s1",
        5,
    )
    assert [r.turn for r in generator.requests] == [0, 1]
    assert sent.sampling.max_tokens == 8 and sent.reply_queue_url == "http://q/reply"
    assert [t.completion_token_ids for t in session.turns] == [[104, 105], [121, 111]]
    assert session.turns[0].policy_version == 1  # the version that actually sampled


async def test_session_enforces_turn_and_token_limits() -> None:
    session, _ = _session(["a"] * 3, max_turns=2)
    user = [ChatMessage(role="user", content="x")]
    await session.chat(user)
    await session.chat(user)
    with pytest.raises(EpisodeLimitReached):
        await session.chat(user)
    assert session.stop_reason is StopReason.MAX_TURNS
    long_session, _ = _session(["a" * 20, "b"], max_length=10)
    await long_session.chat(user)
    with pytest.raises(EpisodeLimitReached):
        await long_session.chat(user)
    assert long_session.stop_reason is StopReason.MAX_LENGTH


async def test_openai_compatible_proxy_records_the_episode() -> None:
    session, _ = _session(["<guess>slate</guess>", "done"], max_turns=2)
    proxy = PolicyProxy()
    await proxy.start()
    proxy.register(session)
    try:
        url = f"{session.openai_base_url}/chat/completions"
        body = {"model": "whatever", "messages": [{"role": "user", "content": "go"}], "logprobs": True}
        async with aiohttp.ClientSession() as http:
            auth = {"Authorization": f"Bearer {session.api_key}"}
            async with http.post(url, json=body, headers=auth) as resp:
                assert resp.status == 200
                reply = await resp.json()
            assert reply["object"] == "chat.completion"
            assert reply["choices"][0]["message"] == {"role": "assistant", "content": "<guess>slate</guess>"}
            assert len(reply["choices"][0]["logprobs"]["content"]) == 20
            header = {"X-MTRL-Episode": session.api_key}
            async with http.post(url, json=body, headers=header) as resp:
                assert resp.status == 200
            async with http.post(url, json=body, headers=auth) as resp:
                assert resp.status == 400
                assert (await resp.json())["error"]["code"] == "max_turns"
            async with http.post(url, json=body | {"stream": True}, headers=auth) as resp:
                assert resp.status == 400
            async with http.post(url, json=body, headers={"Authorization": "Bearer nope"}) as resp:
                assert resp.status == 401
            async with http.get(f"{session.openai_base_url}/models") as resp:
                assert (await resp.json())["data"][0]["id"] == "mtrl-policy"
    finally:
        await proxy.stop()
    assert [t.turn for t in session.turns] == [0, 1]
    assert session.stop_reason is StopReason.MAX_TURNS


class CrashingEnvironment(WordleEnvironment):
    name = "wordle"

    def episode(self, task, limits):
        raise RuntimeError("environment bug")


class SlowGenerator(ScriptedGenerator):
    async def generate(self, request, timeout_s):
        await asyncio.sleep(10)
        raise AssertionError("unreachable")


async def test_failures_still_return_a_result_at_the_low_end() -> None:
    env = CrashingEnvironment()
    weights = resolve_weights(env.components, {})
    session, _ = _session([])
    request = _request(rewards={"range": [-1.0, 1.0]})
    crashed = await run_episode(env, weights, request, session, max_turns=6, timeout_s=5)
    assert crashed.stop_reason is StopReason.ERROR and crashed.aggregate_reward_score == -1.0
    assert crashed.metric("episode_error") == 1.0 and "environment bug" in crashed.error

    slow = EpisodeSession(
        request,
        SlowGenerator([]),
        reply_queue_url="q",
        max_turns=6,
        generate_timeout_s=30,
        deadline=time.time() + 60,
    )
    timed_out = await run_episode(WordleEnvironment(), weights, request, slow, max_turns=6, timeout_s=0.2)
    assert timed_out.stop_reason is StopReason.TIMEOUT
    assert timed_out.metric("episode_timeout") == 1.0 and timed_out.aggregate_reward_score == -1.0

    misrouted = await run_episode(
        WordleEnvironment(), weights, _request(environment="coding"), session, max_turns=6, timeout_s=5
    )
    assert misrouted.stop_reason is StopReason.ERROR and "not 'wordle'" in misrouted.error


class StallingGenerator(ScriptedGenerator):
    """Answers its scripted replies, then never again; waits as PolicyClient does."""

    async def generate(self, request, timeout_s):
        if len(self.requests) < len(self.replies):
            return await super().generate(request, timeout_s)
        self.requests.append(request)
        await asyncio.wait_for(asyncio.Event().wait(), timeout_s)
        raise AssertionError("unreachable")


def _stalling_session(request: RolloutRequest, *, generate_timeout_s: float, episode_s: float):
    return EpisodeSession(
        request,
        StallingGenerator(["<guess>slate</guess>"]),
        reply_queue_url="q",
        max_turns=6,
        generate_timeout_s=generate_timeout_s,
        deadline=time.time() + episode_s,
    )


async def test_a_stalled_generation_is_told_apart_from_the_episode_s_own_timeout() -> None:
    env = WordleEnvironment()
    weights = resolve_weights(env.components, {})
    request = _request(rewards={"range": [-1.0, 1.0]})
    stalled = _stalling_session(request, generate_timeout_s=0.1, episode_s=30)
    result = await run_episode(env, weights, request, stalled, max_turns=6, timeout_s=30)
    assert result.stop_reason is StopReason.TIMEOUT and result.metric("episode_timeout") == 1.0
    assert result.error == ("turn 1: no completion within 0.1s (MTRL_GENERATE_TIMEOUT_S); "
                            "the trainer's sampler is slow or stopped")
    assert result.aggregate_reward_score == -1.0 and len(result.trajectory) == 1

    # The episode's deadline is the nearer limit: the generation's wait ends with it, and the
    # episode is what timed out.
    late = _stalling_session(request, generate_timeout_s=30, episode_s=0.2)
    result = await run_episode(env, weights, request, late, max_turns=6, timeout_s=0.2)
    assert result.stop_reason is StopReason.TIMEOUT and result.error == "episode exceeded 0.2s"


async def test_the_proxy_answers_a_stalled_generation_with_504_and_the_reason() -> None:
    proxy = PolicyProxy()
    await proxy.start()
    stalled = _stalling_session(_request(), generate_timeout_s=0.1, episode_s=30)
    late = _stalling_session(_request(), generate_timeout_s=30, episode_s=0.2)
    body = {"model": "m", "messages": [{"role": "user", "content": "go"}]}
    errors = []
    try:
        async with aiohttp.ClientSession() as http:
            for session in (stalled, late):
                proxy.register(session)
                auth = {"Authorization": f"Bearer {session.api_key}"}
                url = f"{session.openai_base_url}/chat/completions"
                for _ in range(2):  # the scripted reply, then the stall
                    async with http.post(url, json=body, headers=auth) as resp:
                        status, reply = resp.status, await resp.json()
                errors.append((status, reply["error"]["message"]))
    finally:
        await proxy.stop()
    assert errors == [
        (504, "turn 1: no completion within 0.1s (MTRL_GENERATE_TIMEOUT_S); "
              "the trainer's sampler is slow or stopped"),
        (504, "the episode's time limit ran out"),
    ]


async def test_a_full_episode_produces_a_trainable_trajectory() -> None:
    env = WordleEnvironment()
    session, _ = _session(["<guess>slate</guess>", "<guess>crane</guess>"])
    result = await run_episode(
        env, resolve_weights(env.components, {}), _request(), session, max_turns=6, timeout_s=5, worker_id="w"
    )
    assert result.stop_reason is StopReason.DONE and result.metric("solved") == 1.0
    assert [t.turn for t in result.trajectory] == [0, 1] and result.worker_id == "w"
    assert result.metric("completion_tokens") == 40


class MiscountingTarget(TargetEnvironment):
    """Target whose episodes report one turn reward too many."""

    def episode(self, task, limits):
        episode = super().episode(task, limits)
        score = episode.score

        def one_too_many():
            judged = score()
            judged.turn_rewards = [*judged.turn_rewards, 1.0]
            return judged

        episode.score = one_too_many
        return episode


async def test_turn_rewards_travel_on_the_turn_records() -> None:
    env = TargetEnvironment(turns=2)
    request = _request(environment="target", data={"target": "a"})
    session, _ = _session(["aa", "ab"])
    result = await run_episode(env, resolve_weights(env.components, {}), request, session,
                               max_turns=6, timeout_s=5)
    assert [t.reward for t in result.trajectory] == [1.0, 0.5]
    assert result.aggregate_reward_score == pytest.approx(0.75)
    session, _ = _session(["aa", "ab"])
    failed = await run_episode(MiscountingTarget(turns=2), resolve_weights(env.components, {}),
                               request, session, max_turns=6, timeout_s=5)
    assert failed.stop_reason is StopReason.ERROR
    assert "3 turn rewards for 2 model turns" in failed.error
