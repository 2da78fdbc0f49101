"""The sharpness monitor's maths: Hessian-vector products over a parameter subset, Lanczos for the top
eigenvalues of a symmetric operator, and the diagonal preconditioner and stability threshold of the
optimizer in use (Cohen et al., "Gradient descent on neural networks typically occurs at the edge of
stability", 2021, and "Adaptive gradient methods at the edge of stability", 2022).

Vectors are flat tensors in the parameters' dtype on their device (one entry per parameter entry, in the
subset's order); scalars of the iteration (α, β, the tridiagonal matrix and its eigenvalues) are float64.
Plain torch: no Lightning.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

import torch

Operator = Callable[[torch.Tensor], torch.Tensor]


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def unflatten(flat: torch.Tensor, like: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    return [part.view_as(p) for part, p in zip(flat.split([p.numel() for p in like]), like)]


def hessian_operator(loss: torch.Tensor, params: Sequence[torch.Tensor]) -> Operator:
    """``v ↦ H v`` with ``H`` the Hessian of ``loss`` with respect to ``params`` (the other parameters held
    fixed). The gradient graph is built once (``create_graph``) and differentiated again per product; the
    forward that made ``loss`` must have run inside ``scalevec_lit.scale.ops.higher_order()``."""
    params = list(params)
    grads = torch.autograd.grad(loss, params, create_graph=True, allow_unused=True)
    pairs = [(g, p) for g, p in zip(grads, params)]

    def apply(v: torch.Tensor) -> torch.Tensor:
        vs = unflatten(v, params)
        dot = sum((g * t).sum() for (g, _), t in zip(pairs, vs) if g is not None)
        if not torch.is_tensor(dot) or not dot.requires_grad:  # the loss is linear in the subset
            return torch.zeros_like(v)
        hv = torch.autograd.grad(dot, params, retain_graph=True, allow_unused=True)
        return flatten([h if h is not None else torch.zeros_like(p) for h, p in zip(hv, params)])

    return apply


def scaled(op: Operator, d: torch.Tensor) -> Operator:
    """``v ↦ D H D v`` with ``D = diag(d)``: the Hessian in the preconditioned coordinates."""
    return lambda v: d * op(d * v)


@dataclass
class Eigen:
    """The ``k`` largest eigenvalues found (descending), the Lanczos steps taken, whether the largest ``k`` met
    the tolerance (residual ``|β_m s_mi| ≤ tol · |θ_i|``) or the Krylov space became invariant, each value's
    residual estimate ``|β_m s_mi|`` (= ``‖H y_i − θ_i y_i‖`` for the Ritz vector ``y_i = Q_m s_i``: the
    Lanczos relation ``H Q_m = Q_m T_m + β_m q_{m+1} e_mᵀ``), and the Ritz vectors when asked for."""

    values: list[float]
    iterations: int
    converged: bool
    residuals: list[float] = field(default_factory=list)
    vectors: Optional[list[torch.Tensor]] = None


def lanczos(op: Operator, n: int, k: int, iterations: int, tol: float, seed: int, like: torch.Tensor,
            vectors: bool = False) -> Eigen:
    """The ``k`` largest (algebraic) eigenvalues of the symmetric operator ``op`` on vectors of ``n``
    entries, by Lanczos with full reorthogonalization (modified Gram-Schmidt, twice) from a start vector
    drawn with ``seed`` on the CPU (the same on every device), at most ``iterations`` products. Memory:
    ``iterations`` vectors like ``like`` (its dtype and device); inner products in that dtype. ``vectors``:
    also return the Ritz vectors (tests)."""
    gen = torch.Generator().manual_seed(int(seed))
    q = torch.randn(n, generator=gen, dtype=torch.float32).to(device=like.device, dtype=like.dtype)
    q = q / q.norm()
    basis: list[torch.Tensor] = []
    alphas: list[float] = []
    betas: list[float] = []
    values: list[float] = []
    for j in range(min(iterations, n)):
        basis.append(q)
        w = op(q)
        alphas.append(float(torch.dot(w, q)))
        for _ in range(2):  # "twice is enough": orthogonal to every basis vector to working precision
            for b in basis:
                w.sub_(torch.dot(w, b) * b)
        beta = float(w.norm())
        T = torch.diag(torch.tensor(alphas, dtype=torch.float64))
        if betas:
            off = torch.tensor(betas, dtype=torch.float64)
            T += torch.diag(off, 1) + torch.diag(off, -1)
        theta, S = torch.linalg.eigh(T)
        order = torch.argsort(theta, descending=True)[:k]
        values = [float(theta[i]) for i in order]
        residuals = [abs(beta * float(S[-1, i])) for i in order]  # ‖H y_i − θ_i y_i‖, y_i = Q s_i
        scale = max(float(theta.abs().max()), 1e-300)
        done = beta <= 1e-12 * scale or (  # invariant subspace: the Ritz values are exact eigenvalues
            j + 1 >= k and all(r <= tol * max(abs(v), 1e-30 * scale) for r, v in zip(residuals, values)))
        if done or j + 1 == min(iterations, n):
            ritz = None
            if vectors:
                Q = torch.stack(basis, 1)
                ritz = [Q @ S[:, i].to(device=Q.device, dtype=Q.dtype) for i in order]
            return Eigen(values, j + 1, done, residuals, ritz)
        betas.append(beta)
        q = w / beta
    return Eigen(values, len(alphas), False, [], None)


# -- the optimizer's preconditioner and threshold ---------------------------------------------------------
#: reasons for no preconditioned value that are expected at the start of training (not warned about)
NOT_YET = ("Adam has no second-moment estimate before its first step", "the learning rate is 0")


@dataclass
class Preconditioner:
    """``d``: the diagonal of ``P^{-1/2}`` (flat, the subset's order) with each group's learning rate relative
    to ``lr`` folded in (``√(η_g/η)``: one η for the whole subset); ``threshold``: the stability threshold of
    ``λ_max(diag(d) H diag(d))`` at learning rate ``lr``; ``kind``: ``adam`` or ``sgd``; ``d`` is None for
    SGD with one learning rate (the raw Hessian is the preconditioned one)."""

    kind: str
    d: Optional[torch.Tensor]
    lr: float
    threshold: float


def _group_of(optimizer: torch.optim.Optimizer) -> dict[int, dict]:
    return {id(p): g for g in optimizer.param_groups for p in g["params"]}


def _lr(group: dict) -> float:
    lr = group["lr"]
    return float(lr) if torch.is_tensor(lr) else float(lr)


def optimizer_kind(optimizer: torch.optim.Optimizer, group: dict) -> str:
    """``adam`` (Adam, AdamW, and the AdamW part of ``MuonAdamW``), ``sgd``, ``muon`` or the class name."""
    if group.get("use_muon"):
        return "muon"
    if isinstance(optimizer, (torch.optim.Adam, torch.optim.AdamW)) or (
            "use_muon" in group and "betas" in group):
        return "adam"
    if isinstance(optimizer, torch.optim.SGD):
        return "sgd"
    return type(optimizer).__name__


def preconditioner(optimizer: torch.optim.Optimizer,
                   params: Sequence[torch.Tensor]) -> tuple[Optional[Preconditioner], str]:
    """The preconditioner of ``optimizer`` over ``params``, or None and the reason.

    Adam/AdamW: ``P_t = (1 − β₁ᵗ) diag(√v̂_t + ε)``, ``v̂_t = v_t / (1 − β₂ᵗ)`` (``max_exp_avg_sq`` with
    amsgrad), threshold ``(2 + 2β₁) / ((1 − β₁) η)`` (Cohen et al. 2022, §2: their ``P_t`` carries the first
    moment's bias correction). Why the factor: the update ``θ ← θ − η m̂_t / (√v̂_t + ε)`` with
    ``m̂_t = m_t / (1 − β₁ᵗ)`` is ``θ ← θ − η P_t⁻¹ m_t``, and ``m_t = β₁ m_{t−1} + (1 − β₁) g_t`` is the
    momentum whose iteration on a quadratic of curvature ``λ`` (of ``P⁻¹H``) is stable while
    ``λ < (2 + 2β₁)/((1 − β₁) η)``; without the factor the preconditioned sharpness reads low by
    ``1 − β₁ᵗ`` (×0.10 at t = 1, ×0.65 at t = 10 for β₁ = 0.9). ``t``: each parameter's own step count.
    SGD (momentum μ, dampening δ): ``P = I``, threshold ``(2 + 2μ) / ((1 − δ) η)`` (``2/η`` for plain
    gradient descent), Nesterov (δ = 0) ``(2 + 2μ) / ((1 + 2μ) η)``. η is the largest learning rate in the
    subset; a group with a smaller one enters ``d`` with ``√(η_g/η)``.
    """
    groups = _group_of(optimizer)
    chosen = [groups.get(id(p)) for p in params]
    if any(g is None for g in chosen):
        return None, "some parameters of the subset are not in the optimizer"
    kinds = {optimizer_kind(optimizer, g) for g in chosen}
    if kinds == {"muon"} or "muon" in kinds:
        return None, ("Muon updates (part of) the subset: its orthogonalized update has no diagonal preconditioner, "
                      "so only the raw sharpness is logged")
    if len(kinds) > 1 or not kinds <= {"adam", "sgd"}:
        return None, (f"{type(optimizer).__name__} ({', '.join(sorted(kinds))}) has no preconditioner this monitor "
                      "knows (Adam/AdamW or SGD), so only the raw sharpness is logged")
    lr = max(_lr(g) for g in chosen)
    if not lr > 0:
        return None, NOT_YET[1]
    ref = max(chosen, key=_lr)
    kind = kinds.pop()
    if kind == "sgd":
        mu = float(ref.get("momentum", 0.0))
        damp = float(ref.get("dampening", 0.0)) if mu else 0.0  # torch applies dampening to the momentum buffer
        if ref.get("nesterov"):
            threshold = (2 + 2 * mu) / ((1 + 2 * mu) * lr)
        else:  # buf ← μ buf + (1 − δ) g, θ ← θ − η buf: a root of z² − (1 + μ − η(1 − δ)λ) z + μ at z = −1
            threshold = (2 + 2 * mu) / ((1 - damp) * lr)
        if all(_lr(g) == lr for g in chosen):
            return Preconditioner("sgd", None, lr, threshold), ""
        d = flatten([torch.full_like(p, math.sqrt(_lr(g) / lr)) for p, g in zip(params, chosen)])
        return Preconditioner("sgd", d, lr, threshold), ""
    parts = []
    for p, g in zip(params, chosen):
        state = optimizer.state.get(p, {})
        v = state.get("max_exp_avg_sq" if g.get("amsgrad") else "exp_avg_sq")
        if v is None or "step" not in state:
            return None, NOT_YET[0]
        step = float(state["step"])
        beta1, beta2 = float(g["betas"][0]), float(g["betas"][1])
        denom = (1 - beta1 ** step) * ((v.detach() / (1 - beta2 ** step)).sqrt() + float(g["eps"]))
        parts.append(math.sqrt(_lr(g) / lr) * denom.rsqrt())
    beta1 = float(ref["betas"][0])
    return Preconditioner("adam", flatten(parts).to(params[0].dtype), lr, (2 + 2 * beta1) / ((1 - beta1) * lr)), ""
