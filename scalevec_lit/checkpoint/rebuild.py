"""Rebuilding the model a checkpoint holds: ``model_from_state`` (the spec's own class, block and strategy, built on
the meta device, the weights loaded in fp32 on CPU) and ``load_model`` (read + rebuild).

Plain torch: must not import Lightning or transformers, nor ``export/`` or ``hub/``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ..model.rope import rope_tables
from ..model.spec import STOCK_MODEL, UnimportableClassError, build_from_spec
from ..model.transformer import Transformer
from .errors import ExportError
from .read import read_checkpoint


def model_from_state(spec: dict[str, Any], state: dict[str, torch.Tensor]) -> Transformer:
    """Build the model of ``spec`` (its own class, block and strategy: ``model/spec.py``) on the meta device, then
    load ``state`` (fp32, CPU) into it; a class that cannot be imported is refused by name with the fix."""
    try:
        from ..model.meta import meta_device

        with meta_device():  # tensors made of one Python number stay real (model/meta.py)
            model = build_from_spec(spec)
    except UnimportableClassError as err:
        raise ExportError(f"--ckpt: the checkpoint's model cannot be rebuilt: {err}") from None
    model.to_empty(device="cpu")
    model.float()
    tied = model.config.tie_embeddings
    if tied:
        state = {k: v for k, v in state.items() if k != Transformer.HEAD_KEY}
    own = model.state_dict()
    reshaped = [f"{k} {tuple(v.shape)} in the checkpoint, {tuple(own[k].shape)} now" for k, v in state.items()
                if k in own and own[k].shape != v.shape]
    missing, unexpected = ([k for k in own if k not in state and not (tied and k == Transformer.HEAD_KEY)],
                           [k for k in state if k not in own])
    if missing or unexpected or reshaped:
        model_path = (spec.get("model") or {}).get("class_path", STOCK_MODEL)
        block = spec.get("block") or {}
        built = f"{model_path} with the block {block.get('class_path', '?')}" + (
            f" {block['init_args']}" if block.get("init_args") else "")
        found = [f"{what}: {keys[:4]}" for what, keys in (("missing", missing), ("unexpected", unexpected),
                                                           ("other shapes", reshaped)) if keys]
        raise ExportError(
            f"--ckpt: the weights do not fit the model its spec names ({built}; {', '.join(found)}): that class "
            "now builds other parameters than when the checkpoint was written; restore the class (or its package "
            "version) that wrote it"
        )
    model.load_state_dict(state, strict=False)
    if tied:
        model.tie_()
    cos, sin = rope_tables(model.config.seq_len, model.config.head_dim, model.config.rope_theta)
    model.rope_cos.copy_(cos)
    model.rope_sin.copy_(sin)
    return model.eval()


def load_model(path: str | Path) -> tuple[Transformer, dict[str, Any]]:
    """The trained model (fp32, eval mode) and its spec, from any checkpoint ``read_checkpoint`` reads."""
    spec, state = read_checkpoint(path)
    return model_from_state(spec, state), spec
