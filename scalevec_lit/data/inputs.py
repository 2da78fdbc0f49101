"""What ``prepare`` may read and where it may write.

- ``scan_inputs``: every text file is read once before tokenizing: binary files (NUL bytes or mostly
  control characters in the first 8 KiB) are skipped and listed; a file that does not decode with
  ``--encoding`` is skipped (``--errors skip``, the default), kept with U+FFFD in place of the bad bytes
  (``replace``), or stops the run (``strict``); every skip is named, with the count of undecodable bytes.
- ``claim_output``: the output folder must be new, empty, or hold an earlier output of prepare (recorded
  in its manifest ``.prepare_manifest.json``, or the ``meta.json`` of older versions). ``--overwrite``
  removes only the entries the manifest lists; an output equal to, inside or around an input folder is
  refused. Nothing outside the output folder is ever removed, nor anything inside it that prepare did not write.

Must not import Lightning.
"""
from __future__ import annotations

import codecs
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

MANIFEST = ".prepare_manifest.json"
WRITES = ("train", "val", "meta.json", MANIFEST)  # everything prepare writes into its output folder
ERROR_POLICIES = ("skip", "replace", "strict")
_SNIFF = 8192


@dataclass
class InputScan:
    files: list[Path] = field(default_factory=list)  # files to tokenize
    binary: list[Path] = field(default_factory=list)
    undecodable: dict[Path, int] = field(default_factory=dict)  # file -> bytes that do not decode
    replaced: dict[Path, int] = field(default_factory=dict)  # kept with U+FFFD (errors=replace)

    def summary(self, root: Path) -> list[str]:
        def names(paths) -> str:
            shown = [str(Path(p).relative_to(root)) if Path(p).is_relative_to(root) else str(p) for p in paths]
            return ", ".join(shown[:10]) + (f" and {len(shown) - 10} more" if len(shown) > 10 else "")

        lines = []
        if self.binary:
            lines.append(f"skipped {len(self.binary)} binary file(s): {names(self.binary)}")
        if self.undecodable:
            lines.append(f"skipped {len(self.undecodable)} file(s) that are not valid text in the encoding: "
                         + names(f"{p} ({n} bad bytes)" for p, n in self.undecodable.items()))
        if self.replaced:
            lines.append(f"replaced undecodable bytes by U+FFFD in {len(self.replaced)} file(s): "
                         + names(f"{p} ({n} bytes)" for p, n in self.replaced.items()))
        return lines


def is_binary(head: bytes) -> bool:
    if b"\x00" in head:
        return True
    if not head:
        return False
    control = sum(1 for b in head if b < 32 and b not in (9, 10, 12, 13, 27))
    return control / len(head) > 0.10


_BAD = [0]


def _count_handler(err: UnicodeDecodeError):
    _BAD[0] += err.end - err.start
    return ("", err.end)


codecs.register_error("scalevec_count", _count_handler)


def count_undecodable(data: bytes, encoding: str) -> int:
    """How many bytes of ``data`` do not decode (0 when it is valid text)."""
    _BAD[0] = 0
    data.decode(encoding, errors="scalevec_count")
    return _BAD[0]


def scan_inputs(files: list[Path], encoding: str, errors: str) -> InputScan:
    if errors not in ERROR_POLICIES:
        raise ValueError(f"--errors: {errors!r}: not a policy; use one of {', '.join(ERROR_POLICIES)}")
    try:
        "".encode(encoding)
    except LookupError:
        raise ValueError(f"--encoding: {encoding!r}: unknown encoding; use e.g. utf-8, latin-1, cp1252") from None
    scan = InputScan()
    for path in files:
        data = path.read_bytes()
        if is_binary(data[:_SNIFF]):
            scan.binary.append(path)
            continue
        bad = count_undecodable(data, encoding)
        if bad == 0:
            scan.files.append(path)
        elif errors == "replace":
            scan.replaced[path] = bad
            scan.files.append(path)
        else:
            scan.undecodable[path] = bad
    if errors == "strict" and scan.undecodable:
        first, n = next(iter(scan.undecodable.items()))
        raise ValueError(
            f"--errors strict: {first}: {n} bytes are not valid {encoding} ({len(scan.undecodable)} such file(s) in "
            "all); give the right --encoding (e.g. latin-1), or --errors skip / replace"
        )
    return scan


def _inside(a: Path, b: Path) -> bool:
    return a == b or b in a.parents


def claim_output(out: Path, inputs: list[Path], overwrite: bool) -> None:
    """Make ``out`` ready for prepare's files, removing only what an earlier prepare wrote there."""
    o = out.resolve()
    for inp in inputs:
        i = inp.resolve()
        if _inside(o, i) or _inside(i, o):
            where = "is" if o == i else ("is inside" if _inside(o, i) else "contains")
            raise ValueError(
                f"--output: {str(out)!r}: {where} the input {str(inp)!r}; prepare could overwrite your texts: "
                "choose an output folder outside the input, e.g. data/prepared/<name>"
            )
    if o.exists() and not o.is_dir():
        raise ValueError(f"--output: {str(out)!r}: is a file; give a new or empty folder")
    if not o.exists():
        o.mkdir(parents=True)
    entries = {p.name for p in o.iterdir()}
    ours = set(json.loads((o / MANIFEST).read_text()).get("writes", WRITES)) if (o / MANIFEST).is_file() else (
        set(WRITES) if (o / "meta.json").is_file() else set())
    foreign = sorted(entries - set(WRITES)) if ours else sorted(entries)
    if entries and not ours:
        shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise FileExistsError(
            f"--output: {str(out)!r}: holds files that prepare did not write ({shown}); choose a new or empty "
            "folder (prepare never deletes files it did not write)"
        )
    if (entries & ours) - {MANIFEST}:
        if not overwrite:
            raise FileExistsError(f"--output: {str(out)!r}: already holds prepared data; pass --overwrite to replace "
                                  "it (only prepare's own files are removed) or choose another folder")
        for name in sorted(entries & ours & set(WRITES)):
            target = o / name
            shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink()
    (o / MANIFEST).write_text(json.dumps({"writes": list(WRITES), "note": "written by scalevec_lit prepare; "
                                          "--overwrite removes only these entries"}, indent=2))
