"""Export a trained model: fold the scale vectors and write a standard Hugging Face checkpoint (or ours).

``python -m scalevec_lit export --ckpt <checkpoint> --out <dir> [--format hf|native] [--tokenizer <json>]``

- Reads a single-file Lightning checkpoint (``*.ckpt``), a distributed checkpoint folder written by
  ``ModelParallelStrategy`` (``*.distcp`` + ``.metadata`` + ``meta.pt``, consolidated on CPU without a
  process group), or a native export folder (``scalevec_spec.json`` + safetensors).
- ``--format hf`` (default) folds every input-role scale into its linear map (``scale/fold.py``) and writes
  ``config.json``, ``model.safetensors`` (sharded with ``model.safetensors.index.json`` above
  ``--max-shard-size``) and the tokenizer files in the layout of ``LlamaForCausalLM`` (dense, no scale
  left after folding), ``Qwen3ForCausalLM`` (dense, DNP / QK-norm on q and k with a per-head u),
  ``Qwen3MoeForCausalLM`` (softmax-routed MoE with that QK-norm), ``MixtralForCausalLM`` (softmax-routed
  MoE without it) or ``Glm4MoeForCausalLM`` (sigmoid-routed MoE: selection bias, shared experts). A model
  with a site that no standard architecture holds is refused with the site named (``HFExportError``).
- ``--format native`` writes our own (unfolded) state dict as safetensors plus the model spec as JSON;
  ``load_native(folder)`` (or ``build_from_spec`` + the safetensors) rebuilds it exactly.

Plain torch (+ safetensors, tokenizers, yaml): must not import Lightning or transformers.
"""
from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch
from torch import nn

from .data.tokenizer import DEFAULT_TOKENIZER, Tokenizer
from .model.attention import CausalSelfAttention
from .model.block import Block
from .model.mlp import SwiGLU
from .model.spec import build_from_spec, model_spec
from .model.transformer import Transformer
from .model.rope import rope_tables
from .scale.fold import fold_scales
from .scale.registry import scale_parameters

NATIVE_SPEC = "scalevec_spec.json"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


class ExportError(ValueError):
    """A user-facing export error: names the key, value or path and the fix."""


class HFExportError(ExportError):
    """The model has a site that no standard transformers architecture holds."""


# -- reading checkpoints -------------------------------------------------------------------------------
def _torch_load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # Lightning stores some plain Python objects; the file is the user's own training run
        return torch.load(path, map_location="cpu", weights_only=False)


def _read_dcp(folder: Path) -> dict[str, torch.Tensor]:
    """Consolidate the ``state_dict`` entry of a distributed checkpoint on CPU (no process group)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    reader = FileSystemReader(str(folder))
    tops = {key.split(".", 1)[0] for key in reader.read_metadata().state_dict_metadata}
    if "state_dict" not in tops:
        raise ExportError(
            f"--ckpt: the distributed checkpoint {str(folder)!r} has no 'state_dict' entry (top-level keys: "
            f"{', '.join(sorted(tops))}); give a checkpoint written by Lightning's ModelParallelStrategy"
        )
    sd: dict[str, Any] = {}
    _load_state_dict(sd, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(keys={"state_dict"}), no_dist=True)
    return sd["state_dict"]


def _clean_key(key: str) -> str:
    for part in _WRAPPER_PARTS:
        key = key.replace(part, "")
    return key


def read_checkpoint(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(spec, state dict of the Transformer)`` from a Lightning checkpoint, a DCP folder or a native export."""
    p = Path(path)
    if not p.exists():
        raise ExportError(f"--ckpt: {str(path)!r} does not exist; give a Lightning .ckpt file or checkpoint folder")
    if p.is_dir() and (p / NATIVE_SPEC).is_file():
        from safetensors.torch import load_file

        spec = json.loads((p / NATIVE_SPEC).read_text())
        return spec, {k: v for f in sorted(p.glob("model*.safetensors")) for k, v in load_file(f).items()}
    if p.is_dir():
        if not (p / ".metadata").is_file():
            raise ExportError(
                f"--ckpt: {str(path)!r} is a folder without .metadata (not a distributed checkpoint) and without "
                f"{NATIVE_SPEC} (not a native export); give a .ckpt file or a checkpoint folder"
            )
        extra = _torch_load(p / "meta.pt") if (p / "meta.pt").is_file() else {}
        state = _read_dcp(p)
    else:
        extra = _torch_load(p)
        if not isinstance(extra, dict) or "state_dict" not in extra:
            raise ExportError(f"--ckpt: {str(path)!r} holds no 'state_dict'; give a checkpoint saved by Lightning")
        state = extra["state_dict"]
    spec = (extra.get("scalevec") or {}).get("spec")
    if spec is None:
        raise ExportError(
            f"--ckpt: {str(path)!r} has no checkpoint['scalevec']['spec'] (it was not written by scalevec_lit's "
            "CausalLM); export a checkpoint of `python -m scalevec_lit fit`"
        )
    model_state = {_clean_key(k[len("model."):]): v for k, v in state.items() if k.startswith("model.")}
    if not model_state:
        raise ExportError(f"--ckpt: {str(path)!r} has no 'model.*' weights in its state_dict")
    return spec, model_state


