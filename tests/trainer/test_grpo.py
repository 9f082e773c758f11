"""GRPO math against hand-computed values."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

from mtrl_trainer.grpo import (  # noqa: E402
    LOG_RATIO_BOUND,
    STD_EPSILON,
    group_advantages,
    k3_kl,
    per_token_loss,
    rollout_correction_weights,
    token_weights,
    turn_advantages,
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


# Rollout correction: truncated importance sampling against a plain-Python reference of verl's
# compute_rollout_correction_weights (verl/trainer/ppo/rollout_corr_helper.py): log ratio
# train - sampler, bounded to +-20, exp; per token, or summed over a sequence's valid tokens;
# zero on padding; truncated from above at the threshold.
IS_TRAIN = [[-0.5, -1.0, -2.0, -0.1, 0.0], [-3.0, -0.2, -0.7, -4.0, -1.5], [-1.0, -30.0, -0.3, 0.0, 0.0]]
IS_SAMPLER = [[-0.6, -0.2, -2.5, -0.1, -9.0], [-1.0, -0.2, -0.9, -0.5, -1.5], [-1.2, -1.0, -0.2, -5.0, 0.0]]
IS_MASK = [[1, 1, 1, 1, 0], [1, 0, 1, 1, 1], [1, 1, 1, 0, 0]]


def reference_weights(mode: str, threshold: float) -> tuple[list[list[float]], list[list[bool]]]:
    weights, truncated = [], []
    for train, sampler, mask in zip(IS_TRAIN, IS_SAMPLER, IS_MASK, strict=True):
        ratios = [t - s for t, s, m in zip(train, sampler, mask, strict=True) if m]
        if mode == "token":
            raw = iter(math.exp(min(max(r, -LOG_RATIO_BOUND), LOG_RATIO_BOUND)) for r in ratios)
            row = [next(raw) if m else 0.0 for m in mask]
        else:
            w = math.exp(min(max(sum(ratios), -LOG_RATIO_BOUND), LOG_RATIO_BOUND))
            row = [w if m else 0.0 for m in mask]
        weights.append([min(w, threshold) for w in row])
        truncated.append([w > threshold for w in row])
    return weights, truncated


@pytest.mark.parametrize("mode", ["token", "sequence"])
@pytest.mark.parametrize("threshold", [1.0, 2.0, 5.0])
def test_rollout_correction_weights_equal_the_reference(mode: str, threshold: float) -> None:
    train = torch.tensor(IS_TRAIN, requires_grad=True)
    got = rollout_correction_weights(train, torch.tensor(IS_SAMPLER), torch.tensor(IS_MASK),
                                     mode=mode, threshold=threshold)
    weights, truncated = reference_weights(mode, threshold)
    assert got.weights.tolist() == [pytest.approx(row, rel=1e-6) for row in weights]
    assert got.truncated.tolist() == truncated
    assert not got.weights.requires_grad  # a change of measure, not part of the objective


def test_rollout_correction_weights_by_hand() -> None:
    # Row 0 token-wise: exp(0.1), exp(-0.8), exp(0.5), 1; padding 0 despite its ratio exp(9).
    token = rollout_correction_weights(torch.tensor(IS_TRAIN), torch.tensor(IS_SAMPLER),
                                       torch.tensor(IS_MASK), mode="token", threshold=2.0)
    assert token.weights[0].tolist() == pytest.approx(
        [math.exp(0.1), math.exp(-0.8), math.exp(0.5), 1.0, 0.0], rel=1e-6)
    # Row 2's second token is 29 nats less likely for the trainer: weight e^-20 (bounded), not 0.
    assert token.weights[2, 1].item() == pytest.approx(math.exp(-LOG_RATIO_BOUND), rel=1e-5)
    # Row 1 as a sequence: exp(-2.0 + 0.2 - 3.5 + 0.0) for every trained token.
    sequence = rollout_correction_weights(torch.tensor(IS_TRAIN), torch.tensor(IS_SAMPLER),
                                          torch.tensor(IS_MASK), mode="sequence", threshold=2.0)
    assert sequence.weights[1].tolist() == pytest.approx([math.exp(-5.3), 0.0] + [math.exp(-5.3)] * 3,
                                                         rel=1e-5)
    with pytest.raises(ValueError, match="mode"):
        rollout_correction_weights(torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1),
                                   mode="none", threshold=2.0)


def test_importance_weights_scale_the_policy_gradient_not_the_kl() -> None:
    """Decoupled PPO with one update per batch: the ratio is against the trainer's own policy
    (1 in value), so the gradient of each token is -w * A, and the KL term is unweighted."""
    logprobs = torch.tensor([[-1.0, -2.0]], requires_grad=True)
    weights = torch.tensor([[0.5, 2.0]])
    loss, clipped = per_token_loss(logprobs, logprobs.detach(), torch.tensor([3.0]), epsilon=0.2,
                                   epsilon_high=0.28, is_weights=weights)
    loss.sum().backward()
    assert logprobs.grad.tolist() == [[pytest.approx(-1.5), pytest.approx(-6.0)]]
    assert not clipped.any()
    with_kl, _ = per_token_loss(logprobs.detach(), logprobs.detach(), torch.tensor([3.0]),
                                epsilon=0.2, epsilon_high=0.28, beta=0.5,
                                ref_logprobs=logprobs.detach() - 1.0, is_weights=weights)
    kl = math.exp(-1.0) + 1.0 - 1.0
    assert with_kl.tolist() == [[pytest.approx(-1.5 + 0.5 * kl), pytest.approx(-6.0 + 0.5 * kl)]]


def test_turn_advantages_normalise_returns_to_go_per_turn() -> None:
    # Three episodes: rewards per turn. Returns-to-go: [1.5, 0.5], [1.0, 1.0], [0.0] (one turn).
    adv = turn_advantages([[1.0, 0.5], [0.0, 1.0], [0.0]], "none")
    assert adv[0][0] == pytest.approx(1.5 - 2.5 / 3) and adv[2][0] == pytest.approx(-2.5 / 3)
    assert adv[0][1] == pytest.approx(-0.25) and adv[1][1] == pytest.approx(0.25)
    scaled = turn_advantages([[1.0, 0.5], [0.0, 1.0], [0.0]], "group")
    std = math.sqrt((0.25**2 + 0.25**2) / 1)  # turn 1: returns 0.5 and 1.0, Bessel std
    assert scaled[1][1] == pytest.approx(0.25 / (std + STD_EPSILON))
    assert scaled[0][1] == pytest.approx(-scaled[1][1])


def test_guess_turn_rewards_credit_a_reply_apart_from_the_rest_of_its_game() -> None:
    """The `guess` environment's turn rewards through turn-level credit: two games of one task,
    the same but for an invalid second reply in one. Per episode, both of its valid replies
    would share its one (lower) advantage with the invalid one; per turn, the invalid reply
    gets the lowest credit, and the turns after it, played alike, get none."""
    from mtrl_worker.environments.guess import GuessGame

    def turn_rewards(replies: list[str]) -> list[float]:
        game = GuessGame(secret=12, low=1, high=20, max_guesses=6)
        for reply in replies:
            game.play(reply)
        rewards = game.score().turn_rewards
        assert rewards is not None
        return rewards

    clean = turn_rewards(["10", "15", "13", "12"])
    slip = turn_rewards(["10", "fifteen", "13", "12"])
    (a_clean, a_slip) = turn_advantages([clean, slip], "none")
    assert a_slip[1] < 0 < a_clean[1]
    assert a_slip[2] == a_slip[3] == a_clean[2] == a_clean[3] == 0.0
    # the same game, other turns: the invalid reply is the one it blames most
    assert a_slip[1] == min(a_slip) and a_slip[0] == a_slip[1]  # turn 1's return holds turn 2's
    assert turn_advantages([slip, slip], "none") == [[0.0] * 4] * 2


def test_turn_advantages_are_zero_where_nothing_differs() -> None:
    assert turn_advantages([[0.3, 0.3], [0.3, 0.3]]) == [[0.0, 0.0], [0.0, 0.0]]
    # A turn only one episode reached has no baseline: 0, while turn 0 still compares.
    adv = turn_advantages([[1.0, 1.0], [0.0]], "none")
    assert adv == [[pytest.approx(1.0), 0.0], [pytest.approx(-1.0)]]
    with pytest.raises(ValueError, match="scale_rewards"):
        turn_advantages([[1.0]], "per-token")
