"""compile_random: where an inductor-compiled model draws its random numbers (acc.runtime.compile_random)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from acc import Accelerator, set_seed
from acc.runtime.compile_random import inductor_eager_random, native_dropout


class Noisy(nn.Module):
    """Two dropouts around a linear layer: its output depends on every mask drawn."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(32, 32)
        self.drop = nn.Dropout(0.25)

    def forward(self, x):
        return self.drop(torch.relu(self.inner(self.drop(x))))


def train(fresh_pm, monkeypatch, **settings) -> tuple[list[float], dict[str, torch.Tensor], bool]:
    """Three AdamW steps from seed 0 under the given settings (ACC_<NAME> variables): losses, weights, compiled."""
    for name, value in settings.items():
        monkeypatch.setenv(f"ACC_{name.upper()}", value)
    set_seed(0)
    accelerator = Accelerator(plugin_manager=fresh_pm, cpu=True)
    model = Noisy()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = accelerator.prepare(model, opt)
    x = torch.randn(64, 32, generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(3):
        loss = model(x).pow(2).mean()
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    weights = {k: v.detach().clone() for k, v in accelerator.unwrap_model(model, keep_torch_compile=False).state_dict().items()}
    return losses, weights, hasattr(model, "_orig_mod")


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_eager_random_draws_the_uncompiled_models_masks(fresh_pm, monkeypatch):
    eager_losses, eager_weights, compiled = train(fresh_pm, monkeypatch)
    assert not compiled
    losses, weights, compiled = train(fresh_pm, monkeypatch, dynamo_backend="inductor", compile_random="eager")
    assert compiled
    # the same masks: only the fused arithmetic's rounding differs from eager
    assert losses == pytest.approx(eager_losses, abs=1e-6)
    for name, value in weights.items():
        assert (value - eager_weights[name]).abs().max().item() < 1e-5, name


def test_inductors_own_generator_is_the_default_and_draws_other_masks(fresh_pm, monkeypatch):
    eager_losses, _, _ = train(fresh_pm, monkeypatch)
    losses, _, compiled = train(fresh_pm, monkeypatch, dynamo_backend="inductor")
    assert compiled
    # Accelerate's behaviour: inductor's Philox masks, not eager's (dropout 0.25 on 2048 inputs cannot match by chance)
    assert losses[0] != pytest.approx(eager_losses[0], abs=1e-4)


def test_semantics_acc_selects_eager_random(fresh_pm, monkeypatch):
    monkeypatch.setenv("ACC_SEMANTICS", "acc")
    assert Accelerator(plugin_manager=fresh_pm, cpu=True).settings["compile_random"] == "eager"


def test_dropout_decomposition_matches_eager_dropout_bitwise():
    x = torch.randn(4, 1000)
    for p in (0.0, 0.3, 1.0):
        torch.manual_seed(5)
        out, mask = native_dropout(x, p, True)
        torch.manual_seed(5)
        ref, ref_mask = torch.ops.aten.native_dropout(x, p, True)
        assert torch.equal(mask, ref_mask) and torch.equal(out, ref), p
    out, mask = native_dropout(x, 0.3, False)
    assert out is x and bool(mask.all())


def test_the_backend_takes_torch_compiles_mode_and_options():
    fn = torch.compile(lambda t: torch.nn.functional.dropout(t, 0.5, True) * 2, backend=inductor_eager_random,
                       mode="max-autotune-no-cudagraphs")
    x = torch.randn(256)
    torch.manual_seed(3)
    out = fn(x)
    torch.manual_seed(3)
    assert torch.equal(out, torch.nn.functional.dropout(x, 0.5, True) * 2)
    with pytest.raises(Exception, match="no_such_option"):
        torch._dynamo.reset()
        torch.compile(lambda t: t + 1, backend=inductor_eager_random, options={"no_such_option": 1})(x)
