"""Reading a local transformers checkpoint folder (``config.json`` + ``model.safetensors`` or shards with
``model.safetensors.index.json``; nothing is downloaded) into the native model that holds it exactly, through
the Hugging Face architecture adapters (``scalevec_lit/arch/``: ``LlamaForCausalLM``, ``Qwen3ForCausalLM``,
``Qwen3MoeForCausalLM``, ``MixtralForCausalLM`` and any registered one that imports).

``config_from_hf`` (the adapter's ``config.json`` → ``TransformerConfig`` and the strategy that holds the
checkpoint as it is: one plain γ per norm, QK-norm as DNP on q/k with a per-head u; every option we cannot hold
is refused with its key), ``read_hf_tensors``, ``open_hf`` (the native model, filled through the adapter's name
table, which export also uses, with its architecture and the spec it was built from) and ``load_hf`` (the
model and its architecture). ``import``, ``inspect`` and ``evaluate`` read a Hugging Face folder here.

Plain torch (+ safetensors): must not import Lightning or transformers, nor ``export/`` or ``hub/``.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import torch

from ..arch import architecture, architectures
from ..arch.names import native_tensor, site_of
from ..errors import RunError, UserError
from ..model.config import TransformerConfig
from ..model.rope import rope_tables
from ..model.spec import build_from_spec, describe_callable
from ..model.transformer import Transformer
from ..scale.convert import set_scale_
from ..scale.keeps import branch_normalizes

_IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some older checkpoints store


def importable() -> list[str]:
    """The architectures import reads: every registered adapter that imports (``scalevec_lit/arch/``)."""
    return [a.architecture for a in architectures() if a.importable]


def config_from_hf(cfg: dict[str, Any], where: str = "config.json") -> tuple[str, TransformerConfig, dict[str, Any]]:
    """``(architecture, TransformerConfig, strategy as spec data)`` of a transformers ``config.json``: the
    adapter of its architecture reads it (``HFArchitecture.config_from_hf``)."""
    archs = cfg.get("architectures") or []
    adapter = architecture(archs[0]) if len(archs) == 1 and isinstance(archs[0], str) else None
    if adapter is None or not adapter.importable:
        raise UserError(f"{where}: architectures", repr(archs), "is not an architecture import reads",
                        f"import a checkpoint of {', '.join(importable())}")
    config, strategy = adapter.config_from_hf(cfg, where)
    return adapter.architecture, config, strategy


def read_hf_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of ``model.safetensors`` or of the shards ``model.safetensors.index.json`` lists."""
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            raise RunError(str(index), "no weight_map", "the index does not map the weights to their shards",
                           "copy the checkpoint folder again from its source")
        files = sorted(set(weight_map.values()))
    elif (folder / "model.safetensors").is_file():
        files = ["model.safetensors"]
    else:
        raise UserError("--hf", str(folder), "has neither model.safetensors nor model.safetensors.index.json",
                        "give a folder saved with save_pretrained (safetensors; pytorch_model.bin is not read)")
    tensors: dict[str, torch.Tensor] = {}
    for name in files:
        if not (folder / name).is_file():
            raise UserError("--hf", str(folder), f"the index names the shard {name}, which is missing",
                            "copy the whole checkpoint folder")
        try:
            tensors.update(load_file(str(folder / name)))
        except Exception as err:  # noqa: BLE001 - safetensors raises its own types (SafetensorError) for a bad file
            raise RunError(str(folder / name), f"{(folder / name).stat().st_size:,} bytes",
                           f"not a readable safetensors file, truncated or damaged ({_first_line(err)})",
                           "copy it again from its source (or download the checkpoint again)") from None
    return tensors


def _first_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return f"{type(err).__name__}: {text[:200]}" if text else type(err).__name__


