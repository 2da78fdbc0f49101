"""prepare: text, JSON Lines, parquet or a saved dataset + a ``tokenizer.json`` → litdata token chunks, split train/val.

``python -m scalevec_lit prepare --input <folders, files, globs> --tokenizer <tokenizer.json> --output <dir>``

Which files are read and how (text; JSON Lines and parquet with ``--text-field``; a ``save_to_disk``
folder) is in ``formats.py``. A text file is cut into segments at paragraph breaks (``split.py``; about
``segment_chars`` characters each); a segment goes to validation when a stable hash of (file, index)
falls under ``val_fraction``. A row of a row format is one document, and goes to validation when the
hash of (file, row) does. So the split is disjoint, reproducible and unchanged when files are added.
Every document or segment is encoded with an end-of-text id appended, and the token stream is written
with litdata's ``optimize`` (``TokensLoader``), in parallel workers over work units (files, or groups of
parquet row groups), quietly: prepare shows its own progress bar per split (``unit_progress.py``), not litdata's
lines. ``meta.json`` records the tokenizer, its vocabulary, the counts and every chunk
(size, SHA-256: ``integrity.py``); the data module checks them. What prepare reads (binary and
undecodable files) is in ``inputs.py``; where it writes (the output folder it owns, ``--overwrite``, all
or nothing) in ``scalevec_lit/outdir.py``; an ``s3://`` output is written locally first and then uploaded
by ``publish.py`` (same rules, with a copy of the tokenizer), with ``--storage-option KEY=VALUE`` or the
standard AWS configuration (``remote.py``). It ends with a summary of files read and skipped, and of the
rows skipped in each file (missing field, null, not a string, empty, invalid JSON); a prepare that fails prints what it had skipped until then on stderr, before the error.

Must not import Lightning.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
from contextlib import contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Iterator, Optional

import torch

from .formats import FORMATS_HELP, KIND_NAMES, RowCounts, iter_documents, plan_units, resolve_inputs
from ..errors import CommandLineParser
from ..outdir import OutputFolder
from ..stopsignal import held, raise_if_swallowed, written
from .workers import signals_stay_ours
from .inputs import ERROR_POLICIES, scan_inputs
from .integrity import record_chunks
from .remote import check_options, is_remote
from .split import is_val, segments, share_note, split_text  # noqa: F401 - is_val, segments: for the tests
from .tokenizer import DEFAULT_TEXT_DIR, DEFAULT_TOKENIZER, TEXT_SUFFIXES, Tokenizer
from .unit_progress import mark_done, unit_progress

META = "meta.json"
#: where ``make prepare`` (and ``prepare`` without --output) writes the embedded corpus; ``recipes/smoke.yaml``
#: reads it, and the data module prepares it there by itself when it is missing
DEFAULT_OUTPUT = "data/prepared/shakespeare"
MAX_LISTED = 20  # files with skipped rows listed in the summary (meta.json has them all)
_TOKENIZERS: dict[str, Tokenizer] = {}


def _tokenize_unit(
    unit: str, *, tokenizer: str, split: str, val_fraction: float, segment_chars: int, encoding: str = "utf-8",
    text_field: str = "text", counts_dir: Optional[str] = None, balanced: bool = False, done_dir: Optional[str] = None,
) -> Iterator[torch.Tensor]:
    """The token tensors of one work unit (``formats.plan_units``, as JSON) that belong to ``split``."""
    spec = json.loads(unit)
    tok = _TOKENIZERS.get(tokenizer) or _TOKENIZERS.setdefault(tokenizer, Tokenizer(tokenizer))
    rel, want_val = spec["rel"], split == "val"
    if spec["kind"] == "text":
        text = Path(spec["path"]).read_bytes().decode(encoding, errors="replace")  # undecodable files were sorted out before
        for seg, val in split_text(text, rel, segment_chars, val_fraction, balanced):  # split.py
            if val == want_val:
                yield torch.tensor(tok.encode(seg), dtype=torch.int32)
        if done_dir is not None:  # the progress bar counts it (unit_progress.py)
            mark_done(done_dir, spec["id"])
        return
    counts = RowCounts()
    for doc in iter_documents(spec, text_field, lambda row: is_val(rel, row, val_fraction) == want_val, counts):
        yield torch.tensor(tok.encode(doc), dtype=torch.int32)
    if counts_dir is not None:  # the workers are other processes: the counts come back through files
        (Path(counts_dir) / f"{split}-{spec['id']}.json").write_text(json.dumps({"rel": rel, **counts.to_json()}))
    if done_dir is not None:
        mark_done(done_dir, spec["id"])


@contextmanager
def _report_on_failure(scanned: list[str], counts_dir: str, text_field: str, rows: list) -> Iterator[None]:
    """When prepare fails, print what it had skipped until then (``prepare: `` lines on stderr, before the
    error): the binary and undecodable files, and the rows skipped in the files tokenized so far."""
    try:
        yield
    except BaseException:
        per_file: dict[str, RowCounts] = {}
        for part in sorted(Path(counts_dir).glob("*.json")):
            try:
                data = json.loads(part.read_text())
                rel = data.pop("rel")
                per_file[rel] = per_file.get(rel, RowCounts()).merge(RowCounts.from_json(data))
            except (OSError, ValueError, KeyError, TypeError):
                continue  # a worker stopped while writing it
        kinds = {s.rel: s.kind for s in rows}
        lines = [*scanned, *(c.describe(rel, text_field, kinds.get(rel, "jsonl"))
                             for rel, c in sorted(per_file.items()) if c.bad or c.error)]
        if lines:
            print("prepare: stopped before the end (nothing was written); skipped until then:", file=sys.stderr)
            for line in lines:
                print(f"prepare:   {line}", file=sys.stderr, flush=True)
        raise


def _as_list(inputs) -> list:
    return [inputs] if isinstance(inputs, (str, Path)) else list(inputs)


def prepare(
    input_dir: str | Path | list = DEFAULT_TEXT_DIR,
    tokenizer: str | Path = DEFAULT_TOKENIZER,
    output_dir: str | Path = DEFAULT_OUTPUT,
    val_fraction: float = 0.05,
    segment_chars: int = 4000,
    chunk_tokens: int = 1 << 17,
    num_workers: Optional[int] = None,
    overwrite: bool = False,
    encoding: str = "utf-8",
    errors: str = "skip",
    text_field: str = "text",
    storage_options: Optional[dict] = None,
) -> dict:
    """Tokenize and chunk; returns the metadata written to ``<output_dir>/meta.json`` (with ``skipped``:
    the binary and undecodable files and the rows without usable text), plus ``summary`` (lines to print).

    ``input_dir``: a folder, a file or a glob pattern, or a list of them (``formats.py``). ``output_dir``: a
    folder or an ``s3://`` URL (``storage_options``: endpoint and credentials, ``remote.STORAGE_KEYS``)."""
    from litdata import TokensLoader, optimize

    if not 0.0 < val_fraction < 1.0:
        raise ValueError(f"--val-fraction: {val_fraction}: must be between 0 and 1 (exclusive); e.g. 0.05")
    for key, value, low in (("--segment-chars", segment_chars, 1), ("--chunk-tokens", chunk_tokens, 2)):
        if value < low:
            raise ValueError(f"{key}: {value}: must be at least {low}; use the default or a larger value")
    if not text_field:
        raise ValueError("--text-field: '': empty; give the field or column that holds the text, e.g. text")
    inputs = _as_list(input_dir)
    if not inputs:
        raise ValueError("--input: no input given; give a folder, files or a glob pattern")
    shown = str(inputs[0]) if len(inputs) == 1 else ", ".join(map(str, inputs))
    found = resolve_inputs(inputs)
    if not found.sources:
        raise FileNotFoundError(
            f"--input: {shown!r} holds no text files ({', '.join(TEXT_SUFFIXES)}) and no JSON Lines, parquet or saved "
            "dataset files; add some or point elsewhere"
        )
    tok = Tokenizer(tokenizer, key="--tokenizer")
    storage_options = check_options(storage_options, "--storage-option")
    texts = [s for s in found.sources if s.kind == "text"]
    rows = [s for s in found.sources if s.kind != "text"]
    scan = scan_inputs([s.path for s in texts], encoding, errors)
    try:  # file names in the summary are shown relative to this
        root = Path(os.path.commonpath([str(r) for r in found.roots]))
    except ValueError:  # absolute and relative inputs mixed
        root = Path(".")
    root = root.parent if root.is_file() else root
    if not scan.files and not rows:
        raise ValueError(f"--input: {shown!r}: none of its {len(texts)} file(s) is readable text ("
                         + "; ".join(scan.summary(root)) + "); check --encoding or the folder")
    kept = set(scan.files)
    sources = [s for s in found.sources if s.kind != "text" or s.path in kept]
    units = plan_units(sources, text_field)
    out = output_dir if is_remote(output_dir) else Path(output_dir)
    workers = num_workers if num_workers is not None else max(1, min(len(units), os.cpu_count() or 1))
    counts = {}
    if is_remote(out):  # written here first, uploaded when complete (publish.py)
        from .publish import RemoteOutput

        claim = RemoteOutput(str(out), tokenizer=tok.path, overwrite=overwrite, storage_options=storage_options)
    else:
        claim = OutputFolder(out, command="prepare", key="--output", overwrite=overwrite,
                             inputs=[*(("--input", r) for r in found.roots), ("--tokenizer", tok.path)])
    dest = claim.begin()  # everything is written there, and moved into --output only when complete
    try:
        with tempfile.TemporaryDirectory(prefix="scalevec-prepare-") as counts_dir, \
                _report_on_failure(scan.summary(root), counts_dir, text_field, rows):
            for balanced in (False, True):  # again, balanced, when the hash split left a split empty (split.py)
                for split in ("train", "val"):
                    done_dir = Path(counts_dir, f"done-{split}-{int(balanced)}")
                    fn = partial(
                        _tokenize_unit,
                        tokenizer=str(tok.path.resolve()),
                        split=split,
                        val_fraction=val_fraction,
                        segment_chars=segment_chars,
                        encoding=encoding,
                        text_field=text_field,
                        counts_dir=counts_dir,
                        balanced=balanced,
                        done_dir=str(done_dir),
                    )
                    # workers.py: a stop signal stops, no worker outlives it; unit_progress.py: the bar
                    with signals_stay_ours(), unit_progress(split, len(units), done_dir):
                        optimize(
                            fn=fn,
                            inputs=[json.dumps(u) for u in units],
                            output_dir=str((dest / split).resolve()),
                            chunk_size=chunk_tokens,
                            item_loader=TokensLoader(),
                            num_workers=workers,
                            mode="overwrite",
                            start_method="fork" if os.name == "posix" else None,
                            keep_data_ordered=True,  # each worker a contiguous slice, in order: the same chunks each time
                            verbose=False,  # litdata's own lines (unit_progress.py); its errors still raise
                        )
                    index = json.loads((dest / split / "index.json").read_text())
                    counts[split] = int(sum(c["dim"] or 0 for c in index["chunks"]))
                if all(counts.values()) or not texts:
                    break
            for split in ("train", "val"):
                if counts[split] == 0:
                    raise ValueError(
                        f"--input: {shown!r}: gave no {split} tokens; add text or change --val-fraction ({val_fraction})"
                    )
            per_file: dict[str, RowCounts] = {}
            for part in sorted(Path(counts_dir).glob("*.json")):
                data = json.loads(part.read_text())
                rel = data.pop("rel")
                per_file[rel] = per_file.get(rel, RowCounts()).merge(RowCounts.from_json(data))
        kinds = {s.rel: s.kind for s in rows}
        bad_files = {rel: c for rel, c in per_file.items() if c.bad or c.error}
        n_rows, n_bad = sum(c.rows for c in per_file.values()), sum(c.bad for c in per_file.values())
        formats = {k: sum(1 for s in sources if s.kind == k) for k in KIND_NAMES}
        meta = {
            "source": str(Path(inputs[0]).resolve()) if len(inputs) == 1 else [str(Path(i).resolve()) for i in inputs],
            "files": len(sources),
            "formats": {k: n for k, n in formats.items() if n},
            "encoding": encoding,
            "text_field": text_field if rows else None,
            "rows": {"read": n_rows, "skipped": n_bad} if rows else None,
            "skipped": {"binary": [str(p) for p in scan.binary],
                        "undecodable": {str(p): n for p, n in scan.undecodable.items()},
                        "replaced": {str(p): n for p, n in scan.replaced.items()},
                        "rows": {rel: c.to_json() for rel, c in sorted(bad_files.items())}},
            "ignored": [str(p) for p in found.ignored],
            "tokenizer": str(tok.path.resolve()),
            "tokenizer_sha256": tok.fingerprint(),
            "tokenizer_content": tok.content_hash(),  # vocabulary, merges, added tokens (checked where data meets a checkpoint)
            "vocab_size": tok.vocab_size,
            "eos_id": tok.eos_id,
            "tokens": counts,
            "chunk_tokens": chunk_tokens,
            "val_fraction": val_fraction,
            "segment_chars": segment_chars,
        }
        meta.update(balanced_split=balanced, chunks=record_chunks(dest))  # integrity.py: checked when a run starts
        (dest / META).write_text(json.dumps(meta, indent=2))
        with held() if isinstance(claim, OutputFolder) else nullcontext():  # moved in whole, or not at all
            raise_if_swallowed()  # a stop signal lost in a __del__ still stops (stopsignal.py)
            claim.commit()  # (an upload, s3://, stays stoppable)
            written("prepare", f"{out} holds the complete prepared data")
    except BaseException:
        claim.abandon()
        raise
    read = [f"{len(scan.files)} of {len(texts)} text file(s)"] if texts else []
    for kind in ("jsonl", "parquet", "arrow"):
        if formats[kind]:
            n = sum(c.rows for rel, c in per_file.items() if kinds.get(rel) == kind)
            what = "arrow file(s) of {} saved dataset(s)".format(len(found.datasets)) if kind == "arrow" else \
                f"{KIND_NAMES[kind]} file(s)"
            read.append(f"{formats[kind]} {what} ({n:,} rows)")
    summary = ["read " + ", ".join(read), *scan.summary(root)]
    if balanced:
        summary.append("the hash split left a split empty (too little text for --val-fraction): split again so that "
                       "each text file gives a segment to train and to val (meta.json: balanced_split)")
    summary += share_note(counts, val_fraction, segment_chars) if texts else []  # far from --val-fraction (split.py)
    if rows:
        lines = [c.describe(rel, text_field, kinds.get(rel, "jsonl")) for rel, c in sorted(bad_files.items())]
        summary.append(f"{n_bad:,} of {n_rows + n_bad:,} rows skipped (no usable text in {text_field!r}), in "
                       f"{len(bad_files)} file(s)" + (":" if lines else ""))
        summary += [f"  {line}" for line in lines[:MAX_LISTED]]
        if len(lines) > MAX_LISTED:
            summary.append(f"  and {len(lines) - MAX_LISTED} more file(s) with skipped rows (all listed in {out}/{META})")
    if found.ignored:
        names = [str(p.relative_to(root)) if p.is_relative_to(root) else str(p) for p in found.ignored]
        summary.append(f"ignored {len(names)} file(s) of other kinds: " + ", ".join(names[:10])
                       + (f" and {len(names) - 10} more" if len(names) > 10 else ""))
    meta["summary"] = summary
    return meta


