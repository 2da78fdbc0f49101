"""``python -m scalevec_lit convert --ckpt A --strategy recipes/strategy/Y.yaml --out B``: rewrite a checkpoint
into another scale strategy, exactly where the math allows (``scale/convert.py``), and write it natively.

Lives here: reading a strategy file (``read_strategy``), ``convert_model`` (the same strategy, defaults filled on
both sides: a bitwise copy; another: build the target model, its scale vectors as their classes construct them,
transfer in float64, compare both models' logits on a probe batch in float64 (an MoE model also with every token
routed to every expert), refuse a change above ``tolerance`` (float64 rounding for the model's size, stated in the
message) or any structural change unless ``--allow-function-change``, check the model again as written in the
checkpoint's dtype, refuse by name a target parameterization without an inverse; a refusal names the presets that
keep this model exactly, each one checked: ``exact_presets``), ``write_native`` (the native folder +
``model.yaml``, the recipe fragment ``fit`` needs with ``--model.init_from``), ``convert_checkpoint`` and ``main``.
The checkpoint's spec is read once and carried (``target_spec``: its model class with ``init_args``, config and
block, in the target strategy) into every target built and into the folder written, never re-derived from a model.
``import`` (``hf_import.py``) uses the same. The probe, the tolerances and "the same strategy" are
``convert_check.py``.

Plain torch (+ yaml): must not import Lightning or transformers.
"""
from __future__ import annotations

import copy
import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

import torch
import yaml

from ..checkpoint import model_from_state, read_contents
from ..errors import CommandLineParser, UserError
from ..export.tokenizer import find_tokenizer
from ..export.write import write_native_files
from ..model.block import Block
from ..model.spec import (STOCK_MODEL, build_from_spec, describe_callable, describe_model, spec_of, strategy_data,
                          strategy_from_dict)
from ..model.transformer import Transformer
from ..outdir import OutputFolder, output_folder
from ..recipe_lookup import recipe_file, recipe_root
from ..scale.convert import Transfer, transfer_
from ..scale.strategy import ScaleStrategy
from ..scale.vector import NoInverse, ScaleVector
from ._args import add_output_options
from .convert_check import (SAMPLE, Probe, probe_batch, resolved_strategy, same_strategy, tolerance,
                            widest)

RECIPE = "model.yaml"
PRESETS_TEXT = "recipes/strategy/"


def presets_folder() -> Optional[Path]:
    """The shipped strategy presets a refusal checks (inside the installed package, or a clone's ``recipes/``)."""
    root = recipe_root()
    return None if root is None else root / "strategy"


def read_strategy(path: str | Path, eps: float) -> ScaleStrategy:
    """``model.strategy`` of a preset or recipe file; ``eps`` (the source's) unless the file sets it."""
    p = recipe_file(path, "--strategy")  # a file, or a shipped preset's name: strategy/hg, recipes/strategy/hg.yaml
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


def _check_finite(model: Transformer, value: str) -> None:
    bad = [n for n, p in model.named_parameters() if not bool(torch.isfinite(p).all())]
    if bad:
        raise UserError("--ckpt", value or "the model", f"has non-finite values (NaN or Inf) in {len(bad)} "
                        f"parameter(s): {', '.join(bad[:4])}{', ...' if len(bad) > 4 else ''}; no conversion can keep "
                        "them", "convert a checkpoint written before the values diverged")


def target_spec(spec: dict[str, Any], strategy: Optional[ScaleStrategy] = None, *,
                tie_embeddings: Optional[bool] = None) -> dict[str, Any]:
    """The spec of the model ``spec`` describes, in ``strategy`` (``None``: its own): its model class (with its
    ``init_args``), config and block as ``spec`` records them; ``tie_embeddings``: the head as converted."""
    config = dict(spec["config"]) if tie_embeddings is None else {**spec["config"], "tie_embeddings": tie_embeddings}
    return {**spec, "model": spec.get("model") or describe_model(), "config": config,
            "strategy": strategy_data(strategy) if strategy is not None else spec["strategy"]}


