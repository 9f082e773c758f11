import asyncio

import pytest

from mtrl_worker.environments.base import Completion, EpisodeLimits
from mtrl_worker.environments.target import TargetEnvironment


class TokenPolicy:
    openai_base_url = None
    api_key = "k"

    def __init__(self, completions: list[Completion]) -> None:
        self.completions = completions

    async def chat(self, messages, **_: object) -> Completion:
        return self.completions.pop(0)


def _score(task: dict, completions: list[Completion], turns: int = 1) -> float:
    episode = TargetEnvironment(turns=turns).episode(task, EpisodeLimits(4, 1000))
    asyncio.run(episode.play(TokenPolicy(completions)))
    return episode.score().components["target_fraction"]


def test_token_mode_rewards_the_fraction_of_target_tokens() -> None:
    completion = Completion("", "stop", [7, 7, 3, 7], [-1.0] * 4)
    assert _score({"target_token_id": 7}, [completion]) == 0.75


def test_character_mode_and_two_turns_average() -> None:
    completions = [Completion("aaaa", "stop", [], []), Completion("ab", "stop", [], [])]
    assert _score({"target": "a"}, completions, turns=2) == pytest.approx(0.75)


def test_empty_completion_scores_zero() -> None:
    assert _score({"target_token_id": 1}, [Completion("", "length", [], [])]) == 0.0


@pytest.mark.parametrize("task", [{}, {"target": "ab"}, {"target": "a", "target_token_id": 1}])
def test_malformed_tasks_are_rejected(task: dict) -> None:
    with pytest.raises(ValueError):
        TargetEnvironment().episode(task, EpisodeLimits(1, 10))


def test_turns_and_latency_come_as_the_strings_of_environment_args() -> None:
    """spec.rollout.environmentArgs is a map of strings; the worker passes them on as is."""
    env = TargetEnvironment(turns="4", latency_ms="30")
    episode = env.episode({"target_token_id": 7}, EpisodeLimits(8, 1000))
    completions = [Completion("", "stop", [7], [-1.0]) for _ in range(4)]
    loop = asyncio.new_event_loop()
    started = loop.time()
    loop.run_until_complete(episode.play(TokenPolicy(completions)))
    elapsed = loop.time() - started
    loop.close()
    assert episode.score().components["target_fraction"] == 1.0 and not completions
    assert elapsed >= 4 * 0.03  # a lower bound only: each of the four replies waited
    with pytest.raises(ValueError, match="1 to 16"):
        TargetEnvironment(turns="17")
