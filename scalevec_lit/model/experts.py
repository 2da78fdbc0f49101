"""MoE expert compute: the rows of (token, expert) pairs sorted by expert times stacked ``[E, out, in]``
weights, one grouped kernel (``torch._grouped_mm``) or one matmul per expert, never a loop over tokens.

Where each expert's rows end comes as ``offsets`` on the device (``routing.group_by_expert``): the grouped
kernel reads them there, so neither the forward nor the backward waits for the device. Under
``torch.compile`` every path is free of host reads (a graph with ``fullgraph=True`` and scalar capture off
compiles; ``tests/test_moe_compile.py``):

- bf16 (the GPU recipes): ``torch._grouped_mm`` itself, which the compiler knows;
- fp32/fp16: the compiler's ``torch._grouped_mm`` accepts bf16 only (torch 2.13), so the same kernel runs
  as the opaque operator ``scalevec::grouped_mm`` (same numbers as eager; on a GPU, torch's own kernel
  for these dtypes reads the offsets on the host: the sync-free GPU path is bf16 on sm90/sm100);
- other dtypes (float64) and widths that are not a multiple of 16 bytes, or ``mode="loop"``: one matmul
  per expert over all rows, each row kept from its own expert (exact, E times the FLOPs: a reference and
  test path, never the recipes' one).

Every path is twice differentiable (Hessian-vector products): torch's own ``_grouped_mm`` and the matmul
loops by autograd, ``scalevec::grouped_mm`` through the registered derivatives of its two operators.

Eager ``loop`` (and ``auto`` where the grouped kernel does not run) slices the rows by the offsets read on
the host: one read per call, fast on a CPU, a sync on a GPU.

Plain torch only: must not import Lightning.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..scale.higher_order import higher_order_enabled
from ..scale.ops import backward_only


def _in_backward() -> bool:
    """True while the autograd engine runs (an eager activation-checkpoint recompute). Always False under
    ``torch.compile``: a compiled forward's side effects are never replayed (``MoE`` sets the flag that lets
    a compiled checkpoint keep them forward-only)."""
    if torch.compiler.is_compiling():
        return False
    task = getattr(torch._C, "_current_graph_task_id", None)
    return task is not None and task() != -1


def _grouped_mm_runs(x: torch.Tensor, w: torch.Tensor) -> bool:
    return w.dtype == x.dtype and _grouped_mm_fits(x, w.shape[1])


def _grouped_mm_fits(x: torch.Tensor, out_features: int) -> bool:
    align = 16 // x.element_size()
    return (hasattr(torch, "_grouped_mm") and x.dtype in (torch.float32, torch.bfloat16, torch.float16)
            and x.shape[-1] % align == 0 and out_features % align == 0)


# -- torch._grouped_mm as an operator the compiler does not look into (fp32/fp16 under compile) -------------
@torch.library.custom_op("scalevec::grouped_mm", mutates_args=())
def _grouped_mm_op(x: torch.Tensor, w: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Rows of ``x`` [M, K] grouped by ``offs`` (group ends) times ``w`` [E, N, K]ᵀ: [M, N]."""
    return torch._grouped_mm(x.contiguous(), w.transpose(-2, -1), offs=offs)


@_grouped_mm_op.register_fake
def _(x, w, offs):
    return x.new_empty(x.shape[0], w.shape[1])


