"""A split far from ``--val-fraction`` gets a note with the fix: an 8 kB text is two segments of 4000
characters, and the balanced split sends one of them, about half the tokens, to validation."""
from __future__ import annotations

from scalevec_lit.data.split import share_note


def test_the_note_names_the_share_the_asked_fraction_and_the_fix():
    assert share_note({"train": 1000, "val": 1040}, 0.05, 4000) == [
        "note: val holds 51% of the tokens (1,040 of 2,040), not the 5% of --val-fraction 0.05: the text is cut into "
        "segments of --segment-chars 4000 characters and each goes whole to one split, so a short text has too few "
        "segments to split finely; for a split closer to 5%, add text or pass a smaller --segment-chars (e.g. "
        "--segment-chars 400)"]
    assert share_note({"train": 485838, "val": 26313}, 0.05, 4000) == []  # the embedded corpus: 5.1%
    assert share_note({"train": 800, "val": 200}, 0.1, 4000) == []  # exactly twice the asked 10%: no note
    assert share_note({"train": 700, "val": 300}, 0.1, 4000) != []  # 30% for 10%


def test_prepare_of_an_8_kb_text_says_so(tmp_path):
    from scalevec_lit.data.prepare import prepare
    from scalevec_lit.data.tokenizer import DEFAULT_TEXT_DIR

    text = next(p for p in sorted(DEFAULT_TEXT_DIR.rglob("*.txt"))).read_text()[:8192]
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "short.txt").write_text(text)
    meta = prepare(str(tmp_path / "in"), output_dir=tmp_path / "out", num_workers=1)
    share = meta["tokens"]["val"] / sum(meta["tokens"].values())
    assert share > 0.3  # the short text: one of its two segments went to val
    notes = [line for line in meta["summary"] if line.startswith("note: val holds")]
    assert notes == share_note(meta["tokens"], 0.05, 4000) and len(notes) == 1
    assert notes[0].startswith(f"note: val holds {share:.0%} of the tokens")