def main(argv: Optional[list[str]] = None) -> None:
    parser = CommandLineParser(
        prog="python -m scalevec_lit prepare",
        description="Tokenize text files, JSON Lines, parquet or a saved Hugging Face dataset into litdata chunks "
                    "(train/val split).",
    )
    parser.add_argument("--input", nargs="+", default=[str(DEFAULT_TEXT_DIR)],
                        help=f"folders, files or glob patterns, mixed: {FORMATS_HELP} (default: the embedded corpus)")
    parser.add_argument("--text-field", default="text",
                        help="the field (JSON Lines) or column (parquet, saved dataset) that holds the text (default: text)")
    parser.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER), help="a tokenizer.json (default: embedded BPE)")
    parser.add_argument("--output", default=DEFAULT_OUTPUT)
    parser.add_argument("--val-fraction", type=float, default=0.05)
    parser.add_argument("--segment-chars", type=int, default=4000)
    parser.add_argument("--chunk-tokens", type=int, default=1 << 17)
    parser.add_argument("--num-workers", type=int, default=None)
    parser.add_argument("--encoding", default="utf-8", help="text encoding of the input files (default utf-8)")
    parser.add_argument("--errors", choices=ERROR_POLICIES, default="skip",
                        help="a file that does not decode: skip it and list it (default), replace the bad bytes "
                             "by U+FFFD, or stop (strict)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier output of prepare (removes only prepare's own files)")
    parser.add_argument("--if-missing", action="store_true", help="do nothing when the output is already prepared")
    parser.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                        help="for an s3:// --output: endpoint_url, aws_access_key_id, aws_secret_access_key, profile, "
                             "... (default: the standard AWS configuration, e.g. AWS_ENDPOINT_URL)")
    args = parser.parse_args(argv)
    options = {}
    for item in args.storage_option:
        name, eq, value = item.partition("=")
        if not eq:
            raise ValueError(f"--storage-option: {item!r}: not KEY=VALUE; e.g. --storage-option endpoint_url=http://host:9000")
        options[name] = value
    if args.if_missing and is_remote(args.output):
        from .remote import Remote

        if "meta.json" in Remote(args.output, options, key="--output").listing():
            print(f"{args.output} already prepared")
            return
    elif args.if_missing and (Path(args.output) / META).exists():
        print(f"{args.output} already prepared")
        return
    meta = prepare(
        args.input, args.tokenizer, args.output, args.val_fraction, args.segment_chars, args.chunk_tokens,
        args.num_workers, args.overwrite, args.encoding, args.errors, args.text_field, options or None,
    )
    for line in meta["summary"]:
        print(f"prepare: {line}", file=sys.stderr)
    print(f"prepared {args.output}: {meta['tokens']['train']:,} train / {meta['tokens']['val']:,} val tokens, "
          f"vocab {meta['vocab_size']}")


if __name__ == "__main__":
    from ..errors import run_guarded

    run_guarded(main, sys.argv[1:])