def model_from_state(spec: dict[str, Any], state: dict[str, torch.Tensor]) -> Transformer:
    """Build the model of ``spec`` on the meta device, then load ``state`` (fp32, CPU) into it."""
    with torch.device("meta"):
        model = build_from_spec(spec)
    model.to_empty(device="cpu")
    model.float()
    tied = model.config.tie_embeddings
    if tied:
        state = {k: v for k, v in state.items() if k != "head.weight"}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (tied and k == "head.weight")]
    if missing or unexpected:
        raise ExportError(
            f"--ckpt: the weights do not fit the model of the checkpoint's spec (missing: {missing[:5]}, "
            f"unexpected: {unexpected[:5]}); was the checkpoint written by another version of the model code?"
        )
    if tied:
        model.head.weight = model.embed.weight
    cos, sin = rope_tables(model.config.seq_len, model.config.head_dim, model.config.rope_theta)
    model.rope_cos.copy_(cos)
    model.rope_sin.copy_(sin)
    return model.eval()


def load_model(path: str | Path) -> tuple[Transformer, dict[str, Any]]:
    """The trained model (fp32, eval mode) and its spec, from any checkpoint ``read_checkpoint`` reads."""
    spec, state = read_checkpoint(path)
    return model_from_state(spec, state), spec


# -- the Hugging Face layout ----------------------------------------------------------------------------
#: architecture -> (model_type, MLP prefix of an MoE layer, expert weight names gate/up/down)
ARCHITECTURES = {
    "LlamaForCausalLM": ("llama", None, None),
    "Qwen3ForCausalLM": ("qwen3", None, None),
    "Qwen3MoeForCausalLM": ("qwen3_moe", "mlp", ("gate_proj", "up_proj", "down_proj")),
    "MixtralForCausalLM": ("mixtral", "block_sparse_moe", ("w1", "w3", "w2")),
    "Glm4MoeForCausalLM": ("glm4_moe", "mlp", ("gate_proj", "up_proj", "down_proj")),
}
NATIVE_HINT = "or export the native format (--format native: our state dict + spec, reloadable with build_from_spec)"


@dataclass
class HFLayout:
    architecture: str
    config: dict[str, Any]
    tensors: dict[str, torch.Tensor] = field(repr=False)


def _moe_class() -> Optional[type]:
    try:
        from .model.moe import MoE
    except ImportError:  # pragma: no cover - a tree without the MoE module
        return None
    return MoE


def _head_weight(proj, n_heads: int, head_dim: int) -> tuple[torch.Tensor, float]:
    """The per-head u of a normalized q/k projection (ones when none) and the spread between heads."""
    u = proj.output_scale()
    if u is None:
        return torch.ones(head_dim), 0.0
    per_head = u.detach().float().view(n_heads, head_dim)
    return per_head[0].clone(), float((per_head - per_head[0]).abs().max())


