"""A model's recipe as plain data: config + strategy + block, to store in checkpoints and rebuild.

``model_spec(config, strategy, block)`` gives a JSON/YAML-able dict; ``build_from_spec(spec)`` gives
back an equivalent ``Transformer`` (parameters freshly initialized; load a state dict into it);
``check_spec(saved, current, path)`` refuses a checkpoint written by another model.
Classes and class factories (what jsonargparse gives for ``class_path`` + ``init_args``) are stored as
``{"class_path": ..., "init_args": ...}``.

Plain torch only: must not import Lightning.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Any, Callable, Optional

from ..scale.strategy import Placement, ScaleStrategy
from ..verify import CheckpointError
from .config import MoEConfig, TransformerConfig


def describe_callable(fn: Callable) -> dict[str, Any]:
    """``{"class_path", "init_args"}`` for a class, or a partial of a class (jsonargparse's form)."""
    kwargs: dict[str, Any] = {}
    target = fn
    while isinstance(target, functools.partial):
        kwargs = {**target.keywords, **kwargs}
        target = target.args[-1] if target.args and isinstance(target.args[-1], type) else target.func
    if not isinstance(target, type) and not callable(target):
        raise TypeError(f"cannot describe {fn!r}: not a class or a partial of one")
    return {"class_path": f"{target.__module__}.{target.__qualname__}", "init_args": dict(kwargs)}


def import_object(path: str):
    module, _, name = path.rpartition(".")
    obj = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj


def rebuild_callable(desc: dict[str, Any]) -> Callable:
    cls = import_object(desc["class_path"])
    return functools.partial(cls, **desc.get("init_args", {})) if desc.get("init_args") else cls


def model_spec(config: TransformerConfig, strategy: ScaleStrategy, block: Callable) -> dict[str, Any]:
    strat = {f.name: getattr(strategy, f.name) for f in dataclasses.fields(strategy)}
    strat["vector"] = describe_callable(strategy.vector)
    strat["placement"] = dataclasses.asdict(strategy.placement)
    return {"config": dataclasses.asdict(config), "strategy": strat, "block": describe_callable(block)}


def strategy_from_dict(strat: dict[str, Any]) -> ScaleStrategy:
    """A ``ScaleStrategy`` from plain data: a spec's ``strategy`` or a preset file's ``model.strategy``."""
    strat = dict(strat)
    vector = strat.get("vector", {"class_path": "scalevec_lit.scale.PlainScale"})
    strat["vector"] = rebuild_callable(vector if isinstance(vector, dict) else {"class_path": vector})
    strat["placement"] = Placement(**strat.get("placement", {}))
    return ScaleStrategy(**strat)


def spec_parts(spec: dict[str, Any]) -> tuple[TransformerConfig, ScaleStrategy, Callable]:
    cfg = dict(spec["config"])
    moe = cfg.pop("moe", None)
    config = TransformerConfig(**cfg, moe=MoEConfig(**moe) if moe else None)
    return config, strategy_from_dict(spec["strategy"]), rebuild_callable(spec["block"])


def build_from_spec(spec: dict[str, Any]):
    from .transformer import Transformer

    config, strategy, block = spec_parts(spec)
    return Transformer(config, strategy, block)


SHAPE_KEYS = ("vocab_size", "n_layer", "n_embd", "n_head", "n_kv_head", "head_dim", "intermediate_size", "moe",
              "tie_embeddings")


def check_spec(saved: Optional[dict], current: dict, path: Optional[str]) -> None:
    """Raise ``CheckpointError`` when a checkpoint's model (shape, scale strategy, block) differs from this run's."""
    if not saved:
        return
    diffs = []
    for section, keys in (("config", SHAPE_KEYS), ("strategy", tuple(current.get("strategy", {})))):
        a, b = saved.get(section, {}), current.get(section, {})
        diffs += [f"{section}.{k}: checkpoint {a.get(k)!r}, this run {b.get(k)!r}" for k in keys if a.get(k) != b.get(k)]
    if saved.get("block") != current.get("block"):
        diffs.append(f"block: checkpoint {saved.get('block')}, this run {current.get('block')}")
    if diffs:
        raise CheckpointError(
            f"checkpoint {path or '?'} was written by another model: " + "; ".join(diffs)
            + ". Resume with the recipe that wrote it (config.yaml in its run folder) or start afresh"
        )
