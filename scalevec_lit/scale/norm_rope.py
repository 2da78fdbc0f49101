"""``group_norm_rope(a, u, cos, sin, eps)``: ``RoPE(u ⊙ a / RMS_group(a))`` — the per-head (or whole-output)
RMS normalization of a placement with a normalized output side, its output scale and, for q and k,
the rotary embedding, over q and k together. It saves only its *output* (which attention or the MLP
saves anyway, so it costs no memory) and the per-group reciprocal RMS; the backward recovers the
normalized input by undoing the rotation (orthogonal) and dividing by ``u``. RoPE, ``u`` and their
inverses are folded into small per-position tables (``_Tables``; their part without ``u`` is built once
per RoPE buffer, ``_RopeTables``), so that each pass over the activations is one multiply and one
in-place multiply-add (about a third of the passes of the plain composition's autograd; see
benchmarks/RESULTS.md). Dividing by ``u`` cannot recover a channel whose ``u_j`` is exactly 0 (its output
is 0 whatever the input), and that channel's normalized input enters the gradients of ``u_j``, of the
whole group's input (through the RMS) and so of the rows of W_q/W_k and everything upstream. So when
some ``u_j`` is exactly 0 (checked once per call on the small ``u``, only when a gradient is wanted: a
host read of one flag, a synchronization on a GPU) the function also saves the normalized input and its
backward uses it instead of dividing: exact for every ``u``, at one activation-sized tensor more in that
case only. Under ``torch.compile`` the check would break the graph, so it is made before the compiled
block runs and handed in as ``u_has_zero`` (``zero_check.check_zero_u_``, called by ``Transformer.forward`` for
compiled blocks on CPU, where reading the flag costs nothing); without it (on an accelerator, where the
read would be a host sync each step) the normalized input is always offered to the backward and the
compiler's partitioner decides what to keep.

Plain torch only: must not import Lightning or ``scalevec_lit.model``.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .higher_order import ON as _HIGHER_ORDER
from .ops import _rope_tables, apply_rope, backward_only, rms_norm


# -- group_norm_rope -------------------------------------------------------------------------------------------
def _swap_halves(x: torch.Tensor) -> torch.Tensor:
    """``[x1, x2] → [x2, x1]`` over the last dim (the channel pairs of rotate-half RoPE); small tables only."""
    h = x.shape[-1] // 2
    return torch.cat((x[..., h:], x[..., :h]), -1)


def _inverse(u: torch.Tensor) -> torch.Tensor:
    """``1 / u``, and 0 where ``u`` is exactly 0."""
    return torch.where(u != 0, u.reciprocal(), 0.0)


class _RopeTables(NamedTuple):
    """The position tables of ``RoPE`` and of its inverse, ``[T, 1, g]``, that do not depend on ``u`` (built
    once per cos/sin buffer, length and dtype: ``_rope_tables_for``). With ``swap`` exchanging the halves of
    each group and ``σ±`` being ``±1`` on the first half and ``∓1`` on the second (``rotate(x) = σ₋ ⊙
    swap(x)``): ``RoPE(z) = z ⊙ c + swap(z) ⊙ s``, its transpose ``z ⊙ c + swap(z) ⊙ s_t``, its inverse
    ``z ⊙ pc + swap(z) ⊙ ps``."""

    c: torch.Tensor  # cos
    s: torch.Tensor  # σ₋ ⊙ sin
    s_t: torch.Tensor  # swap(σ₋ ⊙ sin) = σ₊ ⊙ swap(sin)
    pc: torch.Tensor  # cos ⊙ k, k = 1 / (cos² + sin²): 1 up to the tables' rounding, divided out so that the
    ps: torch.Tensor  # s_t ⊙ k                      recovery is exact


_ROPE_TABLES: dict = {}


def _build_rope_tables(cos, sin, T: int, dtype) -> _RopeTables:
    c, s = _rope_tables(cos, sin, T, dtype)  # [T, 1, g]
    h = c.shape[-1] // 2
    sign = torch.ones_like(c)
    sign[..., :h] = -1.0  # σ₋
    s_signed = sign * s
    s_t = _swap_halves(s_signed)  # = σ₊ ⊙ swap(sin)
    k = 1.0 / (c * c + s * s)
    return _RopeTables(c, s_signed, s_t, c * k, s_t * k)


def _rope_tables_for(cos: torch.Tensor, sin: torch.Tensor, T: int, dtype) -> _RopeTables:
    """``_RopeTables`` of the first ``T`` positions, kept for the next call with the same buffers. The entry
    holds ``cos`` and ``sin`` themselves, so their storage cannot be reused by another tensor while it lives;
    an in-place change of either (its version) makes a new entry."""
    if torch.compiler.is_compiling():
        return _build_rope_tables(cos, sin, T, dtype)
    key = (cos.data_ptr(), sin.data_ptr(), cos._version, sin._version, tuple(cos.shape), T, dtype, cos.device)
    hit = _ROPE_TABLES.get(key)
    if hit is None:
        if len(_ROPE_TABLES) >= 16:
            _ROPE_TABLES.pop(next(iter(_ROPE_TABLES)))
        hit = _ROPE_TABLES[key] = (cos, sin, _build_rope_tables(cos, sin, T, dtype))
    return hit[2]


class _Tables(NamedTuple):
    """Small per-call tables (``[T, G, g]`` at most: no batch dimension) that turn ``RoPE(u ⊙ n)`` and each
    step of its backward into one multiply and one multiply-add over the activations (``_pair_mul``):

    - forward: ``y = n ⊙ A + swap(n) ⊙ B`` with ``A = u ⊙ c``, ``B = swap(u) ⊙ s``;
    - the gradient with respect to ``n`` (the transpose): ``gn = gy ⊙ A + swap(gy) ⊙ Bt``, ``Bt = u ⊙ s_t``;
    - the normalized input recovered from the output: ``n = y ⊙ P + swap(y) ⊙ Q`` with ``P = u⁻¹ ⊙ pc``,
      ``Q = u⁻¹ ⊙ ps`` (``u⁻¹ := 0`` where ``u = 0``).

    ``None`` stands for ones (A, P) or zeros (the others): no u, or no RoPE.
    """

    A: Optional[torch.Tensor]
    B: Optional[torch.Tensor]
    P: Optional[torch.Tensor]
    Q: Optional[torch.Tensor]
    Bt: Optional[torch.Tensor]
    inv_u: Optional[torch.Tensor]


def _norm_rope_tables(u, cos, sin, T: int, dtype, backward: bool) -> _Tables:
    uc = None if u is None else u.to(dtype)
    inv_u = None if (uc is None or not backward) else _inverse(uc)
    if cos is None:
        return _Tables(uc, None, inv_u, None, None, inv_u)
    r = _rope_tables_for(cos, sin, T, dtype)
    if uc is None:
        return _Tables(r.c, r.s, r.pc, r.ps, r.s_t, None)
    if not backward:
        return _Tables(r.c * uc, r.s * _swap_halves(uc), None, None, None, None)
    return _Tables(r.c * uc, None, r.pc * inv_u, r.ps * inv_u, r.s_t * uc, inv_u)


def _pair_mul(x: torch.Tensor, a: Optional[torch.Tensor], b: Optional[torch.Tensor]) -> torch.Tensor:
    """``x ⊙ a + swap(x) ⊙ b`` (``a`` None: ones; ``b`` None: zeros): the swapped term is added half by half
    in place, so the activations are never copied to swap them. Under ``torch.compile`` the plain expression
    instead: inductor reads the swapped halves by index in the one kernel it makes of it, where the in-place
    halves become scatters into a copy."""
    if b is None:
        return x if a is None else x * a
    if torch.compiler.is_compiling():
        return (x if a is None else x * a) + torch.cat((x[..., x.shape[-1] // 2:], x[..., : x.shape[-1] // 2]), -1) * b
    out = x.clone() if a is None else x * a
    h = x.shape[-1] // 2
    out[..., :h].addcmul_(x[..., h:], b[..., :h])
    out[..., h:].addcmul_(x[..., :h], b[..., h:])
    return out


def _compute_dtype_of(t: torch.Tensor) -> torch.dtype:
    return torch.float32 if t.dtype in (torch.float16, torch.bfloat16) else t.dtype


class _GroupNormRope(torch.autograd.Function):
    """Saves the output (attention keeps q and k anyway) and the per-group reciprocal RMS; the backward
    recovers the normalized input from the output with ``_Tables`` (recomputed, never saved). With some
    ``u_j`` exactly 0 it saves the normalized input too and differentiates from it
    (``_backward_from_input``)."""

    @staticmethod
    def forward(ctx, a, u, cos, sin, eps: float, u_has_zero: Optional[bool] = None):
        # a: [B, T, G, g]; u: [G, g] or None; cos/sin: [≥T, g] tables or None
        compute = _compute_dtype_of(a)
        n, rstd = _rms_norm_with_rstd(a, eps)
        t = _norm_rope_tables(u, cos, sin, a.shape[1], compute, backward=False)
        y = _pair_mul(n.to(compute), t.A, t.B).to(a.dtype)
        ctx.dtype = a.dtype
        # a channel with u_j = 0 cannot be recovered from y: keep the normalized input itself then. The check
        # reads a value on the host, so it is made only for CPU tensors (free there); on an accelerator (a host
        # sync per layer) and under torch.compile (a graph break) the normalized input is kept unless the
        # caller made the check beforehand (``u_has_zero``; under compile the partitioner decides the rest)
        if u_has_zero is None:
            u_has_zero = torch.compiler.is_compiling() or u is None or u.device.type != "cpu" or not bool(u.all())
        keep_n = u is not None and any(ctx.needs_input_grad[:2]) and u_has_zero
        ctx.save_for_backward(y, rstd, u, cos, sin, n if keep_n else None)
        return y

    @staticmethod
    def backward(ctx, gy):
        if torch.is_grad_enabled() and not torch.compiler.is_compiling():  # create_graph=True: not ours to give
            raise RuntimeError(
                "group_norm_rope: a second derivative (create_graph=True) was requested through a forward made "
                "outside scalevec_lit.scale.ops.higher_order(); its fused backward is not twice differentiable. "
                "Run the forward inside `with higher_order():` (the plain torch composition), as "
                "scalevec_lit.callbacks.SharpnessMonitor does")
        y, rstd, u, cos, sin, n = ctx.saved_tensors
        if n is not None:
            return (*_backward_from_input(ctx, gy, n, rstd, u, cos, sin), None)
        compute = _compute_dtype_of(y)
        t = _norm_rope_tables(u, cos, sin, y.shape[1], compute, backward=True)
        y, gy = y.to(compute), gy.to(compute)
        P, Q = (None if v is None else backward_only(v, gy) for v in (t.P, t.Q))
        n = _pair_mul(y, P, Q)  # the normalized input, recovered (exact where u ≠ 0)
        gn = _pair_mul(gy, t.A, t.Bt)
        m = gn * n
        gu = None
        if u is not None:  # ∂L/∂u = Σ_{B,T} ∂L/∂(u ⊙ n) ⊙ n = Σ gn ⊙ n / u (here no u_j is 0)
            gu = (m.sum(dim=tuple(range(m.ndim - 2))) * t.inv_u).to(u.dtype)
        ga = torch.addcmul(gn, n, m.mean(-1, keepdim=True), value=-1.0).mul_(rstd.to(compute))
        return ga.to(ctx.dtype), gu, None, None, None, None


def _backward_from_input(ctx, gy, n, rstd, u, cos, sin):
    """The backward from the saved normalized input ``n`` (some ``u_j`` exactly 0): ``gz = RoPEᵀ(gy)``,
    ``∂L/∂u = Σ gz ⊙ n``, ``gn = gz ⊙ u``, ``∂L/∂a = (gn − n · mean(gn ⊙ n)) / RMS(a)``; nothing divides."""
    compute = _compute_dtype_of(n)
    n, gy = n.to(compute), gy.to(compute)
    if cos is None:
        gz = gy
    else:
        r = _rope_tables_for(cos, sin, n.shape[1], compute)
        gz = _pair_mul(gy, r.c, r.s_t)
    gu = (gz * n).sum(dim=tuple(range(n.ndim - 2))).to(u.dtype)
    gn = gz * u.to(compute)
    ga = torch.addcmul(gn, n, (gn * n).mean(-1, keepdim=True), value=-1.0).mul_(rstd.to(compute))
    return ga.to(ctx.dtype), gu, None, None, None


def _rms_norm_with_rstd(a: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``(a / RMS(a), 1 / RMS(a))`` over the last dim, in one fused kernel where torch has it (the reciprocal
    RMS in float32 for half inputs)."""
    fused = getattr(torch.ops.aten, "_fused_rms_norm", None)
    if fused is not None and not torch.compiler.is_compiling():
        n, rstd = fused(a, [a.shape[-1]], None, eps)
        return n, rstd
    af = a.float() if a.dtype in (torch.float16, torch.bfloat16) else a
    rstd = torch.rsqrt(af.pow(2).mean(-1, keepdim=True) + eps)
    return (af * rstd).to(a.dtype), rstd