class _Refusals:
    """Problems by site, with the layers where they occur (one line per site in the message)."""

    def __init__(self, n_layer: int) -> None:
        self.n_layer, self.layers, self.amount = n_layer, {}, {}

    def add(self, problem: str, layer: Optional[int], amount: float = 0.0) -> None:
        """``layer`` None: a model-wide problem (no layer list in the message)."""
        self.layers.setdefault(problem, []).append(layer)
        self.amount[problem] = max(self.amount.get(problem, 0.0), amount)

    def lines(self) -> list[str]:
        out = []
        for problem, layers in self.layers.items():
            where = "" if layers == [None] else "every layer, " if len(layers) == self.n_layer else (
                "layer" + "s" * (len(layers) > 1) + " " + ", ".join(map(str, layers)) + ", ")
            if self.amount[problem]:
                problem = problem.replace("{amount}", f"{self.amount[problem]:.3g}")
            out.append(f"{where}{problem}, {NATIVE_HINT}")
        return out


def _check_attention(attn, i: int, r: _Refusals) -> None:
    if attn.out_norm is not None:
        r.add("attn_output: a sublayer output norm (model.strategy.sublayer_output_norm: true) has no place in "
              "Llama, Qwen3, Qwen3-MoE, Mixtral or Glm4-MoE; set it to false", i)
    if attn.v.normalize:
        r.add("attn_proj.v: DNP on v (model.strategy.placement.v: 'dual_norm') normalizes v per head, which no "
              "standard architecture does; use input, output or dual there", i)
    if attn.q.normalize != attn.k.normalize:
        bare = attn.k if attn.q.normalize else attn.q
        r.add(f"attn_proj.{bare.branch}: Qwen3's QK-norm normalizes both q and k, but model.strategy.placement."
              f"{bare.branch} is {bare.placement!r}; set placement.q and placement.k both to dual_norm, or neither", i)
    elif attn.q.normalize:
        for proj, heads in ((attn.q, attn.n_head), (attn.k, attn.n_kv_head)):
            amount = _head_weight(proj, heads, attn.head_dim)[1]
            if amount > 0:
                r.add(f"attn_proj.{proj.branch}: its output scale u (model.strategy.output_shape: 'channel') differs "
                      f"between heads (by up to {{amount}}), while Qwen3's {proj.branch}_norm holds one weight of "
                      "size head_dim shared by all heads; train with model.strategy.output_shape: head", i, amount)


def _check_mlp(mlp, i: int, r: _Refusals, moe_cls: Optional[type]) -> None:
    if mlp.out_norm is not None:
        r.add("mlp_output: a sublayer output norm (model.strategy.sublayer_output_norm: true) has no place in "
              "Llama, Qwen3, Qwen3-MoE, Mixtral or Glm4-MoE; set it to false", i)
    dnp = "normalizes its output, which no standard architecture does; use input, output or dual there"
    if type(mlp) is SwiGLU:
        for proj in (mlp.gate, mlp.up):
            if proj.normalize:
                r.add(f"mlp_proj.{proj.branch}: DNP on {proj.branch} (model.strategy.placement.{proj.branch}: "
                      f"'dual_norm') {dnp}", i)
        return
    if moe_cls is None or type(mlp) is not moe_cls:
        r.add(f"block.mlp: {type(mlp).__qualname__} is neither SwiGLU nor MoE", i)
        return
    for name, placement in (("gate", mlp.gate_placement), ("up", mlp.up_placement)):
        if placement == "dual_norm":
            r.add(f"mlp_proj.expert*_{name}: DNP on the experts' {name} (model.strategy.placement.{name}: "
                  f"'dual_norm') {dnp}", i)
    if mlp.router.normalize:
        r.add(f"mlp_proj.router: DNP on the router (model.strategy.placement.router: 'dual_norm') {dnp}", i)
    if mlp.score == "sigmoid":  # Glm4-MoE: sigmoid router, selection bias, shared experts, dense first layers
        return
    glm = "Glm4-MoE has them, but its router is a sigmoid"
    if mlp.shared is not None:
        r.add("the shared experts (model.config.moe.num_shared_experts > 0) have no place in Qwen3-MoE or Mixtral "
              f"(routed experts only; {glm}); set num_shared_experts: 0 or router: sigmoid", i)
    bias = getattr(mlp, "expert_bias", None)
    if bias is not None and bool(bias.abs().max() > 0):
        r.add("the expert selection bias (model.config.moe.bias_balancing: true, max |bias| {amount}) shifts "
              f"which experts are chosen, and Qwen3-MoE and Mixtral routers hold no such bias ({glm}); train with "
              "bias_balancing: false or router: sigmoid", i, float(bias.abs().max()))


