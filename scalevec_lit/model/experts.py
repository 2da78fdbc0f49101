"""MoE expert compute: the rows of (token, expert) pairs sorted by expert times stacked ``[E, out, in]``
weights, one grouped kernel (``torch._grouped_mm``) or one matmul per expert, never a loop over tokens.

Plain torch only: must not import Lightning.
"""
from __future__ import annotations

import torch


def _in_backward() -> bool:
    """True while the autograd engine runs (an activation-checkpoint recompute)."""
    task = getattr(torch._C, "_current_graph_task_id", None)
    return task is not None and task() != -1


def _grouped_mm_runs(x: torch.Tensor, w: torch.Tensor) -> bool:
    # eager runs fp32/bf16/fp16; the compiled (meta) kernel of torch 2.13 accepts bf16 only
    dtypes = (torch.bfloat16,) if torch.compiler.is_compiling() else (torch.float32, torch.bfloat16, torch.float16)
    ok_dtype = x.dtype in dtypes and w.dtype == x.dtype
    align = 16 // x.element_size()
    return hasattr(torch, "_grouped_mm") and ok_dtype and x.shape[-1] % align == 0 and w.shape[1] % align == 0


def expert_matmul(x: torch.Tensor, w: torch.Tensor, counts: torch.Tensor, mode: str = "auto") -> torch.Tensor:
    """Rows of ``x`` [M, in] grouped by expert (``counts`` [E] rows each, in order) times ``w`` [E, out, in]ᵀ.

    ``grouped_mm`` is one kernel without a host sync; ``loop`` is one matmul per expert (reads the
    counts on the host). ``auto`` takes grouped_mm where it runs.
    """
    if mode == "grouped_mm" or (mode == "auto" and _grouped_mm_runs(x, w)):
        offs = counts.cumsum(0).to(torch.int32)
        y = torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)
        if y.requires_grad:  # its backward refuses stride-0 (expanded) gradients
            y.register_hook(lambda g: g.contiguous())
        return y
    out, start = [], 0
    for e, n in enumerate(counts.tolist()):
        if n:
            out.append(x[start : start + n] @ w[e].transpose(0, 1))
            start += n
    return torch.cat(out) if out else x.new_zeros(0, w.shape[1])