def group_norm_rope(
    a: torch.Tensor,
    u: Optional[torch.Tensor],
    eps: float,
    cos: Optional[torch.Tensor] = None,
    sin: Optional[torch.Tensor] = None,
    u_has_zero: Optional[bool] = None,
) -> torch.Tensor:
    """``RoPE(u ⊙ a / RMS(a))`` over the last dim of ``a`` ``[B, T, G, g]``; ``u`` is ``[G, g]`` or None,
    RoPE only when ``cos``/``sin`` are given. ``u_has_zero``: whether some ``u_j`` is exactly 0, when the
    caller knows it (``None``: checked here where that is free, else assumed; see the module doc). A
    ``False`` given for a ``u`` with a zero makes that channel's gradients wrong: only a check of this very
    ``u`` may give it."""
    if _HIGHER_ORDER[0]:
        return _group_norm_rope_plain(a, u, cos, sin, eps)
    return _GroupNormRope.apply(a, u, cos, sin, eps, u_has_zero)


def _group_norm_rope_plain(a, u, cos, sin, eps: float) -> torch.Tensor:
    """The same function as ``_GroupNormRope`` in plain torch ops (twice differentiable; ``higher_order()``)."""
    compute = _compute_dtype_of(a)
    z = rms_norm(a.to(compute), eps)
    if u is not None:
        z = z * u.to(compute)
    if cos is not None:
        z = apply_rope(z, cos, sin)
    return z.to(a.dtype)
