"""The paper's optimization claims on a toy linear-after-norm problem (docs/PAPER.md §2).

``y = W (γ ⊙ x̂)`` with ``x̂`` RMS-normalized inputs, squared loss, plain gradient descent on (W, γ).
For the merged column ``w̃_j = γ_j w_j`` gradient flow gives ``dw̃_j/dt = −P_j ∇_{w̃_j} L`` with
``P_j = γ_j² I + w_j w_jᵀ`` (so ``λ_min(P_j) ≥ γ_j²``) and conserves ``‖w_j‖² − γ_j²``; weight decay
breaks the conservation. Discrete steps of size η deviate by O(η²) per step: tolerances say how much.
"""
from __future__ import annotations

import torch

D, M, N = 8, 5, 256


def _problem(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(N, D, generator=g, dtype=torch.float64)
    xhat = x / x.pow(2).mean(-1, keepdim=True).sqrt()
    target = xhat @ torch.randn(D, M, generator=g, dtype=torch.float64)  # a reachable linear target
    W = 0.3 * torch.randn(M, D, generator=g, dtype=torch.float64)
    gamma = torch.ones(D, dtype=torch.float64)
    return xhat, target, W, gamma


def _grads(xhat, target, W, gamma):
    W = W.clone().requires_grad_(True)
    gamma = gamma.clone().requires_grad_(True)
    loss = 0.5 * ((xhat * gamma) @ W.T - target).pow(2).sum(-1).mean()
    gW, gg = torch.autograd.grad(loss, (W, gamma))
    return loss.item(), gW, gg


def _run(steps: int, lr: float, decay: float = 0.0):
    xhat, target, W, gamma = _problem()
    start = W.pow(2).sum(0) - gamma.pow(2)
    losses, w_norm_change = [], 0.0
    for _ in range(steps):
        loss, gW, gg = _grads(xhat, target, W, gamma)
        losses.append(loss)
        gamma_new = gamma - lr * gg - lr * decay * gamma  # decay on the Input-Norm scale only (IWD)
        W = W - lr * gW
        gamma = gamma_new
    drift = (W.pow(2).sum(0) - gamma.pow(2)) - start
    w_norm_change = (W.pow(2).sum(0) - _problem()[2].pow(2).sum(0)).abs().max().item()
    return losses, drift, w_norm_change, W, gamma


def test_conserved_quantity_without_decay():
    losses, drift, w_change, _, gamma = _run(steps=3000, lr=1e-3)
    assert losses[-1] < 0.05 * losses[0]  # it really trained
    assert w_change > 0.1  # and the weights really moved ...
    assert (gamma - 1).abs().max() > 0.05  # ... and so did the scales
    # yet ‖w_j‖² − γ_j² stayed put: measured 0.0043 while ‖w_j‖² moved by 2.4 (discrete steps: O(η) total drift)
    assert drift.abs().max().item() < 1e-2
    assert drift.abs().max().item() < 0.01 * w_change


def test_decay_breaks_conservation():
    _, drift_free, _, _, _ = _run(steps=3000, lr=1e-3)
    _, drift_decay, _, _, _ = _run(steps=3000, lr=1e-3, decay=0.5)
    assert drift_decay.abs().max().item() > 50 * drift_free.abs().max().item()
    assert drift_decay.abs().max().item() > 0.1


def test_merged_update_is_preconditioned_by_P():
    """One small step: Δw̃_j = −η P_j ∇_{w̃_j} L + O(η²), and λ_min(P_j) ≥ γ_j²."""
    xhat, target, W, gamma = _problem(1)
    gamma = gamma + 0.3 * torch.rand(D, dtype=torch.float64)
    lr = 1e-5
    # gradient with respect to the merged matrix W̃ = W diag γ
    Wt = (W * gamma).clone().requires_grad_(True)
    loss = 0.5 * (xhat @ Wt.T - target).pow(2).sum(-1).mean()
    (g_merged,) = torch.autograd.grad(loss, Wt)
    _, gW, gg = _grads(xhat, target, W, gamma)
    W1, gamma1 = W - lr * gW, gamma - lr * gg
    delta = W1 * gamma1 - W * gamma
    for j in range(D):
        w_j = W[:, j]
        P = gamma[j] ** 2 * torch.eye(M, dtype=torch.float64) + torch.outer(w_j, w_j)
        predicted = -lr * P @ g_merged[:, j]
        assert (delta[:, j] - predicted).abs().max() < 1e-3 * predicted.abs().max()
        assert torch.linalg.eigvalsh(P).min() >= gamma[j] ** 2 - 1e-12
