"""Judging a step's results (nothing older than the off-policy bound is ever trained on), and
the episode window over steps played ahead."""

from __future__ import annotations

import asyncio

import pytest

from mtrl_rollout.batching import Outbox
from mtrl_rollout.offload import Codec
from mtrl_rollout.protocol import RolloutRequest, RolloutResult, TurnRecord, encode
from mtrl_rollout.results import ResultCollector
from mtrl_rollout.sqs import Outgoing, Sqs
from mtrl_trainer.orchestration import (
    Orchestrator,
    RolloutSettings,
    judge,
    oldest_turn_version,
    sample_id,
)

GROUP = 2


def request(group: int, index: int, version: int) -> RolloutRequest:
    return RolloutRequest(run_id="r", step=5, group_id=f"a-s5-g{group}",
                          sample_id=sample_id("a", "s", 5, group, index), policy_version=version,
                          data={}, max_length=64)


def result(req: RolloutRequest, turn_versions: list[int], stop: str = "done") -> RolloutResult:
    turns = [TurnRecord(turn=t, policy_version=v, prompt_token_ids=[1], completion_token_ids=[2],
                        completion_logprobs=[-0.5], finish_reason="stop")
             for t, v in enumerate(turn_versions)]
    return RolloutResult(run_id="r", step=req.step, group_id=req.group_id,
                         sample_id=req.sample_id, policy_version=req.policy_version,
                         aggregate_reward_score=1.0, metrics_list=[], stop_reason=stop,
                         trajectory=turns)


def test_a_turn_older_than_the_bound_drops_its_sample_and_group() -> None:
    """Step 5 trains policy version 5 with maxStepsOffPolicy 2: turns of version 3 are fine,
    one of version 2 is not, even when the episode's later turns are fresh."""
    requests = [request(g, i, version=3) for g in range(3) for i in range(GROUP)]
    got = {
        requests[0].sample_id: result(requests[0], [3, 4, 5]),
        requests[1].sample_id: result(requests[1], [3, 3]),
        requests[2].sample_id: result(requests[2], [2, 5]),  # stale: its first turn
        requests[3].sample_id: result(requests[3], [4]),
        requests[4].sample_id: result(requests[4], [5], stop="error"),
        # requests[5] never arrived
    }
    rollouts = judge(requests, got, GROUP, oldest=5 - 2)
    assert [[r.sample_id for r in g] for g in rollouts.groups] == [
        [requests[0].sample_id, requests[1].sample_id]]
    counts = rollouts.counts
    assert (counts.stale, counts.failed, counts.late, counts.dropped_groups) == (1, 1, 1, 2)
    assert requests[2].sample_id not in {r.sample_id for r in rollouts.results}
    assert rollouts.oldest_policy_version == 3


@pytest.mark.parametrize("bound", [0, 1, 2, 3])
def test_every_trained_sample_is_within_the_bound(bound: int) -> None:
    trained = 6
    requests = [request(g, i, version=v) for g, v in enumerate(range(1, 7)) for i in range(GROUP)]
    got = {r.sample_id: result(r, [r.policy_version, trained]) for r in requests}
    rollouts = judge(requests, got, GROUP, oldest=trained - bound)
    kept = [r for group in rollouts.groups for r in group]
    assert all(trained - oldest_turn_version(r) <= bound for r in kept)
    assert len(kept) == GROUP * (bound + 1)  # versions 6-bound..6
    assert rollouts.counts.stale == len(requests) - len(kept)


def test_the_request_version_counts_when_a_result_has_no_turns() -> None:
    req = request(0, 0, version=1)
    assert oldest_turn_version(result(req, [])) == 1


@pytest.mark.aws
@pytest.mark.parametrize("window", [None, 3])
async def test_the_episode_window_caps_what_workers_play_across_steps_played_ahead(
        training_run, window: int | None) -> None:
    """Three steps published ahead (12 episodes) through real SQS; a stand-in worker answers
    each request after 0.3 s and counts what it holds. With maxEpisodesInFlight 3 it never holds
    more than 3; without a window it gets nearly everything at once."""
    queues = training_run.queues
    sqs = Sqs(pool_size=8)
    collector = ResultCollector(sqs, queues.result_url, queues.dlq_url)
    orchestrator = Orchestrator(RolloutSettings(
        run_id=training_run.run_id, attempt="a", rollout_queue_url=queues.rollout_url,
        result_queue_url=queues.result_url, environment="target", max_turns=1, max_length=64,
        episode_timeout_s=30, collect_grace_s=10, max_steps_off_policy=2,
        max_episodes_in_flight=window), Outbox(sqs), collector, Codec())
    held, peak, stop = 0, 0, asyncio.Event()

    async def answer(req: RolloutRequest) -> None:
        nonlocal held
        await asyncio.sleep(0.3)
        held -= 1
        await sqs.send(queues.result_url, Outgoing(encode(result(req, [req.policy_version]))))

    async def worker() -> None:
        nonlocal held, peak
        answering = set()
        while not stop.is_set():
            for message in await sqs.receive(queues.rollout_url, wait_s=1):
                await sqs.delete_batch(queues.rollout_url, [message.receipt_handle])
                req = RolloutRequest.model_validate_json(message.body)
                held += 1
                peak = max(peak, held)
                answering.add(asyncio.create_task(answer(req)))
        await asyncio.gather(*answering)

    playing = asyncio.create_task(worker())
    ahead = [await orchestrator.publish("s", s, [{}, {}], GROUP, 0) for s in range(3)]
    played = [await orchestrator.gather(pending, 0) for pending in ahead]
    stop.set()
    await playing
    await collector.aclose()
    sqs.close()
    assert [len(r.groups) for r in played] == [2, 2, 2]
    if window:
        assert 2 <= peak <= window and orchestrator.window.in_flight == 0
    else:
        assert peak > 3
