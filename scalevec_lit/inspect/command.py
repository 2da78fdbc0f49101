"""``python -m scalevec_lit inspect PATH [--compare OTHER] [--out DIR]``: the scale vectors of a checkpoint or
a Hugging Face model, per layer, site, branch and role, with their statistics, the conserved quantity of the
input-role ones and how each would fold; a table per role on the terminal; with ``--out`` a CSV and a JSON
of every row and PNG figures (``figures.py``), written all or nothing into a new folder or over an earlier
output of inspect (``--overwrite``), never over files it did not write (``scalevec_lit/outdir.py``).
``--compare`` puts a second model beside the first.
"""
from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, Optional


from ..errors import CommandLineParser
from .compare import align, check_comparable, compare_tables, pair_record
from .load import Loaded, load, summary_line
from .stats import Row, rows_of
from .tables import role_tables, row_record, write_csv, write_json


def _parser() -> argparse.ArgumentParser:
    p = CommandLineParser(
        prog="python -m scalevec_lit inspect",
        description="Scale vectors of a checkpoint or a Hugging Face model: statistics, conserved quantity, fold.")
    p.add_argument("path", metavar="PATH", help="a .ckpt of fit, a distributed checkpoint folder, a native export "
                   "folder, or a local Hugging Face folder (Llama, Qwen3, Qwen3-MoE, Mixtral)")
    p.add_argument("--compare", metavar="OTHER", default=None, help="a second model of the same depth, shown beside "
                   "PATH (deltas are OTHER − PATH)")
    p.add_argument("--out", metavar="DIR", default=None, help="write scales.csv / scales.json (compare.csv / "
                   "compare.json with --compare) and PNG figures into this folder (new, empty, or an earlier "
                   "output of inspect with --overwrite)")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier output of inspect in --out (removes "
                   "only the files its manifest lists)")
    return p


def _source(loaded: Loaded) -> dict[str, Any]:
    return {"path": loaded.path, "kind": loaded.kind, "strategy": loaded.strategy, "n_layer": loaded.n_layer}


def inspect(path: str, compare: Optional[str] = None, out: Optional[str] = None,
            overwrite: bool = False) -> tuple[str, list[str]]:
    """Run the command; returns ``(text printed, files written under out)``. ``out`` is written all or nothing
    through the output-folder rule of the other commands (``scalevec_lit/outdir.py``)."""
    inputs = [("PATH", path)] + ([("--compare", compare)] if compare else [])
    if out is None:
        return _inspect(path, compare, None)[0], []
    from scalevec_lit.outdir import OutputFolder

    claim = OutputFolder(out, command="inspect", key="--out", inputs=inputs, overwrite=overwrite)
    tmp = claim.begin()  # refused before the long read
    try:
        text, written = _inspect(path, compare, tmp)
        claim.commit()
    except BaseException:
        claim.abandon()
        raise
    return text, written


def _inspect(path: str, compare: Optional[str], out: Optional[Path]) -> tuple[str, list[str]]:
    a = load(path, "PATH")
    b = load(compare, "--compare") if compare else None
    if b is not None:
        check_comparable(a, b)
    rows_a = rows_of(a.model)
    rows_b: list[Row] = rows_of(b.model) if b is not None else []
    pairs = align(rows_a, rows_b) if b is not None else None
    if b is None:
        text = f"{summary_line(a)}\n\n{role_tables(rows_a)}"
    else:
        text = f"A: {summary_line(a)}\nB: {summary_line(b)}\n\n{compare_tables(pairs, a, b)}"
    written: list[str] = []
    if out is not None:
        folder = out
        if b is None:
            records = [row_record(r) for r in rows_a]
            write_csv(folder / "scales.csv", records)
            write_json(folder / "scales.json", {"source": _source(a), "rows": records})
            written += ["scales.csv", "scales.json"]
        else:
            records = [pair_record(p) for p in pairs]
            write_csv(folder / "compare.csv", records)
            write_json(folder / "compare.json", {"a": {**_source(a), "rows": [row_record(r) for r in rows_a]},
                                                 "b": {**_source(b), "rows": [row_record(r) for r in rows_b]},
                                                 "pairs": records})
            written += ["compare.csv", "compare.json"]
        from .figures import write_figures

        sides = [(a.label, rows_a)] + ([(b.label, rows_b)] if b is not None else [])
        written += write_figures(folder, a.n_layer, sides, pairs)
    return text, written


def main(argv: Optional[list[str]] = None) -> None:
    """The command line ``python -m scalevec_lit inspect`` (``argv``: its arguments, default ``sys.argv[1:]``):
    prints ``inspect``'s tables and, with ``--out``, the files written there."""
    args = _parser().parse_args(argv)
    text, written = inspect(args.path, args.compare, args.out, args.overwrite)
    print(text)
    if written:
        print(f"\nwrote {args.out}: {', '.join(written)}")
