"""A checkpoint against this run: resume (``fit --ckpt_path``) and ``validate``/``test --ckpt_path`` load a
checkpoint into the model the recipe built, so the model the checkpoint holds must be that model.

``check_resume(checkpoint, current_spec, path)`` takes the dict Lightning loaded, reads its record
(``checkpoint['scalevec']``) once, refuses a checkpoint of another model (``check_spec``:
``MismatchedCheckpointError``, exit 2) and returns the record for the caller to use. What a resume compares
with the data (the tokenizer, ``lit/tokenizer_check.py``) or with the world (``lit/reshard.py``) stays with them.

Plain Python on dicts: must not import Lightning.
"""
from __future__ import annotations

from typing import Any, Optional

from ..model.spec import describe_model
from .verify import MismatchedCheckpointError

#: the config keys that decide the parameters' shapes (the others may change between runs of one model)
SHAPE_KEYS = ("vocab_size", "n_layer", "n_embd", "n_head", "n_kv_head", "head_dim", "intermediate_size", "moe",
              "tie_embeddings")


def check_resume(checkpoint: dict[str, Any], current_spec: dict[str, Any], path: Optional[str]) -> dict[str, Any]:
    """The checkpoint's record of its run (``checkpoint['scalevec']``: spec, tokens seen, skipped steps, tokenizer;
    empty when it has none), after checking that its model is this run's (``MismatchedCheckpointError`` if not)."""
    record = dict(checkpoint.get("scalevec") or {})
    check_spec(record.get("spec"), current_spec, path)
    return record


def check_spec(saved: Optional[dict], current: dict, path: Optional[str]) -> None:
    """Raise ``MismatchedCheckpointError`` when a checkpoint's model (shape, scale strategy, block) differs from this run's."""
    if not saved:
        return
    diffs = []
    model_a, model_b = saved.get("model") or describe_model(), current.get("model") or describe_model()
    if model_a != model_b:
        diffs.append(f"model: checkpoint {_model_text(model_a)}, this run {_model_text(model_b)} (a CausalLM subclass "
                     "overriding build_model is chosen with model.class_path)")
    for section, keys in (("config", SHAPE_KEYS), ("strategy", tuple(current.get("strategy", {})))):
        a, b = saved.get(section, {}), current.get(section, {})
        diffs += [f"{section}.{k}: checkpoint {a.get(k)!r}, this run {b.get(k)!r}" for k in keys if a.get(k) != b.get(k)]
    if saved.get("block") != current.get("block"):
        diffs.append(f"block: checkpoint {saved.get('block')}, this run {current.get('block')}")
    if diffs:
        raise MismatchedCheckpointError(  # exit 2: a sound checkpoint that does not fit this recipe
            f"checkpoint {path or '?'} was written by another model: " + "; ".join(diffs)
            + ". Resume with the recipe that wrote it (config.yaml in its run folder) or start afresh"
        )


def _model_text(desc: dict[str, Any]) -> str:
    args = desc.get("init_args") or {}
    return desc["class_path"] + (f" {args}" if args else "")