def _read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; a ``RunError`` naming the file when it is not one."""
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, ValueError) as err:
        raise RunError(str(path), f"{path.stat().st_size:,} bytes", f"not valid JSON, truncated or damaged "
                       f"({_first_line(err)})", "copy it again from its source") from None
    if not isinstance(data, dict):
        raise RunError(str(path), type(data).__name__, "not a JSON object", "copy it again from its source")
    return data


def load_hf(folder: str | Path) -> tuple[Transformer, str]:
    """The native model (fp32) holding the checkpoint in ``folder`` exactly, and its architecture."""
    model, arch, _ = open_hf(folder)
    return model, arch


@torch.no_grad()
def open_hf(folder: str | Path) -> tuple[Transformer, str, dict[str, Any]]:
    """``(the native model (fp32, eval mode) holding the checkpoint in folder exactly, its architecture, the spec
    it was built from)``: the spec is ``model/spec.py``'s plain data, as a native checkpoint records it."""
    folder = Path(folder)
    if not (folder / "config.json").is_file():
        raise UserError("--hf", str(folder), "has no config.json", "give a local transformers checkpoint folder")
    try:
        arch, config, strategy = config_from_hf(_read_json(folder / "config.json"), str(folder / "config.json"))
    except KeyError as err:
        raise UserError(str(folder / "config.json"), f"no {err.args[0]!r}", "a key every checkpoint of its "
                        "architecture has is missing", "give the config.json saved with the checkpoint") from None
    adapter = architecture(arch)
    spec = {"config": dataclasses.asdict(config), "strategy": strategy, "block": describe_callable(adapter.blocks[0])}
    with torch.device("meta"):
        model = build_from_spec(spec)
    model.to_empty(device="cpu")
    model.float()
    if config.tie_embeddings:
        model.tie_()
    for p in model.parameters():
        p.fill_(float("nan"))  # every value must come from the checkpoint
    cos, sin = rope_tables(config.seq_len, config.head_dim, config.rope_theta)
    model.rope_cos.copy_(cos)
    model.rope_sin.copy_(sin)
    tensors = read_hf_tensors(folder)
    rows = adapter.names(model, qk_norm=branch_normalizes(model.strategy, "q"))  # QK-norm as the adapter read it
    names = {n for n, _ in rows}
    missing = sorted(names - set(tensors))
    extra = sorted(k for k in set(tensors) - names if not k.endswith(_IGNORED_SUFFIXES))
    if config.tie_embeddings and "lm_head.weight" in extra:
        extra.remove("lm_head.weight")
        if not torch.equal(tensors["lm_head.weight"], tensors.get("model.embed_tokens.weight")):
            raise UserError(f"{folder / 'config.json'}: tie_word_embeddings", "true", "but lm_head.weight differs from "
                            "the embedding", "set tie_word_embeddings: false in config.json")
    if missing or extra:
        raise UserError("--hf", str(folder), f"the weights do not match {arch} of this config (missing: {missing[:4]}, "
                        f"not importable: {extra[:4]}{' (biases?)' if any('bias' in e for e in extra) else ''})",
                        "give an unmodified checkpoint of that architecture")
    for name, ref in rows:
        x = tensors[name].float()
        if ref.kind in ("norm", "head_norm"):
            site = site_of(model, ref)
            vec = (next((g.vector for g in site.input_scales() if g.key == "shared"), None) if ref.kind == "norm"
                   else site.output_vector(ref.branch))
            ok = vec is not None and vec.dim == x.numel() and set_scale_(vec, x)
        else:
            t = native_tensor(model, ref)
            ok = t is not None and t.shape == x.shape
            if ok:
                t.copy_(x)
        if not ok:
            raise UserError("--hf", str(folder), f"{name} has shape {tuple(x.shape)}, which does not fit config.json",
                            "give an unmodified checkpoint")
    left = [n for n, p in model.named_parameters() if torch.isnan(p).any()]
    if left:
        raise RuntimeError(f"import left parameters unset (a gap in the name table): {left[:5]}")
    return model.eval(), arch, spec