def plan_hf(model: nn.Module) -> tuple[Optional[str], list[str]]:
    """``(architecture, problems)`` for a folded model: problems empty when the architecture holds it."""
    if type(model) is not Transformer:
        return None, [f"the model is a {type(model).__name__}, not scalevec_lit's Transformer; {NATIVE_HINT}"]
    r, moe_cls = _Refusals(len(model.blocks)), _moe_class()
    for i, block in enumerate(model.blocks):
        if type(block) is not Block:
            r.add(f"model.block: {type(block).__qualname__} is not the Pre-Norm Block; use Block", i)
        elif type(block.attn) is not CausalSelfAttention:
            r.add(f"block.attn: {type(block.attn).__qualname__} is not CausalSelfAttention", i)
        else:
            _check_attention(block.attn, i, r)
            _check_mlp(block.mlp, i, r, moe_cls)
    attn0 = model.blocks[0].attn if type(model.blocks[0]) is Block else None
    qk_norm = attn0 is not None and attn0.q.normalize and attn0.k.normalize
    moe = model.config.moe if moe_cls is not None and any(type(b.mlp) is moe_cls for b in model.blocks) else None
    if moe is None:
        arch = "Qwen3ForCausalLM" if qk_norm else "LlamaForCausalLM"
    elif moe.router == "sigmoid":
        arch = "Glm4MoeForCausalLM"
    elif qk_norm:
        arch = "Qwen3MoeForCausalLM"
    elif attn0 is None or attn0.q.normalize or attn0.k.normalize:
        arch = None  # refused above: only q or only k normalized
    else:
        arch = "MixtralForCausalLM"
        why = "Mixtral (the softmax-routed MoE architecture without QK-norm)"
        fix = "or train with placement.q and placement.k: dual_norm and output_shape: head (then Qwen3-MoE holds it)"
        if moe.first_dense_layers:
            r.add(f"the dense MLPs of the first {moe.first_dense_layers} layers (model.config.moe.first_dense_layers)"
                  f" have no place in {why}; set first_dense_layers: 0, {fix}", None)
        if not moe.route_norm:
            r.add(f"model.config.moe.route_norm: false leaves the top-k weights unnormalized, while {why} always "
                  f"normalizes them; set route_norm: true, {fix}", None)
    if r.layers:
        return None, r.lines()
    known = {id(b.attn.q.out_scale) for b in model.blocks} | {id(b.attn.k.out_scale) for b in model.blocks}
    left = [sp.name for sp in scale_parameters(model) if id(sp.vector) not in known]
    if left:
        return None, [f"scale parameters without a standard place after folding: {left[:4]}; {NATIVE_HINT}"]
    return arch, []


