"""How ``prepare`` cuts a text file into segments and sends each to train or validation.

A text is cut at blank lines (``\\n\\n`` or ``\\r\\n\\r\\n``) into segments of at least ``segment_chars``
characters (the last may be shorter); a paragraph longer than ``segment_chars`` (a text without blank
lines) is first cut at line ends, and a line longer than that at a space (or, with none, after
``segment_chars`` characters). A segment is the exact text between its cuts. It goes to validation when
a stable hash of (file, index) falls under ``val_fraction`` (``is_val``): disjoint, reproducible, and
unchanged when files are added.

When that hash split leaves a split empty (too little text for ``--val-fraction``: a single short
document, a few files), prepare runs again *balanced* (``split_text(..., balanced=True)``): a text of a
single segment is cut in two at the line end (else the space) nearest its middle, and every text of two
or more segments gives at least one segment to each split (its segment of lowest hash to validation, of
highest hash to training, when the hash gave none). Texts the hash already split both ways are unchanged.

A split far from ``val_fraction`` (a short text: an 8 kB file is two segments of 4000 characters, and the
balanced split sends one of them, half the tokens, to validation) is named in prepare's summary with the fix
(``share_note``).

Must not import Lightning or torch.
"""
from __future__ import annotations

import re
import zlib

_BLANK = re.compile(r"\r?\n\r?\n")
_BUCKETS = 100_000


def _key(rel: str, index: int) -> int:
    return zlib.crc32(f"{rel}\0{index}".encode()) % _BUCKETS


def is_val(rel: str, index: int, val_fraction: float) -> bool:
    return _key(rel, index) < val_fraction * _BUCKETS


def _cut(text: str, start: int, end: int) -> int:
    """Where to cut ``text[start:end]`` (exclusive of ``start``, inclusive of ``end``): after its last line end,
    else before its last space, else at ``end``."""
    nl = text.rfind("\n", start, end - 1)
    if nl >= start:
        return nl + 1
    space = max(text.rfind(" ", start + 1, end), text.rfind("\t", start + 1, end))
    return space if space > start else end


def _units(text: str, segment_chars: int) -> list[tuple[int, int, int]]:
    """``(start, end, size)`` of the paragraphs of ``text``, a long one cut into pieces of at most
    ``segment_chars`` characters; ``size`` counts the blank-line separator that follows (a piece counts as
    full, so that it ends its segment)."""
    out, pos = [], 0
    bounds = [(m.start(), m.end()) for m in _BLANK.finditer(text)] + [(len(text), len(text))]
    for stop, after in bounds:
        start = pos
        while stop - start > segment_chars:
            cut = _cut(text, start, start + segment_chars)
            out.append((start, cut, segment_chars))  # a piece of a long paragraph ends its segment
            start = cut
        out.append((start, stop, stop - start + (after - stop)))
        pos = after
    return out


def segments(text: str, segment_chars: int) -> list[str]:
    """Cut ``text`` at blank lines into pieces of at least ``segment_chars`` characters (the last may be
    shorter); a longer paragraph at line ends, a longer line at a space. Whitespace-only pieces are dropped."""
    out, first, size = [], None, 0
    units = _units(text, segment_chars)
    for k, (start, end, n) in enumerate(units):
        first = start if first is None else first
        size += n
        if size >= segment_chars or k == len(units) - 1:
            seg = text[first:end]
            if seg.strip():
                out.append(seg)
            first, size = None, 0
    return out


def _halve(seg: str) -> list[str]:
    """``seg`` cut in two at the line end (else the space) nearest its middle; ``[seg]`` when it cannot be."""
    mid = len(seg) // 2
    cands = [i + 1 for i, c in enumerate(seg) if c == "\n" and 0 < i + 1 < len(seg)] or \
        [i for i, c in enumerate(seg) if c in " \t" and 0 < i < len(seg)]
    cut = min(cands, key=lambda i: (abs(i - mid), i)) if cands else mid
    parts = [seg[:cut], seg[cut:]]
    return parts if all(p.strip() for p in parts) else [seg]


def split_text(text: str, rel: str, segment_chars: int, val_fraction: float,
               balanced: bool = False) -> list[tuple[str, bool]]:
    """``(segment, goes to validation)`` for each segment of the text file ``rel`` (module docstring)."""
    segs = segments(text, segment_chars)
    if balanced and len(segs) == 1:
        segs = _halve(segs[0])
    flags = [is_val(rel, i, val_fraction) for i in range(len(segs))]
    if balanced and len(segs) >= 2:
        keys = [_key(rel, i) for i in range(len(segs))]
        if not any(flags):
            flags[keys.index(min(keys))] = True
        if all(flags):
            flags[keys.index(max(keys))] = False
    return list(zip(segs, flags))


def share_note(tokens: dict[str, int], val_fraction: float, segment_chars: int) -> list[str]:
    """A summary line when validation got far more than ``val_fraction`` of the tokens (more than twice, and
    more than 5 points above), saying so and how to get closer; ``[]`` otherwise."""
    total = tokens.get("train", 0) + tokens.get("val", 0)
    share = tokens.get("val", 0) / total if total else 0.0
    if not (share > 2 * val_fraction and share - val_fraction > 0.05):
        return []
    smaller = max(1, segment_chars // 10)
    return [f"note: val holds {share:.0%} of the tokens ({tokens['val']:,} of {total:,}), not the {val_fraction:.0%} "
            f"of --val-fraction {val_fraction:g}: the text is cut into segments of --segment-chars {segment_chars} "
            "characters and each goes whole to one split, so a short text has too few segments to split finely; "
            f"for a split closer to {val_fraction:.0%}, add text or pass a smaller --segment-chars (e.g. "
            f"--segment-chars {smaller})"]
