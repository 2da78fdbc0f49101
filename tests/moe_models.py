"""What the MoE tests share (``tests/test_moe.py``, ``tests/test_moe_model.py``, ``tests/test_moe_compile.py``): the
strategy presets, a preset read without the CLI, a tiny MoE config, scales moved off their init. Test files
import it as ``from moe_models import ...``.
"""
from __future__ import annotations

import functools
from pathlib import Path

import torch
import yaml

from helpers import ROOT, tiny_config
from scalevec_lit.model import MoEConfig
from scalevec_lit.model.spec import import_object
from scalevec_lit.scale import ScaleStrategy, scale_parameters

PRESETS = sorted((ROOT / "recipes" / "strategy").glob("*.yaml"))


def preset_strategy(path: Path) -> ScaleStrategy:
    """A ScaleStrategy from a preset file, without the CLI."""
    strat = dict(yaml.safe_load(path.read_text())["model"]["strategy"])
    vec = strat.pop("vector")
    cls = import_object(vec["class_path"])
    strat["vector"] = functools.partial(cls, **vec["init_args"]) if vec.get("init_args") else cls
    return ScaleStrategy(**strat)


def moe_config(**moe):
    base = dict(num_experts=4, top_k=2, expert_intermediate_size=64)
    base.update(moe)
    return tiny_config(moe=MoEConfig(**base))


@torch.no_grad()
def perturb_scales(model: torch.nn.Module, amount: float = 0.3) -> None:
    for sp in scale_parameters(model):
        sp.param.add_(amount * torch.randn_like(sp.param))