def _build_target(model: Transformer, strategy: ScaleStrategy, spec: Optional[dict[str, Any]] = None) -> Transformer:
    """The model of ``strategy`` in float64: every scale vector as its class constructs it (initialised: its
    ``set_gamma_`` may read its parameters), every other parameter NaN (each must come from the transfer).
    ``spec``: the model's spec as its checkpoint recorded it (read once by the command and carried); without
    one (a model built in memory), it is taken from ``model``."""
    spec = target_spec(spec if spec is not None else spec_of(model), strategy)
    from ..model.meta import meta_device

    with meta_device():  # tensors made of one Python number stay real (model/meta.py)
        target = build_from_spec(spec)
    target.to_empty(device="cpu")
    target.double()
    vectors = [m for m in target.modules() if isinstance(m, ScaleVector)]
    own = {id(p) for v in vectors for p in v.parameters()}
    with torch.no_grad(), torch.random.fork_rng(devices=[]):  # a random init in a vector leaves the caller's RNG as is
        for p in target.parameters():
            if id(p) not in own:
                p.fill_(float("nan"))
        for v in vectors:
            if hasattr(v, "reset_parameters"):
                v.reset_parameters()
            elif any(True for _ in v.parameters()):  # the contract's initial state without reset_parameters: rebuilt
                fresh = _fresh_vector(v, strategy)
                for p, q in zip(v.parameters(), fresh.parameters()):
                    p.copy_(q)
    if target.config.tie_embeddings:
        target.tie_()
    return target


def _fresh_vector(vec: ScaleVector, strategy: ScaleStrategy) -> ScaleVector:
    """A newly constructed vector of ``vec``'s class and size, as the strategy builds it (with or without magnitude)."""
    for before_norm in (False, True):
        fresh = strategy.make_vector(vec.dim, before_norm=before_norm)
        if type(fresh) is type(vec):
            return fresh.double()
    raise RuntimeError(f"{type(vec).__qualname__}: not a vector that the strategy builds")


def _transfer_checked(model: Transformer, source: Transformer, strategy: ScaleStrategy, probe: Probe,
                      key: str = "--strategy", value: str = "", *, measure_changed: bool = True,
                      spec: Optional[dict[str, Any]] = None) -> tuple[Transformer, Transfer, float]:
    """``(float64 target, report, relative logits change)``: ``source`` (``model`` in float64) transferred; with
    ``measure_changed=False`` the change is not measured where the transfer listed one (``inf``)."""
    target = _build_target(model, strategy, spec)
    target.rope_cos.copy_(source.rope_cos)
    target.rope_sin.copy_(source.rope_sin)
    try:
        report = transfer_(source, target)
    except NoInverse as err:  # a vector built by the strategy without an inverse (a factory, not a class)
        raise UserError(key, value, str(err), "convert to a strategy whose vector has an inverse") from None
    left = [n for n, p in target.named_parameters() if torch.isnan(p).any()]
    if left:
        raise RuntimeError(f"the conversion left parameters unset: {left[:5]}")
    if report.changes and not measure_changed:
        return target.eval(), report, float("inf")
    return target.eval(), report, probe.change(target.eval())


def exact_presets(model: Transformer, source: Transformer, probe: Probe, skip: ScaleStrategy,
                  spec: Optional[dict[str, Any]] = None) -> list[str]:
    """The presets (``presets_folder``) that convert ``model`` exactly (a copy, or a float64 transfer without a listed
    change within ``tolerance`` that is also within ``written_tolerance`` in the model's dtype), ``skip`` left out:
    each one's conversion check, run. ``spec``: the model's as its checkpoint recorded it (``_build_target``)."""
    names, tol, dtype = [], tolerance(model.config), next(model.parameters()).dtype
    refused = resolved_strategy(model.config, skip)
    presets = presets_folder()
    for path in sorted(presets.glob("*.yaml")) if presets is not None else []:
        try:
            strategy = read_strategy(path, model.strategy.eps)
            if resolved_strategy(model.config, strategy) == refused:
                continue
            if same_strategy(model, strategy):
                names.append(path.stem)
                continue
            if isinstance(strategy.vector, type) and not strategy.vector.invertible():
                continue
            target, report, moved = _transfer_checked(model, source, strategy, probe, measure_changed=False,
                                                      spec=spec)
        except Exception:  # noqa: BLE001 - a preset this model cannot be built or written with is not advised
            continue
        if report.changes or not moved <= tol:
            continue
        if dtype != torch.float64:
            lost, wtol, bad = _written_change(target.to(dtype), probe, dtype)
            if bad or not lost <= wtol:
                continue
        names.append(path.stem)
    return names