def _own(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous tensor with its own storage (safetensors refuses views sharing memory)."""
    t = t.detach().to(dtype)
    return t.clone() if t.untyped_storage().nbytes() != t.numel() * t.element_size() else t.contiguous()


def hf_layout(model: Transformer, eos_id: Optional[int] = None, dtype: torch.dtype = torch.float32) -> HFLayout:
    """Fold ``model`` (a copy) and map it to the weight names and config of a transformers architecture."""
    folded = fold_scales(model).eval()
    arch, problems = plan_hf(folded)
    if arch is None:
        raise HFExportError("cannot export to a standard transformers architecture:\n  - " + "\n  - ".join(problems))
    model_type, moe_prefix, expert_names = ARCHITECTURES[arch]
    c, s, d = folded.config, folded.strategy, folded.config.n_embd
    qk_norm = folded.blocks[0].attn.q.normalize
    ones = lambda: torch.ones(d)  # noqa: E731  (our folded norms are bare RMS: HF norm weight of ones)
    t: dict[str, torch.Tensor] = {"model.embed_tokens.weight": folded.embed.weight}
    for i, block in enumerate(folded.blocks):
        a, m, p = block.attn, block.mlp, f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = ones()
        for name, proj in (("q", a.q), ("k", a.k), ("v", a.v)):
            t[p + f"self_attn.{name}_proj.weight"] = proj.linear.weight
        t[p + "self_attn.o_proj.weight"] = a.o.weight
        if qk_norm:
            t[p + "self_attn.q_norm.weight"] = _head_weight(a.q, a.n_head, a.head_dim)[0]
            t[p + "self_attn.k_norm.weight"] = _head_weight(a.k, a.n_kv_head, a.head_dim)[0]
        t[p + "post_attention_layernorm.weight"] = ones()
        if type(m) is SwiGLU:
            t[p + "mlp.gate_proj.weight"] = m.gate.linear.weight
            t[p + "mlp.up_proj.weight"] = m.up.linear.weight
            t[p + "mlp.down_proj.weight"] = m.down.weight
        else:  # MoE, in the per-expert layout of the hub checkpoints (transformers 5 fuses it on load)
            t[p + f"{moe_prefix}.gate.weight"] = m.router.linear.weight
            if arch == "Glm4MoeForCausalLM":
                bias = getattr(m, "expert_bias", None)
                t[p + "mlp.gate.e_score_correction_bias"] = torch.zeros(m.num_experts) if bias is None else bias
                sh = m.shared  # Glm4-MoE always has a shared MLP: zero width when we have none
                empty = torch.zeros(0, d)
                t[p + "mlp.shared_experts.gate_proj.weight"] = empty if sh is None else sh.gate.linear.weight
                t[p + "mlp.shared_experts.up_proj.weight"] = empty if sh is None else sh.up.linear.weight
                t[p + "mlp.shared_experts.down_proj.weight"] = empty.T if sh is None else sh.down.weight
            for e in range(m.num_experts):
                for name, w in zip(expert_names, (m.expert_gate, m.expert_up, m.expert_down)):
                    t[p + f"{moe_prefix}.experts.{e}.{name}.weight"] = w[e]
    t["model.norm.weight"] = ones()
    tied = folded.head.weight is folded.embed.weight
    if not tied:
        t["lm_head.weight"] = folded.head.weight
    config: dict[str, Any] = {
        "architectures": [arch],
        "model_type": model_type,
        "vocab_size": c.vocab_size,
        "hidden_size": d,
        "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.n_layer,
        "num_attention_heads": c.n_head,
        "num_key_value_heads": c.n_kv_head,
        "head_dim": c.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": c.seq_len,
        "rms_norm_eps": s.eps,
        "rope_theta": c.rope_theta,  # transformers < 5 reads this; 5.x reads rope_parameters
        "rope_parameters": {"rope_type": "default", "rope_theta": c.rope_theta},
        "tie_word_embeddings": tied,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": c.init_std,
        "use_cache": True,
        "bos_token_id": None,
        "eos_token_id": eos_id,
        "pad_token_id": None,
        "dtype": next(k for k, v in DTYPES.items() if v == dtype),
    }
    moe = c.moe
    if arch == "LlamaForCausalLM":
        config.update(mlp_bias=False, pretraining_tp=1)
    if arch in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM"):
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=c.n_layer,
                      layer_types=["full_attention"] * c.n_layer)
    if arch == "Qwen3MoeForCausalLM":
        config.update(num_experts=moe.num_experts, num_experts_per_tok=moe.top_k,
                      moe_intermediate_size=moe.expert_intermediate_size, norm_topk_prob=moe.route_norm,
                      decoder_sparse_step=1, mlp_only_layers=list(range(moe.first_dense_layers)),
                      output_router_logits=False, router_aux_loss_coef=moe.aux_loss_coef)
    if arch == "MixtralForCausalLM":
        config.update(num_local_experts=moe.num_experts, num_experts_per_tok=moe.top_k,
                      intermediate_size=moe.expert_intermediate_size, sliding_window=None,
                      output_router_logits=False, router_aux_loss_coef=moe.aux_loss_coef, router_jitter_noise=0.0)
    if arch == "Glm4MoeForCausalLM":
        config.update(n_routed_experts=moe.num_experts, num_experts_per_tok=moe.top_k,
                      moe_intermediate_size=moe.expert_intermediate_size, n_shared_experts=moe.num_shared_experts,
                      first_k_dense_replace=moe.first_dense_layers, norm_topk_prob=moe.route_norm,
                      routed_scaling_factor=1.0, n_group=1, topk_group=1, use_qk_norm=qk_norm, num_mtp_layers=0,
                      partial_rotary_factor=1.0, output_router_logits=False)
        config["rope_parameters"]["partial_rotary_factor"] = 1.0
    return HFLayout(arch, config, {k: _own(v, dtype) for k, v in t.items()})


# -- writing ---------------------------------------------------------------------------------------------
def parse_size(text: str | int) -> int:
    """``'5GB'``, ``'500MB'``, ``'2MiB'`` or a byte count → bytes."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", str(text).upper())
    if not m:
        raise ExportError(f"--max-shard-size: {text!r} is not a size; write e.g. 5GB, 500MB or 1000000")
    unit = m.group(2).rstrip("B") or ""
    base = 1024 if unit.endswith("I") else 1000
    power = " KMGT".index(unit.rstrip("I") or " ")
    return int(float(m.group(1)) * base**power)


