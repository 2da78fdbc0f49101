"""The definitions under SharpnessMonitor (issue 36), on problems whose answer is known exactly, in float64:

- Adam's preconditioner carries the first moment's bias correction ``(1 − β₁ᵗ)`` (Cohen et al. 2022): the
  monitor's preconditioned sharpness at t = 1 and t = 10 equals ``λ_max(P⁻¹ A)`` computed from the definition
  on a quadratic ``½ θᵀAθ − bᵀθ`` (Hessian A);
- the SGD threshold with dampening is ``(2 + 2μ)/((1 − δ)η)``: where the spectral radius of torch's momentum
  iteration on a 1-D quadratic is 1, and torch.optim.SGD itself converges just below it and diverges above;
- Lanczos's convergence flag, iteration count and residual estimates, against a matrix with known
  eigenvalues.
"""
from __future__ import annotations

import math

import pytest
import torch

from scalevec_lit.callbacks import SharpnessMonitor
from scalevec_lit.callbacks._hessian import hessian_operator, lanczos

U = torch.finfo(torch.float64).eps  # 2.2e-16


def spd(n: int, eigenvalues: list[float], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``Q diag(eigenvalues) Qᵀ`` (float64, Q a random orthogonal matrix) and the eigenvalues, descending."""
    gen = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(n, n, generator=gen, dtype=torch.float64))
    lam = torch.tensor(eigenvalues, dtype=torch.float64)
    return q @ torch.diag(lam) @ q.T, lam.sort(descending=True).values


# -- item 1: Adam's preconditioner ------------------------------------------------------------------------
@pytest.mark.parametrize("steps", [1, 10])
def test_adam_preconditioned_sharpness_carries_the_first_moment_bias_correction(steps):
    a, _ = spd(6, [4.0, 2.5, 1.0, 0.5, 0.2, 0.1], seed=1)
    b = torch.linspace(-1, 1, 6, dtype=torch.float64)
    theta = torch.nn.Parameter(torch.zeros(6, dtype=torch.float64))

    def loss() -> torch.Tensor:
        return 0.5 * theta @ a @ theta - b @ theta

    beta1, beta2, eps, lr = 0.9, 0.99, 1e-8, 0.05
    opt = torch.optim.AdamW([theta], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=0.0)
    for _ in range(steps):
        opt.zero_grad()
        loss().backward()
        opt.step()
    # the definition: P_t = (1 − β₁ᵗ) diag(√v̂_t + ε), v̂_t = v_t / (1 − β₂ᵗ); λ_max(P^{-1/2} A P^{-1/2})
    v_hat = opt.state[theta]["exp_avg_sq"] / (1 - beta2 ** steps)
    p = (1 - beta1 ** steps) * (v_hat.sqrt() + eps)
    direct = torch.linalg.eigvalsh(a / p.sqrt()[:, None] / p.sqrt()[None, :])[-1].item()

    monitor, out = SharpnessMonitor(iterations=6, tol=1e-12), {}
    lam = float(torch.linalg.eigvalsh(a)[-1])
    monitor._preconditioned(hessian_operator(loss(), [theta]), [theta], opt, lam, "sharpness", "all", out, None)
    # 6 Lanczos steps on a 6×6 matrix: the Krylov space is the whole space, the Ritz values are its eigenvalues
    # up to rounding (a few u·‖D A D‖ after full reorthogonalization): 1e-12 relative is ~10^3 times that
    assert abs(out["sharpness/precond_lambda_max"] - direct) <= 1e-12 * direct
    threshold = (2 + 2 * beta1) / ((1 - beta1) * lr)
    assert out["sharpness/threshold"] == threshold
    assert out["sharpness/threshold_ratio"] == out["sharpness/precond_lambda_max"] / threshold
    # without the factor the value would read (1 − β₁ᵗ) of this: ×0.10 at t = 1, ×0.65 at t = 10
    without = torch.linalg.eigvalsh(a / (v_hat.sqrt() + eps).sqrt()[:, None] / (v_hat.sqrt() + eps).sqrt()[None, :])
    assert abs(without[-1].item() / direct - (1 - beta1 ** steps)) <= 1e-12


# -- item 2: the SGD threshold with dampening --------------------------------------------------------------
def sgd_spectral_radius(h: float, lr: float, mu: float, damp: float) -> float:
    """torch's SGD on ``½ h θ²``: ``buf ← μ buf + (1 − δ) h θ``, ``θ ← θ − η buf``; the iteration matrix of
    ``(θ_t, buf_{t−1})`` and its spectral radius. Without momentum torch keeps no buffer: ``θ ← θ − η h θ``."""
    damp = damp if mu else 0.0
    m = torch.tensor([[1 - lr * (1 - damp) * h, -lr * mu], [(1 - damp) * h, mu]], dtype=torch.float64)
    return float(torch.linalg.eigvals(m).abs().max())


def sgd_final(h: float, lr: float, mu: float, damp: float, steps: int) -> float:
    theta = torch.nn.Parameter(torch.ones(1, dtype=torch.float64))
    opt = torch.optim.SGD([theta], lr=lr, momentum=mu, dampening=damp)
    for _ in range(steps):
        opt.zero_grad()
        (0.5 * h * theta.square()).sum().backward()
        opt.step()
    return abs(float(theta))


@pytest.mark.parametrize("mu, damp", [(0.5, 0.3), (0.9, 0.5), (0.0, 0.7)])
def test_sgd_threshold_is_where_the_momentum_iteration_stops_converging(mu, damp):
    lr = 0.1
    model = torch.nn.Linear(2, 1).double()
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=mu, dampening=damp)
    x = torch.randn(4, 2, dtype=torch.float64)
    loss = model(x).square().mean()
    out = {}
    SharpnessMonitor(iterations=3)._preconditioned(hessian_operator(loss, list(model.parameters())),
                                                   list(model.parameters()), opt, 1.0, "sharpness", "all", out, None)
    threshold = out["sharpness/threshold"]
    want = (2 + 2 * mu) / ((1 - damp) * lr) if mu else 2 / lr  # dampening acts on the momentum buffer only
    assert threshold == want
    # at the threshold the spectral radius is 1 (a root at z = −1; ρ is computed through a 2×2 eigensolve:
    # a few u of its entries, |entries| ≤ 1 + η(1 − δ)h ≤ 5)
    assert abs(sgd_spectral_radius(threshold, lr, mu, damp) - 1) <= 1e-12
    below, above = threshold * (1 - 0.02), threshold * (1 + 0.02)
    rho_below, rho_above = sgd_spectral_radius(below, lr, mu, damp), sgd_spectral_radius(above, lr, mu, damp)
    assert rho_below < 1 < rho_above
    # torch.optim.SGD itself: N steps shrink |θ| by ρ^N (times a constant of the first steps, which do not dampen)
    steps = math.ceil(math.log(1e8) / min(math.log(rho_above), -math.log(rho_below)))
    assert sgd_final(below, lr, mu, damp, steps) < 1e-4
    assert sgd_final(above, lr, mu, damp, steps) > 1e4


# -- item 3: Lanczos's convergence flag, iteration count and residuals --------------------------------------
def test_lanczos_converges_early_on_a_separated_spectrum_and_its_residuals_are_true():
    n, k, tol = 60, 2, 1e-8
    rest = torch.linspace(0.0, 1.0, n - 3).tolist()
    a, lam = spd(n, [10.0, 6.0, 3.0] + rest, seed=2)
    norm = float(lam[0])
    eig = lanczos(lambda v: a @ v, n, k, n, tol, seed=0, like=torch.zeros(n, dtype=torch.float64), vectors=True)
    assert eig.converged and eig.iterations < n // 2, eig.iterations
    assert len(eig.values) == len(eig.residuals) == len(eig.vectors) == k
    # the estimate |β s| against the residual computed directly: they differ by what the Lanczos relation
    # A Q = Q T + β q eᵀ loses in float64, a few u·‖A‖ per step (full reorthogonalization keeps Q orthonormal
    # to working precision): bound 10·m·u·‖A‖
    bound = 10 * eig.iterations * U * norm
    for value, estimate, y, true_value in zip(eig.values, eig.residuals, eig.vectors, lam[:k].tolist()):
        assert abs(float(y.norm()) - 1) <= 10 * eig.iterations * U
        true = float((a @ y - value * y).norm())
        assert abs(estimate - true) <= bound, (estimate, true)
        assert estimate <= tol * abs(value)  # converged: each residual met the tolerance
        # a symmetric matrix has an eigenvalue within the residual of a Ritz value (the nearest: the true one)
        assert abs(value - true_value) <= true + bound
    # the cap too small: not converged, every allowed step taken, and the estimates still the true residuals
    few = lanczos(lambda v: a @ v, n, k, 4, tol, seed=0, like=torch.zeros(n, dtype=torch.float64), vectors=True)
    assert not few.converged and few.iterations == 4
    assert any(r > tol * abs(v) for r, v in zip(few.residuals, few.values))
    for value, estimate, y in zip(few.values, few.residuals, few.vectors):
        assert abs(estimate - float((a @ y - value * y).norm())) <= 10 * 4 * U * norm


def test_lanczos_stops_on_an_invariant_subspace_with_exact_values():
    """A matrix of rank 3: the Krylov space is invariant after 3 steps, whatever the cap."""
    n = 30
    a, lam = spd(n, [5.0, 2.0, 1.0] + [0.0] * (n - 3), seed=3)
    eig = lanczos(lambda v: a @ v, n, 2, n, 1e-14, seed=1, like=torch.zeros(n, dtype=torch.float64))
    assert eig.converged and eig.iterations <= 4
    for value, true in zip(eig.values, lam[:2].tolist()):
        assert abs(value - true) <= 100 * U * 5.0


def test_a_start_vector_nearly_inside_an_invariant_subspace_is_not_taken_for_one():
    """The start vector lies within 1e-9 of a 2-dimensional invariant subspace (eigenvalues 1 and 2); the
    largest eigenvalue, 10, is 1e-9 off it. After 2 steps β ≈ 1e-9·10, far above the invariant-subspace
    test's 1e-12·|θ|max (= 2e-12) yet below 1e-6·|θ|max: Lanczos must go on and find 10, not stop at 2."""
    n, delta = 20, 1e-9
    gen = torch.Generator().manual_seed(5)  # the start vector lanczos draws with seed=5
    v = torch.randn(n, generator=gen, dtype=torch.float32).to(torch.float64)
    v = v / v.norm()
    basis, _ = torch.linalg.qr(torch.cat([v[:, None], torch.randn(n, 2, generator=gen, dtype=torch.float64)], 1))
    u, w = basis[:, 1], basis[:, 2]  # orthonormal, both orthogonal to v
    top = delta * v + math.sqrt(1 - delta ** 2) * u  # the eigenvector of 10: 1e-9 of it along v
    inside = (v - delta * top) / (v - delta * top).norm()  # v's part orthogonal to it
    f1, f2 = (inside + w) / math.sqrt(2), (inside - w) / math.sqrt(2)
    a = 10.0 * torch.outer(top, top) + 1.0 * torch.outer(f1, f1) + 2.0 * torch.outer(f2, f2)
    assert abs(float(top @ v) - delta) <= 10 * U and abs(float(top @ f1)) <= 10 * U and abs(float(top @ f2)) <= 10 * U
    tol = 1e-8
    eig = lanczos(lambda x: a @ x, n, 1, n, tol, seed=5, like=torch.zeros(n, dtype=torch.float64))
    assert eig.converged and eig.iterations >= 3
    # a symmetric matrix has an eigenvalue within a Ritz value's residual (≤ tol·|θ|), plus float64's few u·‖A‖
    assert abs(eig.values[0] - 10.0) <= tol * 10.0 + 10 * eig.iterations * U * 10.0, eig.values