def convert_model(model: Transformer, strategy: ScaleStrategy, *, allow_function_change: bool = False,
                  key: str = "--strategy", value: str = "", spec: Optional[dict[str, Any]] = None,
                  ) -> tuple[Transformer, Transfer, float]:
    """``(converted model, what changed / was folded, relative logits change on the probe batch)``.

    The same strategy (``same_strategy``: defaults filled on both sides) is a copy (every tensor bitwise equal,
    whatever the parameterization). Any other is transferred in float64 (``scale/convert.py``) into a target whose
    scale vectors start as constructed, both models' logits on the probe batch are compared in float64 (an MoE
    model also with every token routed to every expert), and a conversion is refused (``UserError``) when it
    changes the function, structurally (the sites are listed) or measurably (a relative change above
    ``tolerance``), unless ``allow_function_change``; the model as written in its own dtype is compared again
    (``written_tolerance``). The refusal names the presets that keep this model exactly (each one checked). The
    target's parameterization must have an inverse (``ScaleVector.set_gamma_``), else it is refused by name. A
    model with a non-finite parameter is refused. The result has ``model``'s dtype.
    """
    _check_finite(model, "")
    if same_strategy(model, strategy):
        return copy.deepcopy(model).eval(), Transfer(notes=["the same strategy: a copy"]), 0.0
    vector = strategy.vector
    if isinstance(vector, type) and issubclass(vector, ScaleVector) and not vector.invertible():
        raise UserError(key, value, f"its model.strategy.vector {vector.__module__}.{vector.__qualname__} has no "
                        "inverse (ScaleVector.set_gamma_), so no conversion can set its scales to the model's γ",
                        "implement set_gamma_(gamma) -> bool in that class (see scalevec_lit/scale/vector.py), or "
                        "convert to a strategy whose vector has one")
    dtype = next(model.parameters()).dtype
    source = copy.deepcopy(model).double().eval()
    probe = Probe(source, probe_batch(source))
    idx = probe.idx
    target, report, moved = _transfer_checked(model, source, strategy, probe, key, value, spec=spec)
    tol = tolerance(model.config)
    batch = (f"on a probe batch of {idx.shape[0]}×{idx.shape[1]} random tokens"
             + (", also with every token routed to every expert" if model.config.moe is not None else ""))
    if (report.changes or not moved <= tol) and not allow_function_change:
        why = "; ".join(_summary(report.changes)) if report.changes else ("no site reported a cause: check the "
                                                                          "parameterizations' set_gamma_")
        raise UserError(key, value, f"this strategy changes what the model computes: {why}; the logits moved by "
                        f"{moved:.3g} relative (max |Δ| / max |logits|, float64, {batch}) against a tolerance of "
                        f"{tol:.3g} (float64 rounding for {model.config.n_layer} layers of width up to "
                        f"{widest(model.config)}: ε₆₄·(2L+1)·w^1.5)", _advice(model, source, probe, strategy, spec))
    if model.config.tie_embeddings and not target.tied:
        target.config = dataclasses.replace(target.config, tie_embeddings=False)
    target = target.to(dtype).eval()
    if dtype != torch.float64:  # what the cast to the checkpoint's dtype loses: the written model, in float64
        lost, wtol, bad = _written_change(target, probe, dtype)
        name = str(dtype).replace("torch.", "")
        if bad:  # never written, whatever --allow-function-change says: a checkpoint with Inf or NaN weights
            raise UserError(key, value, f"the converted model does not fit in {name}, the checkpoint's dtype: "
                            f"{', '.join(bad[:4])}{', ...' if len(bad) > 4 else ''} overflow (a scale folded into "
                            "weights beyond its range)", _advice(model, source, probe, strategy, spec))
        if not lost <= wtol and not allow_function_change:
            raise UserError(key, value, f"the model as written in {name} moves the logits by {lost:.3g} relative "
                            f"(max |Δ| / max |logits|, computed in float64, {batch}) against a tolerance of {wtol:.3g} "
                            f"(the change of this model with every parameter moved by ε of itself in {name}: more than "
                            f"any rounding a write in {name} must introduce), although the float64 transfer kept the "
                            f"function: this parameterization cannot hold the model's values in {name}",
                            _advice(model, source, probe, strategy, spec))
    return target, report, moved


def _written_change(target: Transformer, probe: Probe, dtype: torch.dtype) -> tuple[float, float, list[str]]:
    """``(relative logits change, its tolerance, parameters not finite)`` of ``target`` (already cast to ``dtype``)
    evaluated in float64 against the source's probe logits."""
    bad = [n for n, p in target.named_parameters() if not bool(torch.isfinite(p).all())]
    written = copy.deepcopy(target).double().eval()
    return probe.change(written), probe.written_tolerance(dtype), bad