def write_safetensors(tensors: dict[str, torch.Tensor], out: Path, max_shard_size: int | str = "5GB") -> list[str]:
    """``model.safetensors``, or shards + ``model.safetensors.index.json`` when above ``max_shard_size``."""
    from safetensors.torch import save_file

    limit = parse_size(max_shard_size)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata={"format": "pt"})
        return ["model.safetensors"]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for fname, shard in zip(names, shards):
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return names + ["model.safetensors.index.json"]


def _run_configs(ckpt: Path) -> list[Path]:
    """The ``config.yaml`` files LightningCLI saved for the run of ``ckpt``: beside its folder
    (``<log_dir>/checkpoints/x.ckpt``), else in the logger's version folders under an ancestor
    (``<root>/checkpoints/x.ckpt`` with ``<root>/<name>/version_N/config.yaml``)."""
    for folder in list(ckpt.resolve().parents)[:2]:
        if (folder / "config.yaml").is_file():
            return [folder / "config.yaml"]
        found = sorted(folder.glob("*/version_*/config.yaml"))
        if found:
            return found
    return []


def _tokenizer_of_config(cfg: Path) -> tuple[Optional[Path], str]:
    """``(tokenizer, where from)`` from a run's config.yaml; ``(None, why not)`` when it does not say."""
    import yaml

    data = (yaml.safe_load(cfg.read_text()) or {}).get("data") or {}
    data = data.get("init_args", data)
    if data.get("tokenizer"):
        return Tokenizer(data["tokenizer"], key=f"data.tokenizer in {cfg}").path, f"data.tokenizer of {cfg}"
    meta = Path(str(data.get("data_dir", ""))) / "meta.json"
    if not data.get("data_dir") or not meta.is_file():
        return None, f"data.data_dir of {cfg} ({data.get('data_dir')!r}) has no meta.json seen from here"
    path = json.loads(meta.read_text()).get("tokenizer")
    if not path or not Path(path).is_file():
        raise ExportError(
            f"the run's data ({meta}) was prepared with the tokenizer {path!r}, which is not there any more; "
            "pass --tokenizer <tokenizer.json>"
        )
    return Path(path), f"the tokenizer {meta} was prepared with (data.data_dir of {cfg})"


