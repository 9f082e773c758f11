"""The policy's LoRA adapter merged into the base weights for sampling, and taken out again."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from mtrl_api.run import ModelSpec  # noqa: E402
from mtrl_trainer.models import adapter_merged, load_policy  # noqa: E402
from mtrl_trainer.update import lora_parameters  # noqa: E402


def test_a_merged_adapter_samples_the_same_policy_and_unmerges_to_the_base_weights() -> None:
    policy = load_policy(ModelSpec(name="random:tiny-llama", dtype="float32"), seed=0,
                         device=torch.device("cpu"))
    model = policy.model.eval()
    with torch.no_grad():
        for p in lora_parameters(model):  # B starts at zero: make the adapter matter
            p.add_(torch.randn_like(p) * 0.1)
    base = {name: p.detach().clone() for name, p in model.named_parameters()
            if not p.requires_grad}
    ids = torch.tensor([[3, 14, 15, 92, 65, 35, 89, 79, 32, 38]])
    with torch.no_grad():
        with_adapter = model(input_ids=ids).logits
        with model.disable_adapter():
            without = model(input_ids=ids).logits
        assert not torch.allclose(with_adapter, without, atol=1e-3)  # the adapter does something
        with adapter_merged(model):
            merged = model(input_ids=ids).logits
            moved = [n for n, p in model.named_parameters() if n in base
                     and not torch.equal(p, base[n])]
            assert moved  # the base weights hold the adapter now
        assert torch.allclose(merged, with_adapter, atol=1e-5)
        # A long run merges and unmerges before every batch of requests: rounding must not
        # walk the base weights away.
        for _ in range(200):
            with adapter_merged(model):
                pass
        drift = max(float((p - base[n]).abs().max()) for n, p in model.named_parameters()
                    if n in base)
        assert drift < 1e-5
        assert torch.allclose(model(input_ids=ids).logits, with_adapter, atol=1e-5)


def test_an_error_while_merged_still_unmerges() -> None:
    policy = load_policy(ModelSpec(name="random:tiny-llama", dtype="float32"), seed=0,
                         device=torch.device("cpu"))
    with pytest.raises(RuntimeError, match="decoding failed"), adapter_merged(policy.model):
        raise RuntimeError("decoding failed")
    assert not any(getattr(m, "merged", False) for m in policy.model.modules())
