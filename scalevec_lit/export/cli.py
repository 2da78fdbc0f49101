"""``export`` (read a checkpoint, find its tokenizer, write hf or native) and ``main``, the command line
``python -m scalevec_lit export`` (dispatched here by ``scalevec_lit.cli``).

Plain Python over the other export modules: must not import Lightning or transformers.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from ..checkpoint import CheckpointError, model_from_state, read_contents
from ..errors import CommandLineParser, UserError, debug_enabled, fail
from ..outdir import OutputFolder
from .errors import ExportError
from .hf import DTYPES
from .tokenizer import find_tokenizer
from .write import ExportResult, save_hf, save_native


def export(ckpt: str | Path, out: str | Path, *, format: str = "hf", tokenizer: Optional[str | Path] = None,
           max_shard_size: int | str = "5GB", dtype: str = "float32", overwrite: bool = False) -> ExportResult:
    """Read ``ckpt`` and export it (what ``python -m scalevec_lit export`` runs). ``out`` must not overlap
    the checkpoint or the tokenizer; it is written all or nothing (``scalevec_lit/outdir.py``)."""
    if format not in ("hf", "native"):
        raise ExportError(f"--format: {format!r} is not one of hf, native")
    sources = [("--ckpt", ckpt), ("--tokenizer", tokenizer)]
    OutputFolder(out, command="export", inputs=sources, overwrite=overwrite).check()  # before the long read
    read = read_contents(ckpt)
    model = model_from_state(read.spec, read.state)
    tok_path, note = find_tokenizer(ckpt, tokenizer, recorded=read.tokenizer)
    sources.append(("the checkpoint's tokenizer", tok_path))
    if format == "native":
        return save_native(model, out, spec=read.spec, tokenizer=tok_path, tokenizer_note=note,
                           max_shard_size=max_shard_size, overwrite=overwrite, sources=sources)
    return save_hf(model, out, tokenizer=tok_path, tokenizer_note=note, max_shard_size=max_shard_size,
                   dtype=dtype, overwrite=overwrite, sources=sources)


def main(argv: Optional[list[str]] = None) -> None:
    """The command line ``python -m scalevec_lit export`` (``argv``: its arguments, default ``sys.argv[1:]``): runs
    ``export`` and prints what it wrote; an error is one paragraph and ``SystemExit`` with code 2 (an argument)
    or 1 (a damaged checkpoint)."""
    parser = CommandLineParser(
        prog="python -m scalevec_lit export",
        description="Fold the scale vectors of a checkpoint and write a transformers model folder (or ours).",
    )
    parser.add_argument("--ckpt", required=True, help="Lightning .ckpt, distributed checkpoint folder or native export")
    parser.add_argument("--out", required=True, help="output folder")
    parser.add_argument("--format", choices=("hf", "native"), default="hf",
                        help="hf: Llama/Qwen3 layout, folded (default); native: our state dict + spec")
    parser.add_argument("--tokenizer", default=None,
                        help="tokenizer.json to ship (default: the one recorded in the checkpoint; for older "
                             "checkpoints the one the run's data was prepared with, through the run's config.yaml)")
    parser.add_argument("--max-shard-size", default="5GB", help="shard model.safetensors above this size (5GB)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="float32", help="dtype of the hf weights")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier export/import/convert in --out (removes only the files its manifest "
                             "lists; other files stay)")
    args = parser.parse_args(argv)
    try:
        result = export(args.ckpt, args.out, format=args.format, tokenizer=args.tokenizer,
                        max_shard_size=args.max_shard_size, dtype=args.dtype, overwrite=args.overwrite)
    except (ExportError, UserError, FileNotFoundError, CheckpointError) as err:
        if debug_enabled():
            raise
        raise fail(err) from None  # exit 2 (a bad argument), 1 (a corrupt checkpoint); str() is the message
    print(f"tokenizer: {result.tokenizer_note}", file=sys.stderr)
    print(f"exported {args.ckpt} as {result.architecture} ({result.format}) to {result.out}: {', '.join(result.files)}")
