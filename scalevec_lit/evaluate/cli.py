"""``python -m scalevec_lit evaluate --ckpt_path PATH --tasks hellaswag,arc_easy [--limit N] [--batch_size B]
[--out FILE]``: lm-eval's tasks on a native checkpoint or a Hugging Face folder, without exporting it.

Prints lm-eval's table and writes its results JSON (``--out``; ``--log_samples`` adds one JSON Lines file of
sample records per task beside it), all or nothing, never over a file evaluate did not write; ``--overwrite``
replaces an earlier output (``scalevec_lit/outfile.py``). ``--include_path DIR`` adds a folder of your own task YAML files (a
``dataset_path: json`` task reads local files: nothing is downloaded). Task names, ``--limit`` (a count, or a
fraction of each task below 1), ``--num_fewshot`` and the seeds follow lm-eval's conventions.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional

import torch

from ..errors import CommandLineParser, UserError
from .harness import INSTALL, require_lm_eval


def _parser() -> argparse.ArgumentParser:
    p = CommandLineParser(
        prog="python -m scalevec_lit evaluate",
        description="Run lm-eval tasks on a checkpoint (any strategy, dense or MoE) or a Hugging Face folder; "
                    f"prints lm-eval's table and writes its results JSON. Needs lm-eval: {INSTALL}.",
    )
    p.add_argument("--ckpt_path", required=True, help="a .ckpt of fit, a distributed checkpoint folder, a native "
                   "export folder, or a Hugging Face folder (Llama, Qwen3, Qwen3-MoE, Mixtral)")
    p.add_argument("--tasks", required=True, help="comma-separated lm-eval task names, e.g. hellaswag,arc_easy")
    p.add_argument("--limit", type=float, default=None,
                   help="documents per task (a fraction of each task when below 1); for quick checks only")
    p.add_argument("--num_fewshot", type=int, default=None, help="few-shot examples (default: each task's own)")
    p.add_argument("--batch_size", type=int, default=8, help="sequences per forward (default 8)")
    p.add_argument("--max_gen_toks", type=int, default=256,
                   help="tokens generate_until may produce when a task does not say (default 256)")
    p.add_argument("--include_path", action="append", default=None,
                   help="a folder of your own task YAML files (may be given more than once)")
    p.add_argument("--out", default=None, help="results JSON to write (lm-eval's layout); never replaces a file "
                   "evaluate did not write (its manifest .<name>.scalevec_manifest.json lists what it wrote)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier output of evaluate at --out (removes only the files its manifest lists)")
    p.add_argument("--log_samples", action="store_true",
                   help="with --out: also write each task's sample records (<out stem>_samples_<task>.jsonl)")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the checkpoint's own)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (default: cuda when there is one)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
                   help="weights and compute (default float32; log-probabilities are taken in float32)")
    p.add_argument("--seed", type=int, default=1234, help="lm-eval's seeds (Python, NumPy, torch, few-shot); "
                   "default 1234 as lm-eval")
    p.add_argument("--bootstrap_iters", type=int, default=100000,
                   help="bootstrap iterations for the standard errors lm-eval bootstraps (0: none)")
    return p


def _check(args) -> None:
    for key, value, low in (("--batch_size", args.batch_size, 1), ("--max_gen_toks", args.max_gen_toks, 1),
                            ("--num_fewshot", args.num_fewshot, 0), ("--bootstrap_iters", args.bootstrap_iters, 0)):
        if value is not None and value < low:
            raise UserError(key, value, f"must be at least {low}", f"use e.g. {key} {max(low, 8 if 'batch' in key else low)}")
    if args.limit is not None and not args.limit > 0:
        raise UserError("--limit", args.limit, "must be above 0 (a count of documents per task, or a fraction below 1)",
                        "use e.g. --limit 100, or leave --limit out to run every document")
    if args.limit is not None and args.limit >= 1 and args.limit != int(args.limit):
        raise UserError("--limit", args.limit, "is neither a whole count nor a fraction below 1",
                        f"use --limit {int(args.limit)}")
    if args.log_samples and not args.out:
        raise UserError("--log_samples", "given", "needs --out (the samples are written beside the results JSON)",
                        "add --out results.json")
    if args.out and Path(args.out).is_dir():
        raise UserError("--out", args.out, "is a folder", "give the path of the results JSON file, e.g. "
                        f"{Path(args.out) / 'results.json'}")
    if args.overwrite and not args.out:
        raise UserError("--overwrite", "given", "needs --out (it replaces an earlier results file)",
                        "add --out results.json")


def _claim(args, tasks: list[str]):
    """The output files, checked before the model is read (``outfile.py``): ``None`` without ``--out``."""
    if not args.out:
        return None
    from ..outfile import OutputFile

    out = Path(args.out)
    samples = [f"{out.stem}_samples_{t}.jsonl" for t in tasks] if args.log_samples else []
    inputs = [("--ckpt_path", args.ckpt_path), ("--tokenizer", args.tokenizer),
              *(("--include_path", d) for d in args.include_path or [])]
    return OutputFile(out, command="evaluate", key="--out", inputs=inputs, overwrite=args.overwrite,
                      companions=samples)


def _device(name: str) -> torch.device:
    device = torch.device("cuda" if name == "auto" and torch.cuda.is_available() else "cpu" if name == "auto" else name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device", name, "this machine has no CUDA GPU", "use --device cpu")
    return device


def main(argv: Optional[list[str]] = None) -> None:
    """The command line ``python -m scalevec_lit evaluate`` (``argv``: its arguments, default ``sys.argv[1:]``):
    checks the options and task names before the model is read, runs lm-eval's tasks, prints lm-eval's table and
    writes ``--out`` all or nothing. Needs lm-eval (the ``eval`` extra); a ``UserError`` names a bad option."""
    args = _parser().parse_args(argv)
    _check(args)
    require_lm_eval()
    from .harness import split_tasks, task_manager

    tasks = split_tasks(args.tasks)
    device = _device(args.device)
    manager = task_manager(tasks, args.include_path)  # names checked before the model is read
    claim = _claim(args, tasks)
    tmp = claim.begin() if claim is not None else None  # refused before the long run, written all or nothing
    try:
        _evaluate(args, tasks, device, manager, claim, tmp)
    except BaseException:
        if claim is not None:
            claim.abandon()
        raise


def _evaluate(args, tasks, device, manager, claim, tmp) -> None:
    from ..generate import DTYPES, _cast_parameters_
    from .harness import metrics, run_tasks, table, write_results
    from .lm import ScaleVecLM
    from .load import load_for_evaluation

    model, tok, note = load_for_evaluation(args.ckpt_path, args.tokenizer)
    print(note, file=sys.stderr)
    model.to(device)
    if args.dtype != "float32":
        _cast_parameters_(model, DTYPES[args.dtype])
    lm = ScaleVecLM(model, tok, batch_size=args.batch_size, device=device, max_gen_toks=args.max_gen_toks,
                    name=str(args.ckpt_path))
    limit = None if args.limit is None else (int(args.limit) if args.limit >= 1 else args.limit)
    results = run_tasks(lm, tasks, manager, limit=limit, num_fewshot=args.num_fewshot, seed=args.seed,
                        log_samples=args.log_samples, batch_size=args.batch_size, device=str(device),
                        bootstrap_iters=args.bootstrap_iters)
    results.setdefault("config", {})["model"] = str(args.ckpt_path)
    print(table(results))
    if claim is not None:
        names = [f.name for f in write_results(results, tmp / Path(args.out).name)]
        claim.commit()
        print(f"wrote {', '.join(str(Path(args.out).with_name(n)) for n in names)}", file=sys.stderr)
    flat = metrics(results)
    print("; ".join(f"{k} {v:.4f}" for k, v in flat.items()), file=sys.stderr)
