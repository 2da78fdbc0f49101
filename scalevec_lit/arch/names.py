"""Where a tensor of a Hugging Face checkpoint lives in our model (``Ref``), and that tensor
(``native_tensor``): the native side of every architecture's name table. The names themselves are each
adapter's (``HFArchitecture.names`` in this package), read both ways: export (native → HF,
``export/hf.py``'s ``hf_layout``) and reading a Hugging Face folder (HF → native, ``checkpoint/hf.py``).

``native_tensor(model, ref)`` returns the tensor (a view into a stacked expert weight for one expert), so
export reads it and import copies into it. Norm weights are not ours to read directly: an HF RMSNorm
weight is the site's input-side γ (``norm``) and a QK-norm weight is the per-head output scale of q or k
(``head_norm``); export writes ones / the per-head u after folding, import writes them through the scale
layer (``scale/convert.py``).

Plain torch: imports nothing of the package; must not import Lightning or transformers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch


@dataclass(frozen=True)
class Ref:
    """Where an HF tensor lives in our model.

    kind: ``embed``; ``weight`` (a consumer weight of a scale site: ``sublayer`` attn / mlp / final, its
    ``branch``, one ``expert`` of a stacked weight); ``o``, ``down``, ``expert_down``, ``shared_down``,
    ``expert_bias`` (maps outside the sites); ``norm`` (the input γ of the sublayer's site);
    ``head_norm`` (the per-head output scale of ``branch`` q or k).
    """

    kind: str
    layer: int = -1
    sublayer: str = ""
    branch: str = ""
    expert: Optional[int] = None


def native_tensor(model, ref: Ref) -> Optional[torch.Tensor]:
    """The tensor of ``model`` that ``ref`` names (a view for one expert); ``None`` for norm weights and for
    a branch the model does not have (Glm4's shared experts of a model without them)."""
    if ref.kind == "embed":
        return model.embed.weight
    block = model.blocks[ref.layer] if ref.layer >= 0 else None
    if ref.kind == "weight":
        site = site_of(model, ref)
        if ref.branch not in site.by_name:
            return None
        w = site.weight(ref.branch)
        return w if ref.expert is None else w[ref.expert]
    if ref.kind == "o":
        return block.attn.o.weight
    if ref.kind == "down":
        return block.mlp.down.weight
    if ref.kind == "expert_down":
        return block.mlp.expert_down[ref.expert]
    if ref.kind == "shared_down":
        return None if block.mlp.shared_down is None else block.mlp.shared_down.weight
    if ref.kind == "expert_bias":
        return getattr(block.mlp, "expert_bias", None)
    return None


def site_of(model, ref: Ref):
    """The scale site of ``ref``'s sublayer (the final norm's for ``final``)."""
    return model.final if ref.sublayer == "final" else getattr(model.blocks[ref.layer], ref.sublayer).input
