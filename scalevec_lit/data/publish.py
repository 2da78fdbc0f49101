"""``prepare --output s3://bucket/prefix``: the remote output folder, with the rules of ``outdir.py``.

``RemoteOutput`` has ``OutputFolder``'s interface (``begin`` returns a local temporary folder to write
into, ``commit`` publishes it, ``abandon`` removes it) and its rules, on a bucket prefix:

- the prefix must be empty or hold an earlier output of prepare (its manifest ``.scalevec_manifest.json``
  lists the top-level entries prepare wrote); anything else there is refused, naming it, and nothing is
  deleted; replacing a complete earlier output (one with ``meta.json``) needs ``--overwrite``;
- nothing is uploaded before the data are complete on the local disk. Then, in this order: the manifest
  (so that an interrupted upload leaves a prefix that prepare owns), the old ``meta.json`` removed (readers
  see "not prepared", never a mix), the chunks, the indexes, ``tokenizer.json`` (a copy of the tokenizer,
  which the data module reads from the bucket), ``meta.json`` last, and then the old objects that the new
  output does not have are deleted. A prefix without ``meta.json`` is never read as data: an
  interrupted upload is simply prepared again (no ``--overwrite`` needed, there is nothing to lose).

Everything goes through ``remote.Remote``. Must not import Lightning.
"""
from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Optional

from ..errors import UserError
from .remote import Remote

MANIFEST = ".scalevec_manifest.json"  # outdir.MANIFEST
SHOWN = 5


class RemoteOutput:
    """prepare's claim on a bucket prefix (see the module docstring)."""

    def __init__(self, url: str, *, tokenizer: Path, overwrite: bool = False, storage_options: Optional[dict] = None,
                 key: str = "--output") -> None:
        self.remote = Remote(url, storage_options, key=key)
        self.url, self.key, self.overwrite, self.tokenizer = self.remote.url, key, overwrite, Path(tokenizer)
        self.tmp: Optional[Path] = None
        self.old: dict[str, int] = {}

    def _error(self, problem: str, fix: str) -> UserError:
        return UserError(self.key, repr(self.url), problem, fix)

    def check(self) -> dict[str, int]:
        """The objects under the prefix; refused when they are not prepare's or need ``--overwrite``."""
        held = self.remote.listing()
        if not held:
            return held
        owned: set[str] = set()
        if MANIFEST in held:
            try:
                data = json.loads(self.remote.read(MANIFEST))
                if data.get("command") == "prepare":
                    owned = set(data.get("files", [])) | {MANIFEST}
            except (ValueError, AttributeError):
                pass
        foreign = sorted({k for k in held if k.split("/", 1)[0] not in owned})
        if foreign:
            shown = ", ".join(foreign[:SHOWN]) + (f" and {len(foreign) - SHOWN} more" if len(foreign) > SHOWN else "")
            raise self._error(f"holds objects that prepare did not write ({shown})", "choose a new or empty prefix "
                              f"(prepare never deletes what it did not write; it owns only what its manifest {MANIFEST} "
                              "lists)")
        if "meta.json" in held and not self.overwrite:
            raise UserError(self.key, f"{self.url!r} exists and is not empty", "it already holds prepared data",
                            f"pass --overwrite to replace it (only the objects its manifest {MANIFEST} lists are "
                            "removed) or choose another prefix")
        return held

    def begin(self) -> Path:
        self.old = self.check()
        self.tmp = Path(tempfile.mkdtemp(prefix="scalevec-prepare-remote-"))
        return self.tmp

    def commit(self) -> list[str]:
        assert self.tmp is not None
        shutil.copyfile(self.tokenizer, self.tmp / "tokenizer.json")
        new = sorted(p.name for p in self.tmp.iterdir() if p.name != MANIFEST)
        note = "written by scalevec_lit prepare; a later prepare --overwrite removes exactly these entries"
        (self.tmp / MANIFEST).write_text(json.dumps({"command": "prepare", "files": new, "note": note}, indent=2))
        files = sorted(str(p.relative_to(self.tmp)) for p in self.tmp.rglob("*") if p.is_file())
        last = ["meta.json"]
        indexes = [f for f in files if f.endswith("index.json")]
        first = [f for f in files if f not in (*indexes, *last, MANIFEST, "tokenizer.json")]
        self.remote.upload(self.tmp / MANIFEST, MANIFEST)
        if "meta.json" in self.old:
            self.remote.delete(["meta.json"])
        for rel in [*first, *indexes, "tokenizer.json", *last]:
            self.remote.upload(self.tmp / rel, rel)
        stale = sorted(set(self.old) - set(files))
        if stale:
            self.remote.delete(stale)
        self.abandon()
        return [*new, MANIFEST]

    def abandon(self) -> None:
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None
