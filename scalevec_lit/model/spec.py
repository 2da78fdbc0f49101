"""A model's identity as plain data: model class + config + strategy + block, stored in checkpoints to rebuild it.

``model_spec(config, strategy, block, model)`` gives a JSON/YAML-able dict; ``spec_of(model)`` the spec of a
built model; ``build_from_spec(spec)`` gives back the same model class (parameters freshly initialized; load
a state dict into it); ``check_rebuildable(model, spec)`` refuses, at fit start, a model that its spec would not
rebuild. Comparing a checkpoint's spec with a run's is the checkpoint package's (``checkpoint/match.py``).
Classes and class factories (what jsonargparse gives for ``class_path`` + ``init_args``) are stored as
``{"class_path": ..., "init_args": ...}``.

The model entry: the class of the built model (``Transformer`` or a subclass, e.g. returned by a
``CausalLM.build_model`` override), rebuilt as ``cls(config, strategy, block, **init_args)``; a subclass
whose constructor takes more arguments stores them in ``self.init_args`` (a dict) so that they are recorded.
A spec without a model entry (older checkpoints) is the stock ``Transformer``.

Plain torch only: must not import Lightning.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Any, Callable

from ..scale.keeps import placement_data
from ..scale.strategy import Placement, ScaleStrategy
from .config import MoEConfig, TransformerConfig

#: the model class of a spec that names none (written before the model entry existed)
STOCK_MODEL = "scalevec_lit.model.transformer.Transformer"
_CORE_ARGS = ("config", "strategy", "block")


class UnimportableClassError(ImportError):
    """A spec names a class that this process cannot import (``str`` is the whole message with the fix)."""

    def __init__(self, class_path: str, err: BaseException) -> None:
        module = class_path.rpartition(".")[0]
        super().__init__(
            f"the class {class_path} cannot be imported ({type(err).__name__}: {err}); make its package importable "
            f"(install it, or add the folder that holds {module.split('.')[0]!r} to PYTHONPATH) or restore the class "
            "under that name")
        self.class_path = class_path


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
    """The object a dotted path names (module path, then attributes); ``ImportError`` or ``AttributeError``."""
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):  # the longest importable module prefix (a class may be nested)
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as err:
            if err.name is not None and not ".".join(parts[:cut]).startswith(err.name):
                raise  # a module that exists failed to import one of its own imports: say so
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    return importlib.import_module(path)


def import_class(path: str):
    """``import_object`` for a class a spec names; ``UnimportableClassError`` (names the class and the fix)."""
    try:
        return import_object(path)
    except (ImportError, AttributeError) as err:
        raise UnimportableClassError(path, err) from None


def rebuild_callable(desc: dict[str, Any]) -> Callable:
    cls = import_class(desc["class_path"])
    return functools.partial(cls, **desc.get("init_args", {})) if desc.get("init_args") else cls


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def describe_model(model: Any = None) -> dict[str, Any]:
    """The spec's model entry: the built model's class and its extra constructor arguments (``init_args``)."""
    if model is None:
        return {"class_path": STOCK_MODEL, "init_args": {}}
    return {"class_path": class_path(unwrapped_class(model)), "init_args": dict(getattr(model, "init_args", None) or {})}


def strategy_data(strategy: ScaleStrategy) -> dict[str, Any]:
    """A spec's ``strategy`` entry: ``strategy`` as plain data (``strategy_from_dict`` reads it back)."""
    strat = {f.name: getattr(strategy, f.name) for f in dataclasses.fields(strategy)}
    strat["vector"] = describe_callable(strategy.vector)
    strat["placement"] = placement_data(strategy)
    return strat


def model_spec(config: TransformerConfig, strategy: ScaleStrategy, block: Callable, model: Any = None) -> dict[str, Any]:
    """The spec of ``model`` (built from ``config``, ``strategy`` and ``block``; ``None``: a stock ``Transformer``)."""
    return {"model": describe_model(model), "config": dataclasses.asdict(config), "strategy": strategy_data(strategy),
            "block": describe_callable(block)}


def spec_of(model: Any) -> dict[str, Any]:
    """The spec of a built model: its class, its config and strategy as they are now, the block factory it was
    built with (with its ``init_args``; ``type(blocks[0])`` for a model that did not record one)."""
    block = getattr(model, "block_factory", None) or type(model.blocks[0])
    return model_spec(model.config, model.strategy, block, model)


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


def model_class(spec: dict[str, Any]) -> tuple[type, dict[str, Any]]:
    """``(model class, its extra constructor arguments)`` of a spec; ``UnimportableClassError``."""
    desc = spec.get("model") or describe_model()
    return import_class(desc["class_path"]), dict(desc.get("init_args") or {})


def build_from_spec(spec: dict[str, Any]):
    """The model of ``spec`` (its class, block and strategy), freshly initialized (or on the meta device)."""
    cls, init_args = model_class(spec)
    config, strategy, block = spec_parts(spec)
    return cls(config, strategy, block, **init_args)


def check_rebuildable(model: Any, spec: dict[str, Any]) -> None:
    """Refuse (``UserError`` on ``model``) a model that ``build_from_spec(spec)`` would not give back: another class,
    or other parameter names or shapes (built on the meta device), or constructor arguments that the spec does
    not record. Called at fit start, so that no checkpoint is written that export, generate or resume cannot read."""
    import inspect

    import torch

    from ..errors import UserError

    name, cls = spec["model"]["class_path"], unwrapped_class(model)
    how = (f"build it as {cls.__name__}(config, strategy, block, **extra) in CausalLM.build_model and set "
           "self.init_args = extra in its constructor")
    signature = inspect.signature(cls.__init__).parameters
    extra = [p for p in list(signature)[1:] if p not in _CORE_ARGS
             and signature[p].kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    unrecorded = [p for p in extra if p not in spec["model"]["init_args"]]
    if unrecorded:
        raise UserError("model", name, f"its constructor takes {', '.join(unrecorded)}, which a checkpoint would not "
                        "record", f"set self.init_args = {{{', '.join(repr(p) + ': ' + p for p in unrecorded)}}} in "
                        "its constructor")
    from .meta import RULE, meta_culprit, meta_device

    try:
        with meta_device():
            rebuilt = build_from_spec(spec)
    except Exception as err:  # whatever fails here would fail the same way in every reader of its checkpoints
        culprit = meta_culprit(err)
        if culprit is not None:  # a user class that reads a value while it is built: name it, and the rule
            raise UserError(culprit, f"{type(err).__name__}: {err}", "cannot be built on the meta device",
                            f"{RULE} (docs/subclassing.md)") from None
        raise UserError("model", name, f"cannot be rebuilt from its checkpoint spec ({type(err).__name__}: {err})",
                        how) from None
    shapes = {k: tuple(v.shape) for k, v in rebuilt.state_dict().items()}
    built = {_clean(k): tuple(v.shape) for k, v in model.state_dict().items()}
    if type(rebuilt) is not cls or shapes != built:
        differ = sorted(set(shapes) ^ set(built)) or [k for k in shapes if shapes[k] != built[k]]
        raise UserError("model", name, f"its checkpoint spec rebuilds another model ({type(rebuilt).__name__}; "
                        f"parameters that differ: {differ[:4]})", how)


def _clean(key: str) -> str:
    for part in ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module."):
        key = key.replace(part, "")
    return key


def unwrapped_class(model: Any) -> type:
    """The model's own class: ``fully_shard`` (FSDP2) swaps a module's class for a generated ``FSDP<name>``."""
    return next(c for c in type(model).__mro__ if not c.__module__.startswith("torch.distributed"))
