"""Second derivatives (Hessian-vector products: ``torch.autograd.grad(..., create_graph=True)`` and a
second grad through it) through the fused scale ops of ``ops.py``.

``scaled_linear``'s backward is written with differentiable torch ops on saved *inputs* only, so it is
twice differentiable as it is. ``group_norm_rope``'s backward reads its saved output and a reciprocal RMS
computed in the forward (a constant to autograd), so it is not: inside ``higher_order()`` it is the plain
torch composition (``norm_rope._group_norm_rope_plain``: the same function, autograd's own, twice
differentiable; more passes and more saved memory, which an HVP does not mind), and outside it its
backward refuses a graph request (``create_graph=True``) instead of returning a wrong second derivative.
``higher_order()`` also restricts ``scaled_dot_product_attention`` to the math kernel (torch's fused CPU
and GPU kernels have no double backward). The MoE expert matmul needs nothing: torch's ``_grouped_mm``
and the per-expert loops are twice differentiable, and ``scalevec::grouped_mm`` (compiled fp32/fp16) has
derivatives registered for both its operators (``model/experts.py``). The first-order training path is
unchanged: one flag read per fused-norm call, one grad-mode read per fused-norm backward.

``tests/test_double_backward.py`` checks HVPs of every preset, dense and MoE, against finite differences
and the dense Hessian in float64. Used by ``scalevec_lit.callbacks.SharpnessMonitor``.

Plain torch only: must not import Lightning, ``scalevec_lit.model`` or ``ops.py``.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

ON = [False]  # set by higher_order(); a list, so that ops.py reads the one value without a global statement


def higher_order_enabled() -> bool:
    """True inside ``higher_order()``."""
    return ON[0]


@contextlib.contextmanager
def higher_order() -> Iterator[None]:
    """Forward passes whose graph will be differentiated twice: the fused norm-RoPE function becomes its
    plain torch composition and attention uses the math kernel. Eager only (a compiled graph cannot be
    differentiated twice: run compiled modules under ``torch.compiler.set_stance("force_eager")``)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    previous = ON[0]
    ON[0] = True
    try:
        with sdpa_kernel([SDPBackend.MATH]):
            yield
    finally:
        ON[0] = previous
