"""prepare with validation text from other sources than the training text.

``python -m scalevec_lit.data.prepare_heldout --train <inputs> --val <inputs> --tokenizer T --output O``

``prepare`` splits each input by a hash of (file, segment), so its validation text comes from the same
documents as its training text. This runs ``prepare`` twice with the same tokenizer: on the training
inputs (with a tiny ``--val-fraction``, whose val split is discarded) and on the validation inputs with
``--val-sample`` as its ``--val-fraction``: that run's val split, segments drawn by prepare's hash from
every validation document, becomes the validation split (the rest of the validation text is not used;
``--val-sample 1`` keeps all of it: both splits of that run, joined). ``meta.json`` records both sources
(``val_source``), the new counts and the chunk checksums of the final folder, so the data module reads and
verifies it like any prepared data.
"""
from __future__ import annotations

import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Optional

from ..errors import CommandLineParser, run_guarded
from .integrity import record_chunks
from .prepare import META, prepare


#: the share of each side that prepare's own split sets aside (it needs both splits non-empty); discarded
SET_ASIDE = 0.002


def prepare_heldout(train: list[str], val: list[str], tokenizer: str, output: str, *, overwrite: bool = False,
                    val_sample: float = 0.05, segment_chars: int = 4000, chunk_tokens: int = 1 << 17,
                    num_workers: Optional[int] = None) -> dict:
    """Prepared data in ``output`` whose train split is ``train``'s text and whose val split is ``val``'s."""
    if not 0.0 < val_sample <= 1.0:
        raise ValueError(f"--val-sample: {val_sample}: must lie above 0 and at most 1 (the share of the validation "
                         "text kept, e.g. 0.05; 1 keeps all of it)")
    common = dict(segment_chars=segment_chars, chunk_tokens=chunk_tokens, num_workers=num_workers)
    resolved = lambda xs: {Path(x).resolve() for x in xs}  # noqa: E731
    shared = resolved(train) & resolved(val)
    if shared:
        raise ValueError(f"--val: {sorted(map(str, shared))} also given as --train; validation must come from other sources")
    out = Path(output)
    meta = prepare(train, tokenizer, output, SET_ASIDE, overwrite=overwrite, **common)
    with tempfile.TemporaryDirectory(prefix="scalevec-heldout-", dir=out.parent) as tmp:
        everything = val_sample == 1.0  # prepare needs both splits: its two splits together are all of the text
        held = prepare(val, tokenizer, str(Path(tmp) / "val"), SET_ASIDE if everything else val_sample, **common)
        shutil.rmtree(out / "val")
        if everything:
            _join_splits(Path(tmp) / "val", out / "val")
            held["tokens"] = {"train": 0, "val": held["tokens"]["train"] + held["tokens"]["val"]}
        else:
            shutil.move(str(Path(tmp) / "val" / "val"), str(out / "val"))
    meta.pop("summary", None)
    meta.update(
        val_source=held["source"], val_files=held["files"],
        tokens={"train": meta["tokens"]["train"], "val": held["tokens"]["val"]},
        heldout={"set_aside": SET_ASIDE, "val_sample": val_sample,
                 "unused_tokens": {"train_inputs": meta["tokens"]["val"], "val_inputs": held["tokens"]["train"]}},
        chunks=record_chunks(out),
    )
    (out / META).write_text(json.dumps(meta, indent=2))
    return meta


def _join_splits(prepared: Path, dest: Path) -> None:
    """``dest``: one split holding the chunks of both splits of ``prepared`` (train's, then val's), renumbered
    ``chunk-0-<n>.bin``, with one ``index.json`` listing them (litdata's format: the same config, the chunks)."""
    dest.mkdir()
    chunks, config = [], None
    for split in ("train", "val"):
        index = json.loads((prepared / split / "index.json").read_text())
        config = config or index["config"]
        for chunk in index["chunks"]:
            name = f"chunk-0-{len(chunks)}.bin"
            shutil.move(str(prepared / split / chunk["filename"]), str(dest / name))
            chunks.append({**chunk, "filename": name})
    (dest / "index.json").write_text(json.dumps({"chunks": chunks, "config": config, "updated_at": str(time.time())}))


def main(argv: Optional[list[str]] = None) -> None:
    p = CommandLineParser(prog="python -m scalevec_lit.data.prepare_heldout", description=__doc__.split("\n")[0])
    p.add_argument("--train", nargs="+", required=True, help="inputs of the train split (as prepare's --input)")
    p.add_argument("--val", nargs="+", required=True, help="inputs of the val split: other sources")
    p.add_argument("--tokenizer", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--val-sample", type=float, default=0.05,
                   help="share of the validation text kept, drawn by prepare's hash from every document (default 0.05; "
                        "1 keeps all of it)")
    p.add_argument("--num-workers", type=int, default=None)
    p.add_argument("--overwrite", action="store_true")
    args = p.parse_args(argv)
    meta = prepare_heldout(args.train, args.val, args.tokenizer, args.output, overwrite=args.overwrite,
                           val_sample=args.val_sample, num_workers=args.num_workers)
    print(f"prepared {args.output}: {meta['tokens']['train']:,} train / {meta['tokens']['val']:,} val tokens "
          f"(val from {meta['val_source']}), vocab {meta['vocab_size']}")


if __name__ == "__main__":
    run_guarded(main, sys.argv[1:])