@torch.library.custom_op("scalevec::grouped_mm_weight_grad", mutates_args=())
def _grouped_mm_weight_grad(g: torch.Tensor, x: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """Per group e: ``g_eᵀ x_e`` [E, N, K] (the gradient of ``w``; 0 for a group without rows)."""
    return torch._grouped_mm(g.contiguous().t(), x.contiguous(), offs=offs)


@_grouped_mm_weight_grad.register_fake
def _(g, x, offs):
    return x.new_empty(offs.shape[0], g.shape[1], x.shape[1])


def _grouped_mm_setup(ctx, inputs, output) -> None:
    x, w, offs = inputs
    ctx.save_for_backward(x, w, offs)


def _grouped_mm_backward(ctx, g):
    x, w, offs = ctx.saved_tensors
    dx = _grouped_mm_op(g, w.transpose(-2, -1), offs) if ctx.needs_input_grad[0] else None
    dw = _grouped_mm_weight_grad(g, x, offs) if ctx.needs_input_grad[1] else None
    return dx, dw, None


_grouped_mm_op.register_autograd(_grouped_mm_backward, setup_context=_grouped_mm_setup)


# the weight gradient's own derivative, so that the operator is twice differentiable (Hessian-vector products
# through it): dw_e = g_eᵀ x_e, hence with G = ∂L/∂dw: ∂L/∂g_e = x_e G_eᵀ and ∂L/∂x_e = g_e G_e
def _weight_grad_setup(ctx, inputs, output) -> None:
    g, x, offs = inputs
    ctx.save_for_backward(g, x, offs)


def _weight_grad_backward(ctx, G):
    g, x, offs = ctx.saved_tensors
    dg = _grouped_mm_op(x, G, offs) if ctx.needs_input_grad[0] else None
    dx = _grouped_mm_op(g, G.transpose(-2, -1), offs) if ctx.needs_input_grad[1] else None
    return dg, dx, None


_grouped_mm_weight_grad.register_autograd(_weight_grad_backward, setup_context=_weight_grad_setup)


# -- the three ways -------------------------------------------------------------------------------------------
def _per_expert_masked(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """One matmul per expert over all rows, each row taken from its own expert: no host read, E× the FLOPs."""
    rows = torch.arange(x.shape[0], device=x.device, dtype=offsets.dtype)
    expert_of_row = torch.searchsorted(offsets, rows, right=True)[:, None]
    out = x.new_zeros(x.shape[0], w.shape[1])
    for e in range(w.shape[0]):
        out = torch.where(expert_of_row == e, x @ w[e].transpose(0, 1), out)
    return out


def _per_expert_sliced(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """One matmul per expert on its own rows, sliced at the offsets read on the host."""
    out, start = [], 0
    for e, end in enumerate(offsets.tolist()):
        if end > start:
            out.append(x[start:end] @ w[e].transpose(0, 1))
        start = end
    return torch.cat(out) if out else x.new_zeros(0, w.shape[1])


def expert_matmul(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor, mode: str = "auto") -> torch.Tensor:
    """Rows of ``x`` [M, in] grouped by expert (expert e's rows end at ``offsets[e]``, int32 on the device)
    times ``w`` [E, out, in]ᵀ.

    ``grouped_mm``: one kernel, no host read; ``loop``: one matmul per expert; ``auto``: grouped_mm where it
    runs (fp32/bf16/fp16, widths a multiple of 16 bytes), else loop. See the module doc for what each does
    under ``torch.compile``.
    """
    compiling = torch.compiler.is_compiling()
    if mode == "grouped_mm" or (mode == "auto" and _grouped_mm_runs(x, w)):
        if compiling and x.dtype != torch.bfloat16:
            return _grouped_mm_op(x, w, offsets)
        y = torch._grouped_mm(x, w.transpose(-2, -1), offs=offsets)
        if y.requires_grad and not compiling:  # its eager backward refuses stride-0 (expanded) gradients
            y.register_hook(lambda g: g.contiguous())
        return y
    return _per_expert_masked(x, w, offsets) if compiling else _per_expert_sliced(x, w, offsets)


# -- expert weights with their scales, the effective weight recomputed, never saved ---------------------------
def effective_expert_weight(w: torch.Tensor, cols: Optional[torch.Tensor], rows: Optional[torch.Tensor]) -> torch.Tensor:
    """``diag(rows) W_e diag(cols_e)`` for every expert: ``w`` [E, out, in], ``cols`` [in] or [E, in], ``rows``
    [out] (None: ones), in the dtype of ``w``."""
    if cols is not None:
        w = w * (cols.to(w.dtype) if cols.ndim == 2 else cols.to(w.dtype)[None])[:, None, :]
    if rows is not None:
        w = w * rows.to(w.dtype)[None, :, None]
    return w


def expert_weight_grad(g: torch.Tensor, x: torch.Tensor, offsets: torch.Tensor, experts: int, mode: str = "auto"
                       ) -> torch.Tensor:
    """Per expert e: ``g_eᵀ x_e`` [E, out, in] over its rows (the gradient of its weight), by the same way as
    ``expert_matmul`` with these operands."""
    if mode == "grouped_mm" or (mode == "auto" and _grouped_mm_fits(x, g.shape[1])):
        return _grouped_mm_weight_grad(g, x, offsets)
    if torch.compiler.is_compiling():
        rows = torch.arange(x.shape[0], device=x.device, dtype=offsets.dtype)
        expert_of_row = torch.searchsorted(offsets, rows, right=True)[:, None]
        return torch.stack([(g * (expert_of_row == e)).transpose(0, 1) @ x for e in range(experts)])
    out, start = [], 0
    for end in offsets.tolist():
        out.append(g[start:end].transpose(0, 1) @ x[start:end])
        start = end
    return torch.stack(out)


class _ScaledExpertMatmul(torch.autograd.Function):
    """``expert_matmul(x, diag(rows) W diag(cols))`` saving ``x``, ``W`` and the scales only: the effective
    weight (weight-sized) is recomputed in the backward, and the input is the one tensor that every expert
    branch of a site reads (gathered once), so branch-specific γ costs no activation."""

    @staticmethod
    def forward(ctx, x, w, cols, rows, offsets, mode: str):
        ctx.mode = mode
        ctx.save_for_backward(x, w, cols, rows, offsets)
        return expert_matmul(x, effective_expert_weight(w, cols, rows).to(x.dtype), offsets, mode)

    @staticmethod
    def backward(ctx, gy):
        x, w, cols, rows, offsets = ctx.saved_tensors
        gy = gy.to(x.dtype).contiguous()  # torch._grouped_mm refuses expanded (stride-0) operands
        dx = dw = dcols = drows = None
        if ctx.needs_input_grad[0]:
            # the small factors made backward-only, or the compiler's partitioner may keep the effective weight
            # (this function runs only with cols or rows: scaled_expert_matmul)
            small = [None if t is None else backward_only(t, gy) for t in (cols, rows)]
            w_eff = effective_expert_weight(w, *small).to(x.dtype)
            dx = expert_matmul(gy, w_eff.transpose(-2, -1), offsets, ctx.mode)
        if any(ctx.needs_input_grad[1:4]):
            g_eff = expert_weight_grad(gy, x, offsets, w.shape[0], ctx.mode).to(w.dtype)  # ∂L/∂(effective weight)
            if ctx.needs_input_grad[1]:
                dw = effective_expert_weight(g_eff, cols, rows)
            if ctx.needs_input_grad[2]:
                dcols = effective_expert_weight(g_eff * w, None, rows).sum(1)  # [E, in]
                dcols = (dcols if cols.ndim == 2 else dcols.sum(0)).to(cols.dtype)
            if ctx.needs_input_grad[3]:
                drows = effective_expert_weight(g_eff * w, cols, None).sum((0, 2)).to(rows.dtype)
        return dx, dw, dcols, drows, None, None


def scaled_expert_matmul(x: torch.Tensor, w: torch.Tensor, cols: Optional[torch.Tensor], rows: Optional[torch.Tensor],
                         offsets: torch.Tensor, mode: str = "auto") -> torch.Tensor:
    """Rows of ``x`` [M, in] grouped by expert times ``(diag(rows) W_e diag(cols_e))ᵀ``: ``cols`` the
    input-side γ on the columns ([in] shared by the experts, or [E, in] per expert), ``rows`` an
    un-normalized output-side u ([out]). Inside ``higher_order()`` the plain composition (autograd's own)."""
    if (cols is None and rows is None) or higher_order_enabled():
        return expert_matmul(x, effective_expert_weight(w, cols, rows).to(x.dtype), offsets, mode)
    return _ScaledExpertMatmul.apply(x, w, cols, rows, offsets, mode)
