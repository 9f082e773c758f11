from mtrl_rollout.protocol import TurnRecord
from mtrl_rollout.trajectory import flatten


def _turn(turn: int, prompt: list[int], completion: list[int]) -> TurnRecord:
    return TurnRecord(
        turn=turn,
        policy_version=1,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        completion_logprobs=[-0.5] * len(completion),
        finish_reason="stop",
    )


def test_prefix_consistent_turns_become_one_sequence_with_environment_masked() -> None:
    turns = [_turn(1, [1, 2, 10, 11, 5, 6], [12]), _turn(0, [1, 2], [10, 11])]
    [seq] = flatten(turns)
    assert seq.token_ids == [1, 2, 10, 11, 5, 6, 12]
    assert seq.loss_mask == [0, 0, 1, 1, 0, 0, 1]  # prompt, completion, env feedback, completion
    assert seq.logprobs == [0.0, 0.0, -0.5, -0.5, 0.0, 0.0, -0.5]
    assert seq.turns == [0, 1]
    assert seq.token_turns == [0, 0, 0, 0, 1, 1, 1]  # environment text leads to the next turn


def test_a_broken_prefix_starts_a_new_sequence_instead_of_retokenizing() -> None:
    turns = [_turn(0, [1, 2], [10, 11]), _turn(1, [1, 2, 99, 5], [12])]
    first, second = flatten(turns)
    assert first.token_ids == [1, 2, 10, 11] and first.loss_mask == [0, 0, 1, 1]
    assert second.token_ids == [1, 2, 99, 5, 12] and second.loss_mask == [0, 0, 0, 0, 1]
