"""Whether a site's normalized output scales ``u`` hold an exact zero, checked before a compiled block runs.

``group_norm_rope`` (``norm_rope.py``) saves only its output and recovers the normalized input from it by dividing
by ``u``; a channel with ``u_j`` exactly 0 cannot be recovered, so the normalized input must be kept then.
Inside a compiled block that check would break the graph, so ``Transformer.forward`` makes it before each
compiled block (``check_zero_u_``) and the site hands the answer in as a constant: the compiled graph is
specialized on it (a guard; a change recompiles once). The check reads the small ``u`` vectors on the host:
free for CPU tensors; on an accelerator (a sync each step) or for sharded parameters it is not made and
the flag stays ``None`` (the normalized input is kept, as without the check). The flags are cleared when
the forward ends, so a block called on its own never reads a stale answer.

Plain torch only.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import nn

from .sites import NormSite


def _host_readable(vec: nn.Module) -> bool:
    return all(p.device.type == "cpu" and not hasattr(p, "device_mesh") for p in vec.parameters())


@torch.no_grad()
def site_u_has_zero(site: NormSite) -> Optional[bool]:
    """True/False when every normalized branch's ``u`` of ``site`` could be read for free; None otherwise."""
    found = False
    for b in site.branches:
        vec = site.output_vector(b.name)
        if b.experts or vec is None or vec.is_identity or not site._normalizes(b.name):
            continue
        if not _host_readable(vec):
            return None
        found = found or not bool(vec().ne(0).all())
    return found


def check_zero_u_(module: nn.Module) -> None:
    """Set ``u_has_zero`` on every ``NormSite`` in ``module`` (outside ``torch.compile`` only)."""
    for m in module.modules():
        if isinstance(m, NormSite):
            m.u_has_zero = site_u_has_zero(m)


def clear_zero_u_(module: nn.Module) -> None:
    for m in module.modules():
        if isinstance(m, NormSite):
            m.u_has_zero = None