def _advice(model: Transformer, source: Transformer, probe: Probe, refused: ScaleStrategy,
            spec: Optional[dict[str, Any]] = None) -> str:
    keep = exact_presets(model, source, probe, refused, spec)
    if not keep:
        return (f"no preset in {PRESETS_TEXT} keeps this model exactly; pass --allow-function-change and continue "
                "training to recover")
    return (f"choose a strategy that the conversion keeps exactly for this model (checked for every preset in "
            f"{PRESETS_TEXT}): {', '.join(keep)}; or pass --allow-function-change and continue training to recover")


def _summary(lines: list[str], limit: int = 6) -> list[str]:
    """Lines that differ only in the layer, said once with the count."""
    grouped: dict[str, int] = {}
    for line in lines:
        key = re.sub(r"blocks\.\d+\.", "blocks.*.", line)
        grouped[key] = grouped.get(key, 0) + 1
    out = [f"{k} (×{n})" if n > 1 else k for k, n in grouped.items()]
    return out[:limit] + ([f"... {len(out) - limit} more"] if len(out) > limit else [])


def write_native(model: Transformer, out: str | Path, *, tokenizer: Path, spec: Optional[dict[str, Any]] = None,
                 overwrite: bool = False, command: str = "convert",
                 sources: Iterable[tuple[str, Optional[str | Path]]] = ()) -> list[str]:
    """The native folder (``export --format native``'s layout) and ``model.yaml``: the model section of a
    recipe that builds this model (``--config <out>/model.yaml --model.init_from <out>``). ``spec``: the model's,
    carried from the checkpoint the command read (``target_spec``); without one (a model built in memory), it is
    taken from ``model``. ``out`` is written all or nothing and must not overlap ``sources`` (``(option, path)`` of
    what ``command`` read); ``overwrite`` replaces an earlier output of export/import/convert (``outdir.py``)."""
    spec = target_spec(spec if spec is not None else spec_of(model))
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
    """What ``python -m scalevec_lit convert`` runs: read ``ckpt`` (a native folder, ``.ckpt`` or distributed
    checkpoint), convert its model into the strategy of the preset or recipe file ``strategy`` (``convert_model``:
    what is refused and when) and write it natively into ``out`` with ``model.yaml`` (``write_native``), with
    ``tokenizer`` (default: the checkpoint's). ``out`` is checked before the checkpoint is read and written all or
    nothing; ``overwrite`` replaces an earlier output of export/import/convert."""
    sources = [("--ckpt", ckpt), ("--strategy", strategy), ("--tokenizer", tokenizer)]
    OutputFolder(out, command="convert", inputs=sources, overwrite=overwrite).check()  # before the long read
    read = read_contents(ckpt)
    model = model_from_state(read.spec, read.state)
    _check_finite(model, str(ckpt))
    tok, note = find_tokenizer(ckpt, tokenizer, recorded=read.tokenizer)
    wanted = read_strategy(strategy, model.strategy.eps)
    target, report, moved = convert_model(model, wanted, allow_function_change=allow_function_change,
                                          value=str(strategy), spec=read.spec)
    spec = target_spec(read.spec, None if same_strategy(model, wanted) else wanted,  # a copy keeps its own
                       tie_embeddings=target.config.tie_embeddings)
    files = write_native(target, out, tokenizer=tok, spec=spec, overwrite=overwrite, command="convert",
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
    parser = CommandLineParser(prog="python -m scalevec_lit convert",
                               description="Rewrite a checkpoint into another scale strategy (exact where possible).")
    parser.add_argument("--ckpt", required=True, help="native folder (import/convert/export --format native), .ckpt or DCP folder")
    parser.add_argument("--strategy", required=True, help="a strategy preset, e.g. recipes/strategy/hg.yaml")
    parser.add_argument("--out", required=True, help="output folder (native format + model.yaml)")
    add_output_options(parser, function_change="convert even where the function changes (adding or removing a "
                       "normalization)", tokenizer="tokenizer.json to ship (default: the checkpoint's)")
    args = parser.parse_args(argv)
    done = convert_checkpoint(args.ckpt, args.strategy, args.out, allow_function_change=args.allow_function_change,
                              tokenizer=args.tokenizer, overwrite=args.overwrite)
    for line in report_lines(done.report, done.logits_change, f"converted {args.ckpt} to {args.strategy}"):
        print(line)
    print(f"wrote {done.out}: {', '.join(done.files)}")
