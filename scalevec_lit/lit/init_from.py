"""``fit --model.init_from PATH``: start training from a checkpoint's weights only (fresh optimizer, schedule
and step count), after checking that the recipe builds the same model.

``read_init(path, config, strategy, block)`` reads the checkpoint (a native folder from ``import`` /
``convert`` / ``export --format native``, a Lightning ``.ckpt`` or a distributed checkpoint folder),
compares its spec with the recipe's and returns the config to build (the checkpoint's vocabulary when
the tokenizer's fits in it) and the weights; ``load_init_weights`` puts them into the built model.
What must agree: every shape key of ``model.config`` (also ``rope_theta`` and the MoE shape; not
``seq_len``, the recipe's), the whole ``model.strategy``, the block class with its ``init_args`` and, once the
model is built, its class (a ``CausalLM`` subclass's ``build_model``) with its ``init_args``. A mismatch is one
paragraph naming every differing key and the fix (the ``model.yaml`` written beside the checkpoint, or ``convert``).

Must not import Lightning (the module that calls it does).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional

import torch

from ..checkpoint import ExportError, read_checkpoint_extra
from ..errors import UserError
from ..model.config import TransformerConfig
from ..model.spec import describe_model, model_spec
from ..scale.strategy import ScaleStrategy

CONFIG_KEYS = ("n_layer", "n_embd", "n_head", "n_kv_head", "head_dim", "intermediate_size", "rope_theta",
               "tie_embeddings")
MOE_KEYS = ("num_experts", "top_k", "expert_intermediate_size", "num_shared_experts", "router", "scales",
            "first_dense_layers", "route_norm", "bias_balancing")


def _diffs(saved: dict[str, Any], current: dict[str, Any]) -> list[str]:
    out = []
    a, b = saved["config"], current["config"]
    for k in CONFIG_KEYS:
        if a.get(k) != b.get(k) and not (k == "intermediate_size" and a.get("moe") and not _has_dense(a)):
            out.append(f"model.config.{k}: checkpoint {a.get(k)!r}, recipe {b.get(k)!r}")
    ma, mb = a.get("moe"), b.get("moe")
    if (ma is None) != (mb is None):
        out.append(f"model.config.moe: checkpoint {'set' if ma else 'null'}, recipe {'set' if mb else 'null'}")
    elif ma:
        out += [f"model.config.moe.{k}: checkpoint {ma.get(k)!r}, recipe {mb.get(k)!r}" for k in MOE_KEYS
                if ma.get(k) != mb.get(k)]
    sa, sb = ({**x, "vector": _full_args(x.get("vector"))} for x in (saved["strategy"], current["strategy"]))
    out += [f"model.strategy.{k}: checkpoint {sa.get(k)!r}, recipe {sb.get(k)!r}" for k in dict.fromkeys([*sa, *sb])
            if sa.get(k) != sb.get(k)]
    a, b = _full_args(saved.get("block")), _full_args(current.get("block"))  # a default written out is the same
    if a != b:
        if a["class_path"] != b["class_path"]:
            out.append(f"model.block: checkpoint {a['class_path']}, recipe {b['class_path']}")
        else:  # the same class with other init_args: each differing argument
            ia, ib = a.get("init_args") or {}, b.get("init_args") or {}
            out += [f"model.block.init_args.{k}: checkpoint {ia.get(k)!r}, recipe {ib.get(k)!r}"
                    for k in dict.fromkeys([*ia, *ib]) if ia.get(k) != ib.get(k)]
    return out


def _full_args(desc: Any) -> Any:
    """A ``{class_path, init_args}`` with the class's defaults filled in (jsonargparse writes them, specs not)."""
    import inspect

    from ..model.spec import import_object

    if not isinstance(desc, dict):
        return desc
    try:
        params = inspect.signature(import_object(desc["class_path"])).parameters.values()
    except (ImportError, AttributeError, ValueError, TypeError):
        return desc
    defaults = {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}
    return {"class_path": desc["class_path"], "init_args": {**defaults, **(desc.get("init_args") or {})}}


def _has_dense(config: dict[str, Any]) -> bool:
    return bool(config["moe"].get("first_dense_layers"))


def read_init(path: str, config: TransformerConfig, strategy: ScaleStrategy,
              block: Callable) -> tuple[TransformerConfig, dict[str, torch.Tensor]]:
    """``(config to build, weights)`` for ``init_from``; ``UserError`` when the recipe builds another model."""
    config, state, _, _ = read_init_with_tokenizer(path, config, strategy, block)
    return config, state


def read_init_with_tokenizer(path: str, config: TransformerConfig, strategy: ScaleStrategy, block: Callable
                             ) -> tuple[TransformerConfig, dict[str, torch.Tensor], Optional[dict], dict]:
    """``read_init``, the identity of the checkpoint's tokenizer (``tokenizer_check.py``) or ``None``, and the model
    entry of its spec (``load_init_weights`` compares it with the model built)."""
    from .tokenizer_check import checkpoint_identity

    key = "model.init_from"
    try:
        spec, state, extra = read_checkpoint_extra(path)
    except ExportError as err:
        raise UserError(key, path, str(err).split(": ", 1)[-1].split("; ")[0], "give a native folder (import, convert or export "
                        "--format native), a .ckpt of fit, or a distributed checkpoint folder") from None
    current = model_spec(config, strategy, block)
    diffs = _diffs(spec, current)
    if diffs:
        raise UserError(key, path, "the checkpoint holds another model than the recipe builds: " + "; ".join(diffs),
                        f"add --config {path}/model.yaml when the checkpoint came from import or convert (it holds "
                        "the model section), set the keys above, or convert the checkpoint to the recipe's strategy: "
                        f"python -m scalevec_lit convert --ckpt {path} --strategy <preset> --out <folder>")
    vocab = int(spec["config"]["vocab_size"])
    if vocab < config.vocab_size:
        raise UserError(key, path, f"the checkpoint's vocabulary ({vocab}) is smaller than the tokenizer's "
                        f"({config.vocab_size})", "prepare the data with the tokenizer that came with the checkpoint "
                        "(the tokenizer.json in its folder)")
    return (dataclasses.replace(config, vocab_size=vocab), state, checkpoint_identity(path, extra),
            spec.get("model") or describe_model())


@torch.no_grad()
def load_init_weights(model: torch.nn.Module, state: dict[str, torch.Tensor], path: str,
                      saved_model: Optional[dict] = None) -> None:
    """Copy ``state`` into ``model`` (all keys; a tied head may be absent); refuses a partial fit, and a model of
    another class (or ``init_args``) than ``saved_model``, the model entry of the checkpoint's spec, when given."""
    built = describe_model(model)
    if saved_model is not None and saved_model != built:
        raise UserError("model.init_from", path, f"the checkpoint holds a {_text(saved_model)} model, the recipe "
                        f"builds a {_text(built)}", "choose the CausalLM subclass whose build_model builds the "
                        "checkpoint's model with model.class_path (the stock Transformer: leave model.class_path out)")
    tied = getattr(model, "tied", False)
    head = getattr(type(model), "HEAD_KEY", None)
    state = {k: v for k, v in state.items() if not (tied and k == head)}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not (tied and k == head)]
    if missing or unexpected:
        raise UserError("model.init_from", path, f"its weights do not fit the model (missing: {missing[:4]}, "
                        f"unexpected: {unexpected[:4]})", "give a checkpoint written for this model")
    if tied:
        model.tie_()


def _text(desc: dict[str, Any]) -> str:
    return desc["class_path"] + (f" {desc['init_args']}" if desc.get("init_args") else "")
