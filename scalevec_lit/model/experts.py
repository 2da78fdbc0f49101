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

import torch


def _in_backward() -> bool:
    """True while the autograd engine runs (an eager activation-checkpoint recompute). Always False under
    ``torch.compile``: a compiled forward's side effects are never replayed (``MoE`` sets the flag that lets
    a compiled checkpoint keep them forward-only)."""
    if torch.compiler.is_compiling():
        return False
    task = getattr(torch._C, "_current_graph_task_id", None)
    return task is not None and task() != -1


def _grouped_mm_runs(x: torch.Tensor, w: torch.Tensor) -> bool:
    ok_dtype = x.dtype in (torch.float32, torch.bfloat16, torch.float16) and w.dtype == x.dtype
    align = 16 // x.element_size()
    return hasattr(torch, "_grouped_mm") and ok_dtype and x.shape[-1] % align == 0 and w.shape[1] % align == 0


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
