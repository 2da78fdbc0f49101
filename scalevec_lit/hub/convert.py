"""``python -m scalevec_lit convert --ckpt A --strategy recipes/strategy/Y.yaml --out B``: rewrite a checkpoint
into another scale strategy, exactly where the math allows (``scale/convert.py``), and write it natively.

Lives here: reading a strategy file (``read_strategy``), ``convert_model`` (the same strategy: a bitwise copy;
another: build the target model, transfer in float64, compare both models' logits on a probe batch in float64,
refuse a change above ``tolerance`` (float64 rounding for the model's size, stated in the message) or any
structural change unless ``--allow-function-change``, refuse by name a target parameterization without an
inverse), ``write_native`` (the native folder + ``model.yaml``, the recipe fragment ``fit`` needs with
``--model.init_from``), ``convert_checkpoint`` and ``main``. ``import`` (``hf_import.py``) uses the same.

Plain torch (+ yaml): must not import Lightning or transformers.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

import torch
import yaml

from ..errors import UserError
from ..export.checkpoint import model_from_state, read_checkpoint_extra
from ..export.tokenizer import find_tokenizer
from ..export.write import write_native_files
from ..model.block import Block
from ..model.spec import STOCK_MODEL, build_from_spec, describe_callable, model_spec, spec_of, strategy_from_dict
from ..model.transformer import Transformer
from ..outdir import OutputFolder, output_folder
from ..scale.convert import Transfer, transfer_
from ..scale.strategy import ScaleStrategy
from ..scale.vector import NoInverse, ScaleVector

RECIPE = "model.yaml"
SAMPLE = (2, 64)  # the probe batch whose logits a conversion compares: 2 sequences of up to 64 random tokens


def read_strategy(path: str | Path, eps: float) -> ScaleStrategy:
    """``model.strategy`` of a preset or recipe file; ``eps`` (the source's) unless the file sets it."""
    p = Path(path)
    if not p.is_file():
        raise UserError("--strategy", str(path), "no such file", "give a preset such as recipes/strategy/hg.yaml")
    data = yaml.safe_load(p.read_text()) or {}
    strat = (data.get("model") or {}).get("strategy") if isinstance(data, dict) else None
    if not isinstance(strat, dict):
        raise UserError("--strategy", str(path), "has no model.strategy section",
                        "give a strategy preset (recipes/strategy/*.yaml) or a recipe that sets model.strategy")
    strat = {"eps": eps, **strat}
    try:
        return strategy_from_dict(strat)
    except (TypeError, ValueError, ImportError, AttributeError) as err:
        raise UserError("--strategy", str(path), f"its model.strategy is not valid ({err})",
                        "fix the file; the presets in recipes/strategy/ show every key") from None


def probe_batch(model: Transformer, seed: int = 0) -> torch.Tensor:
    """The probe batch whose logits a conversion compares: ``SAMPLE`` random tokens (fixed seed)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, model.config.vocab_size, (SAMPLE[0], min(SAMPLE[1], model.config.seq_len)), generator=gen)


def tolerance(config) -> float:
    """The largest relative logits change (max |Δ| / max |logits|) that float64 rounding explains for a model of
    this size: ``ε₆₄ · (2 L + 1) · w^1.5``, a worst-case bound for L layers of two sublayers (plus the head)
    whose dot products have length up to ``w`` (the widest of n_embd, the q width and the MLP / expert width).
    Any conversion that keeps the function exactly moves the logits far less; any change of the function
    (a normalization added or removed, another eps, a scale that could not be held) far more."""
    return torch.finfo(torch.float64).eps * (2 * config.n_layer + 1) * float(widest(config)) ** 1.5


def widest(config) -> int:
    """The longest dot product of a layer: n_embd, the q width, the MLP or (shared) expert width."""
    widths = [config.n_embd, config.n_head * config.head_dim, config.intermediate_size or 0]
    if config.moe is not None:
        widths.append(config.moe.expert_intermediate_size * max(1, config.moe.num_shared_experts))
    return max(widths)


def _same_strategy(model: Transformer, strategy: ScaleStrategy) -> bool:
    return model_spec(model.config, model.strategy, Block)["strategy"] == model_spec(model.config, strategy, Block)["strategy"]


def convert_model(model: Transformer, strategy: ScaleStrategy, *, allow_function_change: bool = False,
                  key: str = "--strategy", value: str = "") -> tuple[Transformer, Transfer, float]:
    """``(converted model, what changed / was folded, relative logits change on the probe batch)``.

    The same strategy is a copy (every tensor bitwise equal, whatever the parameterization). Any other is
    transferred in float64 (``scale/convert.py``), both models' logits on the probe batch are compared in float64,
    and a conversion is refused (``UserError``) when it changes the function, structurally (the sites are listed)
    or measurably (a relative change above ``tolerance``), unless ``allow_function_change``. The target's
    parameterization must have an inverse (``ScaleVector.set_gamma_``), else it is refused by name. The result has
    ``model``'s dtype.
    """
    if _same_strategy(model, strategy):
        return copy.deepcopy(model).eval(), Transfer(notes=["the same strategy: a copy"]), 0.0
    vector = strategy.vector
    if isinstance(vector, type) and issubclass(vector, ScaleVector) and not vector.invertible():
        raise UserError(key, value, f"its model.strategy.vector {vector.__module__}.{vector.__qualname__} has no "
                        "inverse (ScaleVector.set_gamma_), so no conversion can set its scales to the model's γ",
                        "implement set_gamma_(gamma) -> bool in that class (see scalevec_lit/scale/vector.py), or "
                        "convert to a strategy whose vector has one")
    dtype = next(model.parameters()).dtype
    source_spec = spec_of(model)  # the model's own class and block with its init_args, another strategy
    spec = {**source_spec, "strategy": model_spec(model.config, strategy, Block)["strategy"]}
    with torch.device("meta"):
        target = build_from_spec(spec)
    target.to_empty(device="cpu")
    target.double()
    for p in target.parameters():  # every value must come from the transfer: a NaN left over is a bug
        p.data.fill_(float("nan"))
    if target.config.tie_embeddings:
        target.tie_()
    source = copy.deepcopy(model).double().eval()
    target.rope_cos.copy_(source.rope_cos)
    target.rope_sin.copy_(source.rope_sin)
    try:
        report = transfer_(source, target)
    except NoInverse as err:  # a vector built by the strategy without an inverse (a factory, not a class)
        raise UserError(key, value, str(err), "convert to a strategy whose vector has an inverse") from None
    left = [n for n, p in target.named_parameters() if torch.isnan(p).any()]
    if left:
        raise RuntimeError(f"the conversion left parameters unset: {left[:5]}")
    idx = probe_batch(source)
    with torch.no_grad():
        ls, lt = source(idx), target.eval()(idx)
    moved = float((ls - lt).abs().max() / ls.abs().max().clamp_min(1e-300))
    tol = tolerance(model.config)
    if (report.changes or not moved <= tol) and not allow_function_change:
        why = "; ".join(_summary(report.changes)) if report.changes else ("no site reported a cause: check the "
                                                                          "parameterizations' set_gamma_")
        raise UserError(key, value, f"this strategy changes what the model computes: {why}; the logits moved by "
                        f"{moved:.3g} relative (max |Δ| / max |logits|, float64, on a probe batch of {idx.shape[0]}×"
                        f"{idx.shape[1]} random tokens) against a tolerance of {tol:.3g} (float64 rounding for "
                        f"{model.config.n_layer} layers of width up to {widest(model.config)}: ε₆₄·(2L+1)·w^1.5)",
                        "choose a strategy the conversion keeps exactly (baseline, unit_offset, hg, dp, or, er, "
                        "no_scale, unified_no_dnp; qk_norm, dnp or unified with output_shape: head for a QK-norm "
                        "model), or pass --allow-function-change and continue training to recover")
    if model.config.tie_embeddings and not target.tied:
        target.config = dataclasses.replace(target.config, tie_embeddings=False)
    return target.to(dtype).eval(), report, moved


def _summary(lines: list[str], limit: int = 6) -> list[str]:
    """Lines that differ only in the layer, said once with the count."""
    grouped: dict[str, int] = {}
    for line in lines:
        key = re.sub(r"blocks\.\d+\.", "blocks.*.", line)
        grouped[key] = grouped.get(key, 0) + 1
    out = [f"{k} (×{n})" if n > 1 else k for k, n in grouped.items()]
    return out[:limit] + ([f"... {len(out) - limit} more"] if len(out) > limit else [])


def write_native(model: Transformer, out: str | Path, *, tokenizer: Path,
                 overwrite: bool = False, command: str = "convert",
                 sources: Iterable[tuple[str, Optional[str | Path]]] = ()) -> list[str]:
    """The native folder (``export --format native``'s layout) and ``model.yaml``: the model section of a
    recipe that builds this model (``--config <out>/model.yaml --model.init_from <out>``). ``out`` is written
    all or nothing and must not overlap ``sources`` (``(option, path)`` of what ``command`` read);
    ``overwrite`` replaces an earlier output of export/import/convert (``scalevec_lit/outdir.py``)."""
    spec = spec_of(model)
    config = {k: v for k, v in spec["config"].items() if k != "seq_len"}  # the recipe's seq_len is used
    section: dict[str, Any] = {"config": config, "strategy": spec["strategy"]}
    if spec["block"] != describe_callable(Block):
        section["block"] = spec["block"] if spec["block"].get("init_args") else spec["block"]["class_path"]
    text = ("# The model of this folder, for fit: --config <recipe> --config <this file> --model.init_from <this folder>\n"
            f"# (written by scalevec_lit; the model was built for up to {spec['config']['seq_len']} positions)\n")
    if spec["model"]["class_path"] != STOCK_MODEL:
        text += (f"# model class: {spec['model']['class_path']}: add model.class_path: <the CausalLM subclass whose "
                 "build_model builds it>\n")
    with output_folder(out, command=command, inputs=sources, overwrite=overwrite) as dest:
        files = write_native_files(model.float(), dest, spec=spec, tokenizer=tokenizer)
        (dest / RECIPE).write_text(text + yaml.safe_dump({"model": section}, sort_keys=False))
    return files + [RECIPE]


@dataclass
class Converted:
    out: Path
    files: list[str]
    report: Transfer
    logits_change: float
    tokenizer_note: str


def convert_checkpoint(ckpt: str | Path, strategy: str | Path, out: str | Path, *, allow_function_change: bool = False,
                       tokenizer: Optional[str | Path] = None, overwrite: bool = False) -> Converted:
    sources = [("--ckpt", ckpt), ("--strategy", strategy), ("--tokenizer", tokenizer)]
    OutputFolder(out, command="convert", inputs=sources, overwrite=overwrite).check()  # before the long read
    spec, state, extra = read_checkpoint_extra(ckpt)
    model = model_from_state(spec, state)
    tok, note = find_tokenizer(ckpt, tokenizer, recorded=extra.get("tokenizer"))
    target, report, moved = convert_model(model, read_strategy(strategy, model.strategy.eps),
                                          allow_function_change=allow_function_change, value=str(strategy))
    files = write_native(target, out, tokenizer=tok, overwrite=overwrite, command="convert",
                         sources=[*sources, ("the checkpoint's tokenizer", tok)])
    return Converted(Path(out), files, report, moved, note)


def report_lines(report: Transfer, moved: float, what: str) -> list[str]:
    lines = [f"{what}: logits moved by {moved:.3g} relative (max |Δ| / max |logits|, float64) on a probe batch of "
             f"{SAMPLE[0]}×{SAMPLE[1]} random tokens"]
    if report.changes:
        lines.append("function changed (--allow-function-change): " + "; ".join(_summary(report.changes)))
    if report.notes:
        lines.append("kept exact by: " + "; ".join(_summary(report.notes, 4)))
    return lines


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m scalevec_lit convert",
                                     description="Rewrite a checkpoint into another scale strategy (exact where possible).")
    parser.add_argument("--ckpt", required=True, help="native folder (import/convert/export --format native), .ckpt or DCP folder")
    parser.add_argument("--strategy", required=True, help="a strategy preset, e.g. recipes/strategy/hg.yaml")
    parser.add_argument("--out", required=True, help="output folder (native format + model.yaml)")
    parser.add_argument("--allow-function-change", action="store_true",
                        help="convert even where the function changes (adding or removing a normalization)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer.json to ship (default: the checkpoint's)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier export/import/convert in --out (removes only the files its manifest "
                             "lists; other files stay)")
    args = parser.parse_args(argv)
    done = convert_checkpoint(args.ckpt, args.strategy, args.out, allow_function_change=args.allow_function_change,
                              tokenizer=args.tokenizer, overwrite=args.overwrite)
    for line in report_lines(done.report, done.logits_change, f"converted {args.ckpt} to {args.strategy}"):
        print(line)
    print(f"wrote {done.out}: {', '.join(done.files)}")
