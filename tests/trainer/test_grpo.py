"""GRPO math against hand-computed values."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from mtrl_trainer.grpo import (  # noqa: E402
    STD_EPSILON,
    group_advantages,
    k3_kl,
    per_token_loss,
    token_weights,
)

REWARDS = [1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0]  # group 0 varies, group 1 is flat


def test_group_scaled_advantages_and_zero_variance_group() -> None:
    adv = group_advantages(torch.tensor(REWARDS), 4, "group")
    a = 0.5 / (math.sqrt(1 / 3) + STD_EPSILON)  # Bessel-corrected std of [1, 0, 0, 1]
    assert adv.values.tolist() == pytest.approx([a, -a, -a, a, 0, 0, 0, 0], abs=1e-6)
    assert adv.zero_variance.tolist() == [False, True]


def test_unscaled_and_batch_scaled_advantages() -> None:
    none = group_advantages(torch.tensor(REWARDS), 4, "none")
    assert none.values.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0])
    batch = group_advantages(torch.tensor(REWARDS), 4, "batch")
    a = 0.5 / (math.sqrt(5.5 / 7) + STD_EPSILON)  # std of all eight rewards (mean 1.25)
    assert batch.values.tolist() == pytest.approx([a, -a, -a, a, 0, 0, 0, 0], abs=1e-6)


def test_rewards_must_fill_whole_groups() -> None:
    with pytest.raises(ValueError, match="groups x 4"):
        group_advantages(torch.tensor([1.0, 2.0, 3.0]), 4)


def _loss(ratio: float, advantage: float, eps: float = 0.2, eps_high: float = 0.28):
    logprob = torch.tensor([[math.log(ratio)]], requires_grad=True)
    loss, clipped = per_token_loss(logprob, torch.zeros(1, 1), torch.tensor([advantage]),
                                   epsilon=eps, epsilon_high=eps_high)
    loss.sum().backward()
    return loss.item(), bool(clipped.item()), logprob.grad.item()


def test_clip_values_by_hand() -> None:
    assert _loss(1.5, 1.0)[:2] == (pytest.approx(-1.28), True)  # capped at 1 + epsilon_high
    assert _loss(0.5, 1.0)[:2] == (pytest.approx(-0.5), False)  # pessimistic side: no clip
    assert _loss(0.5, -1.0)[:2] == (pytest.approx(0.8), True)  # floored at 1 - epsilon
    assert _loss(1.5, -1.0)[:2] == (pytest.approx(1.5), False)


def test_clip_higher_is_asymmetric() -> None:
    # Ratio 1.25 with a positive advantage: inside clip-higher's range, so it still gets a
    # gradient; a symmetric 0.2 clip would have zeroed it.
    _, clipped, grad = _loss(1.25, 1.0)
    assert not clipped and grad == pytest.approx(-1.25)
    assert _loss(1.25, 1.0, eps_high=0.2)[1:] == (True, 0.0)
    # The low side still clips at 1 - epsilon = 0.8 for a negative advantage.
    assert _loss(0.75, -1.0)[1:] == (True, 0.0)


def test_k3_is_zero_for_identical_policies_and_positive_otherwise() -> None:
    logprobs = torch.tensor([-0.1, -2.0, -5.0])
    assert k3_kl(logprobs, logprobs).tolist() == [0.0, 0.0, 0.0]
    d = math.log(0.5)  # reference half as likely
    assert k3_kl(torch.tensor([0.0]), torch.tensor([d])).item() == pytest.approx(
        math.exp(d) - d - 1)
    assert (k3_kl(logprobs, logprobs - 0.3) > 0).all()


def test_kl_term_needs_reference() -> None:
    with pytest.raises(ValueError, match="reference"):
        per_token_loss(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1),
                       epsilon=0.2, epsilon_high=0.2, beta=0.1)


# Two sequences: 2 and 4 trained tokens; position 0 of each is an untrained prompt token.
MASK = torch.tensor([[0, 1, 1, 0, 0], [0, 1, 1, 1, 1]])
SEQS = torch.tensor([0, 1])


@pytest.mark.parametrize(("loss_type", "micro", "first", "second"), [
    ("dapo", [0, 0], 1 / 6, 1 / 6),  # tokens of the whole step
    ("dapo", [0, 1], 1 / 6, 1 / 6),  # ... however it is split into micro-batches
    ("bnpo", [0, 0], 1 / 6, 1 / 6),  # tokens of the micro-batch
    ("bnpo", [0, 1], 1 / 2 / 2, 1 / 4 / 2),  # per micro-batch, then averaged over two
    ("grpo", [0, 0], 1 / 2 / 2, 1 / 4 / 2),  # mean per sequence, then over sequences
    ("dr_grpo", [0, 0], 1 / (2 * 8), 1 / (2 * 8)),  # sequences x max completion length 8
])
def test_token_weights(loss_type: str, micro: list[int], first: float, second: float) -> None:
    w = token_weights(MASK, SEQS, torch.tensor(micro), loss_type=loss_type,  # type: ignore[arg-type]
                      max_completion_length=8)
    assert w[0].tolist() == pytest.approx([0, first, first, 0, 0])
    assert w[1].tolist() == pytest.approx([0, second, second, second, second])


def test_grpo_counts_an_episode_split_over_rows_once() -> None:
    # Rows 0 and 1 are pieces of one episode (its template broke the prefix): 3 tokens in all.
    mask = torch.tensor([[1, 1], [1, 0], [1, 1]])
    w = token_weights(mask, torch.tensor([0, 0, 1]), torch.tensor([0, 0, 0]),
                      loss_type="grpo", max_completion_length=4)
    assert w.flatten().tolist() == pytest.approx([1 / 6, 1 / 6, 1 / 6, 0, 1 / 4, 1 / 4])
