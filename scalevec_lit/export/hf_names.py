"""The one table between our weights and Hugging Face names, read both ways: export (native → HF,
``hf.hf_layout``) and import (HF → native, ``scalevec_lit.hub.hf_import``).

``hf_names(model, arch)`` lists, for every tensor of the transformers checkpoint, its name and where it
lives in our model (``Ref``); ``native_tensor(model, ref)`` returns that tensor (a view into a stacked
expert weight for one expert), so export reads it and import copies into it. Norm weights are not ours
to read directly: an HF RMSNorm weight is the site's input-side γ (``norm``) and a QK-norm weight is the
per-head output scale of q or k (``head_norm``); export writes ones / the per-head u after folding,
import writes them through the scale layer (``scale/convert.py``).

Plain torch: must not import Lightning or transformers, nor the hf / write / cli modules of this package.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

#: architecture -> (model_type, MLP prefix of an MoE layer, expert weight names gate/up/down)
ARCHITECTURES = {
    "LlamaForCausalLM": ("llama", None, None),
    "Qwen3ForCausalLM": ("qwen3", None, None),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "mlp", ("gate_proj", "up_proj", "down_proj")),
    "MixtralForCausalLM": ("mixtral", "block_sparse_moe", ("w1", "w3", "w2")),
    "Glm4MoeForCausalLM": ("glm4_moe", "mlp", ("gate_proj", "up_proj", "down_proj")),
}


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


def hf_names(model, arch: str, qk_norm: bool) -> list[tuple[str, Ref]]:
    """Every tensor name of ``arch``'s checkpoint for ``model``'s shape, with where it lives in ``model``.

    MoE layers are those whose MLP has experts; ``lm_head.weight`` is listed only for an untied head.
    """
    _, moe_prefix, expert_names = ARCHITECTURES[arch]
    rows: list[tuple[str, Ref]] = [("model.embed_tokens.weight", Ref("embed"))]
    for i, block in enumerate(model.blocks):
        p = f"model.layers.{i}."
        rows.append((p + "input_layernorm.weight", Ref("norm", i, "attn")))
        for name in ("q", "k", "v"):
            rows.append((p + f"self_attn.{name}_proj.weight", Ref("weight", i, "attn", name)))
        rows.append((p + "self_attn.o_proj.weight", Ref("o", i)))
        if qk_norm:
            rows += [(p + f"self_attn.{b}_norm.weight", Ref("head_norm", i, "attn", b)) for b in ("q", "k")]
        rows.append((p + "post_attention_layernorm.weight", Ref("norm", i, "mlp")))
        experts = getattr(block.mlp, "num_experts", 0)
        if not experts:
            rows += [(p + "mlp.gate_proj.weight", Ref("weight", i, "mlp", "gate")),
                     (p + "mlp.up_proj.weight", Ref("weight", i, "mlp", "up")),
                     (p + "mlp.down_proj.weight", Ref("down", i))]
            continue
        rows.append((p + f"{moe_prefix}.gate.weight", Ref("weight", i, "mlp", "router")))
        if arch == "Glm4MoeForCausalLM":
            rows += [(p + "mlp.gate.e_score_correction_bias", Ref("expert_bias", i)),
                     (p + "mlp.shared_experts.gate_proj.weight", Ref("weight", i, "mlp", "shared_gate")),
                     (p + "mlp.shared_experts.up_proj.weight", Ref("weight", i, "mlp", "shared_up")),
                     (p + "mlp.shared_experts.down_proj.weight", Ref("shared_down", i))]
        for e in range(experts):
            gate, up, down = (p + f"{moe_prefix}.experts.{e}.{n}.weight" for n in expert_names)
            rows += [(gate, Ref("weight", i, "mlp", "gate", e)), (up, Ref("weight", i, "mlp", "up", e)),
                     (down, Ref("expert_down", i, expert=e))]
    rows.append(("model.norm.weight", Ref("norm", sublayer="final")))
    if not model.tied:
        rows.append(("lm_head.weight", Ref("weight", sublayer="final", branch="head")))
    return rows
