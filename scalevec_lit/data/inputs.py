"""What ``prepare`` may read.

``scan_inputs``: every text file is read once before tokenizing: binary files (NUL bytes or mostly
control characters in the first 8 KiB) are skipped and listed; a file that does not decode with
``--encoding`` is skipped (``--errors skip``, the default), kept with U+FFFD in place of the bad bytes
(``replace``), or stops the run (``strict``); every skip is named, with the count of undecodable bytes.

Where prepare may write (the output folder, what it owns there, ``--overwrite``, writing all or nothing)
is the shared rule of every command that writes a folder: ``scalevec_lit/outdir.py``.

Must not import Lightning.
"""
from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from pathlib import Path

#: the manifest of prepare's output before ``outdir.MANIFEST``: still read as prepare's (``outdir.LEGACY_MANIFESTS``)
MANIFEST = ".prepare_manifest.json"
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