def find_tokenizer(ckpt: Optional[str | Path], explicit: Optional[str | Path] = None) -> tuple[Path, str]:
    """The tokenizer.json to ship and a note saying where it came from.

    Order: ``--tokenizer``; the one inside a native export folder; the run's ``config.yaml`` near the
    checkpoint (``data.tokenizer``, else the tokenizer that ``data.data_dir`` was prepared with, from its
    ``meta.json``); else the embedded one, and the note says so.
    """
    if explicit is not None:
        return Tokenizer(explicit, key="--tokenizer").path, "given with --tokenizer"
    if ckpt is not None and (Path(ckpt) / "tokenizer.json").is_file():
        return Path(ckpt) / "tokenizer.json", f"the one in {ckpt}"
    why = "no --tokenizer and no run config.yaml near the checkpoint"
    found = {}
    for cfg in _run_configs(Path(ckpt)) if ckpt is not None else []:
        path, note = _tokenizer_of_config(cfg)
        if path is None:
            why = f"no --tokenizer, and {note}"
        else:
            found.setdefault(Tokenizer(path).fingerprint(), (path, note))
    if len(found) > 1:
        names = ", ".join(str(path) for path, _ in found.values())
        raise ExportError(
            f"the run folders near {str(ckpt)!r} name different tokenizers ({names}); pass --tokenizer <tokenizer.json>"
        )
    if found:
        return next(iter(found.values()))
    return DEFAULT_TOKENIZER, (
        f"{why}: shipping the embedded tokenizer {DEFAULT_TOKENIZER}; pass --tokenizer if the model was trained "
        "with another"
    )


def write_tokenizer(path: Path, out: Path, vocab_size: int, max_length: int) -> Tokenizer:
    """Copy ``tokenizer.json`` and write the ``tokenizer_config.json`` transformers' AutoTokenizer reads."""
    from tokenizers import Tokenizer as RawTokenizer

    tok = Tokenizer(path, key="--tokenizer")
    if tok.vocab_size > vocab_size:
        raise ExportError(
            f"--tokenizer: {str(path)!r} has {tok.vocab_size} tokens but the model's vocab_size is {vocab_size}; "
            "pass the tokenizer.json the model was trained with"
        )
    shutil.copyfile(tok.path, out / "tokenizer.json")
    eos = RawTokenizer.from_file(str(tok.path)).id_to_token(tok.eos_id)
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "bos_token": None, "pad_token": None,
        "unk_token": None, "model_max_length": max_length, "clean_up_tokenization_spaces": False,
    }, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps({"eos_token": eos}, indent=2))
    return tok


def _prepare_out(out: str | Path, overwrite: bool) -> Path:
    out = Path(out)
    if out.is_file() or (out.is_dir() and any(out.iterdir()) and not overwrite):
        raise ExportError(f"--out: {str(out)!r} exists and is not an empty folder; choose another or pass --overwrite")
    out.mkdir(parents=True, exist_ok=True)
    stale = [*out.glob("model*.safetensors"), out / "model.safetensors.index.json", out / NATIVE_SPEC]
    for old in stale:  # --overwrite: no shard or spec of an earlier export may survive
        old.unlink(missing_ok=True)
    return out


def _default_note(tokenizer: Optional[Path]) -> str:
    return f"given: {tokenizer}" if tokenizer is not None else f"none given: the embedded {DEFAULT_TOKENIZER}"


@dataclass
class ExportResult:
    out: Path
    format: str
    architecture: str
    files: list[str]
    tokenizer_note: str


def save_hf(model: Transformer, out: str | Path, *, tokenizer: Optional[Path] = None, tokenizer_note: str = "",
            max_shard_size: int | str = "5GB", dtype: str = "float32", overwrite: bool = False) -> ExportResult:
    """Fold ``model`` and write it as a transformers checkpoint folder (see the module docstring)."""
    if dtype not in DTYPES:
        raise ExportError(f"--dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    tok_path = Path(tokenizer) if tokenizer is not None else DEFAULT_TOKENIZER
    eos_id = Tokenizer(tok_path, key="--tokenizer").eos_id
    layout = hf_layout(model, eos_id=eos_id, dtype=DTYPES[dtype])  # refuses before touching --out
    dest = _prepare_out(out, overwrite)
    files = write_safetensors(layout.tensors, dest, max_shard_size)
    (dest / "config.json").write_text(json.dumps(layout.config, indent=2))
    (dest / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_id}, indent=2))
    write_tokenizer(tok_path, dest, model.config.vocab_size, model.config.seq_len)
    files += ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
    return ExportResult(dest, "hf", layout.architecture, files, tokenizer_note or _default_note(tokenizer))


