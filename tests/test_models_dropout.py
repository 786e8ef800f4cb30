"""The backbones' dropout: its exact scale, its drop rate, independence of the 16-bit shares, seeds, gradients;
and (CUDA only, marked gpu) torch's own dropout there with a fused, gradient-scaled AdamW step."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cape.models import NetworkConfig, ScBERTBackbone, ScGPTBackbone, TrainingPlan
from cape.models.modules.dropout import MASK_LEVELS, Dropout, cpu_keep_mask, dropout
from cape.models.training.engine import _Step


@pytest.mark.parametrize("p", [0.1, 0.2, 0.5, 0.9])
def test_kept_values_are_scaled_exactly_and_the_rate_is_p(p):
    torch.manual_seed(0)
    x = torch.ones(400_000, dtype=torch.float64)
    y = dropout(x, p)
    drop = round(p * MASK_LEVELS)
    kept = y[y != 0]
    assert torch.equal(kept, torch.full_like(kept, MASK_LEVELS / (MASK_LEVELS - drop)))
    rate = (y == 0).double().mean().item()
    sd = (p * (1 - p) / x.numel()) ** 0.5
    assert abs(rate - p) < 5 * sd
    assert abs(y.mean().item() - 1.0) < 5 * sd / (1 - p)


def test_the_four_shares_of_one_draw_are_independent():
    torch.manual_seed(1)
    p = 0.3
    dropped = (cpu_keep_mask(torch.Size([200_000, 4]), p, torch.float32) == 0).double()
    n = dropped.shape[0]
    sd = (p * p * (1 - p * p) / n) ** 0.5
    for a in range(4):
        assert abs(dropped[:, a].mean().item() - p) < 5 * (p * (1 - p) / n) ** 0.5
        for b in range(a + 1, 4):
            assert abs((dropped[:, a] * dropped[:, b]).mean().item() - p * p) < 5 * sd


def test_seeded_repeatable_and_different_across_seeds():
    x = torch.randn(3, 5, 7)
    torch.manual_seed(3)
    first = dropout(x, 0.2)
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.2), first)
    torch.manual_seed(4)
    assert not torch.equal(dropout(x, 0.2), first)


@pytest.mark.parametrize("shape", [(), (0,), (1,), (3,), (5, 3), (2, 3, 5)])
def test_any_shape_and_its_gradient(shape):
    torch.manual_seed(5)
    x = torch.randn(shape, dtype=torch.float64).add_(3.0).requires_grad_(True)  # no exact zeros
    y = dropout(x, 0.4)
    assert y.shape == x.shape and y.dtype == x.dtype
    y.sum().backward()
    scale = MASK_LEVELS / (MASK_LEVELS - round(0.4 * MASK_LEVELS))
    assert torch.equal(x.grad, (y.detach() != 0).double() * scale)
    assert torch.equal(y.detach(), x.detach() * x.grad)


def test_a_rate_next_to_one_keeps_a_finite_scale():
    torch.manual_seed(6)
    y = dropout(torch.ones(1_000_000), 0.9999999)
    assert torch.isfinite(y).all() and set(y.unique().tolist()) <= {0.0, float(MASK_LEVELS)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_dtype_is_kept(dtype):
    assert dropout(torch.ones(10, dtype=dtype), 0.5).dtype == dtype


def test_identity_when_evaluating_or_at_rate_zero():
    x = torch.randn(4, 4)
    assert dropout(x, 0.3, training=False) is x
    assert dropout(x, 0.0) is x
    module = Dropout(0.3).eval()
    assert module(x) is x
    assert "p=0.3" in repr(module)


@pytest.mark.parametrize("p", [-0.1, 1.0, 1.5])
def test_bad_rate(p):
    with pytest.raises(ValueError, match="dropout probability"):
        Dropout(p)
    with pytest.raises(ValueError, match="dropout probability"):
        dropout(torch.ones(3), p)


@pytest.mark.parametrize("backbone", [ScGPTBackbone, ScBERTBackbone])
def test_backbones_use_it_everywhere(backbone):
    network = NetworkConfig(d_model=16, n_heads=2, n_layers=1, dropout=0.2, integration="replace")
    model = backbone(10, 0, network=network)
    kinds = {type(m) for m in model.modules()}
    assert Dropout in kinds and nn.Dropout not in kinds
    assert all(m.p == 0.2 for m in model.modules() if isinstance(m, Dropout))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_uses_torch_dropout_and_a_fused_scaled_step_trains():
    torch.manual_seed(0)
    x = torch.ones(1_000_000, device="cuda")
    y = dropout(x, 0.2)
    assert y.device.type == "cuda" and abs((y == 0).float().mean().item() - 0.2) < 0.005
    net = nn.Sequential(nn.Linear(8, 32), Dropout(0.1), nn.ReLU(), nn.Linear(32, 1)).cuda()
    step = _Step(net, TrainingPlan(lr=1e-2), total_steps=50, scaled=True)
    assert step.optimizer.defaults["fused"]
    inputs, target = torch.randn(256, 8, device="cuda"), torch.randn(256, 1, device="cuda")
    losses = []
    for _ in range(50):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = nn.functional.mse_loss(net(inputs).float(), target)
        step(loss)
        losses.append(loss.item())
    assert losses[-1] < losses[0]