def save_native(model: Transformer, out: str | Path, *, spec: Optional[dict[str, Any]] = None,
                tokenizer: Optional[Path] = None, tokenizer_note: str = "", max_shard_size: int | str = "5GB",
                overwrite: bool = False) -> ExportResult:
    """Our own state dict (unfolded, fp32) as safetensors + the spec as JSON (``load_native`` reads it)."""
    spec = spec or model_spec(model.config, model.strategy, type(model.blocks[0]))
    dest = _prepare_out(out, overwrite)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if model.head.weight is model.embed.weight:
        state.pop("head.weight", None)  # tied: rebuilt from the spec's tie_embeddings
    files = write_safetensors(state, dest, max_shard_size)
    (dest / NATIVE_SPEC).write_text(json.dumps(spec, indent=2))
    tok_path = Path(tokenizer) if tokenizer is not None else DEFAULT_TOKENIZER
    write_tokenizer(tok_path, dest, model.config.vocab_size, model.config.seq_len)
    files += [NATIVE_SPEC, "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
    return ExportResult(dest, "native", "scalevec_lit Transformer", files, tokenizer_note or _default_note(tokenizer))


def load_native(folder: str | Path) -> Transformer:
    """Rebuild a model written by ``save_native`` (fp32, eval mode)."""
    return load_model(folder)[0]


def export(ckpt: str | Path, out: str | Path, *, format: str = "hf", tokenizer: Optional[str | Path] = None,
           max_shard_size: int | str = "5GB", dtype: str = "float32", overwrite: bool = False) -> ExportResult:
    """Read ``ckpt`` and export it (what ``python -m scalevec_lit export`` runs)."""
    if format not in ("hf", "native"):
        raise ExportError(f"--format: {format!r} is not one of hf, native")
    model, spec = load_model(ckpt)
    tok_path, note = find_tokenizer(ckpt, tokenizer)
    if format == "native":
        return save_native(model, out, spec=spec, tokenizer=tok_path, tokenizer_note=note,
                           max_shard_size=max_shard_size, overwrite=overwrite)
    return save_hf(model, out, tokenizer=tok_path, tokenizer_note=note, max_shard_size=max_shard_size,
                   dtype=dtype, overwrite=overwrite)


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m scalevec_lit export",
        description="Fold the scale vectors of a checkpoint and write a transformers model folder (or ours).",
    )
    parser.add_argument("--ckpt", required=True, help="Lightning .ckpt, distributed checkpoint folder or native export")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--format", choices=("hf", "native"), default="hf",
                        help="hf: Llama/Qwen3 layout, folded (default); native: our state dict + spec")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer.json to ship (default: the one the run's data was prepared with, found "
                             "through the run's config.yaml; else the embedded one)")
    parser.add_argument("--max-shard-size", default="5GB", help="shard model.safetensors above this size (5GB)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float32", help="dtype of the hf weights")
    parser.add_argument("--overwrite", action="store_true", help="write into a non-empty --out")
    args = parser.parse_args(argv)
    try:
        result = export(args.ckpt, args.out, format=args.format, tokenizer=args.tokenizer,
                        max_shard_size=args.max_shard_size, dtype=args.dtype, overwrite=args.overwrite)
    except (ExportError, FileNotFoundError) as err:
        raise SystemExit(f"error: {err}") from None
    print(f"tokenizer: {result.tokenizer_note}", file=sys.stderr)
    print(f"exported {args.ckpt} as {result.architecture} ({result.format}) to {result.out}: {', '.join(result.files)}")


if __name__ == "__main__":
    main()
