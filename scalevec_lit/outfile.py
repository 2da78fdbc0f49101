"""The output files of a command that writes files, not a folder (``evaluate --out FILE`` and the
``--log_samples`` files beside it): the rule of ``outdir.py`` for a file and its companions.

``with output_file(out, command="evaluate", key="--out", inputs=[("--ckpt_path", ckpt)], overwrite=...) as tmp:``
the command writes ``tmp / out.name`` and any companion files (``<stem>_samples_<task>.jsonl``) into ``tmp``;
when the block ends without an error they take the place of the old ones beside ``out``; otherwise nothing
beside ``out`` changes. The rules:

- ``out`` must not be one of the inputs, be inside one or contain one;
- the files a run wrote are listed in a manifest beside them, ``.<name>.scalevec_manifest.json`` (the
  command and the files). ``out`` must be new or listed there; a file in ``out``'s place that the manifest
  does not list (your own file, an output of another version) is refused, naming it, even with
  ``overwrite``. So is a file that a new companion would replace. A damaged manifest is refused as such;
- replacing an earlier output needs ``overwrite``; then the files the old manifest lists are removed and the
  new ones moved in. The folder's other files are never touched;
- everything is written first into a temporary sibling folder ``.<name>.tmp-<pid>`` and moved in only when
  complete; on any error (``KeyboardInterrupt`` included) it is removed, with the parent folders this call
  created, and the old files are back in place. A run killed outright (SIGKILL) leaves its temporary folder;
  the next run writing ``out`` names it (``warning:``) so that it can be deleted.

Plain Python: must not import torch or Lightning.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator, Optional

from .errors import UserError
from .outdir import MANIFEST, Claim, DamagedManifest, _names, free_sibling, move_in, read_manifest, refuse_overlap


def manifest_of(out: Path) -> Path:
    """The manifest beside the output file ``out``."""
    return out.parent / f".{out.name}{MANIFEST}"


def _listed(out: Path) -> tuple[Optional[str], set[str]]:
    """``(command, files it wrote)`` from ``out``'s manifest; ``(None, set())`` when there is none."""
    path = manifest_of(out)
    return read_manifest(path) if path.is_file() else (None, set())


class OutputFile(Claim):
    """One command's claim on its output file and the companions beside it (module docstring)."""

    def __init__(self, out: str | Path, *, command: str, key: str = "--out",
                 inputs: Iterable[tuple[str, str | Path]] = (), overwrite: bool = False,
                 companions: Iterable[str] = ()) -> None:
        super().__init__(out, command=command, key=key, inputs=inputs, overwrite=overwrite)
        self.companions = sorted(set(companions))  # names expected beside out, checked before the work starts

    def check(self) -> set[str]:
        """Refuse what this command may not write; returns the names of its earlier files beside ``out``."""
        refuse_overlap(self.out, self.inputs, self.key, self.command)
        if self.real.is_dir():
            raise self._error("is a folder", f"give the path of a file, e.g. {self.out / 'results.json'}")
        try:
            owner, listed = _listed(self.real)
        except DamagedManifest as err:
            raise self._error(f"its manifest {err.path} is damaged ({err.reason}), so whether {self.command} wrote "
                              "the files beside it cannot be told", f"restore or delete {err.path} (after moving "
                              "the files you want to keep), or choose another --out") from None
        ours = {n for n in listed if (self.real.parent / n).exists()} if owner == self.command else set()
        if self.real.exists() and self.real.name not in ours:
            raise self._error(f"is a file that {self.command} did not write" + (f" (its manifest is {owner}'s)" if
                              owner else ""), f"choose a new file ({self.command} never replaces a file it did not "
                              f"write; it owns only what {manifest_of(self.out).name} lists)")
        if ours and not self.overwrite:
            raise UserError(self.key, f"{str(self.out)!r} exists", f"it holds an earlier output of {self.command} "
                            f"({_names(ours)})", "pass --overwrite to replace it (only the files its manifest "
                            f"{manifest_of(self.out).name} lists are removed) or choose another file")
        self._refuse_clash(self.companions, ours)
        return ours

    def _refuse_clash(self, names: Iterable[str], ours: set[str]) -> None:
        clash = sorted(n for n in names if (self.real.parent / n).exists() and n not in ours)
        if clash:
            raise self._error(f"a file beside it, {_names(clash)}, was not written by {self.command} and would have "
                              "to be replaced", "move it away or choose another --out")

    def _commit(self) -> list[str]:
        """Move the new files in place of the old ones; returns the names written (the manifest last)."""
        assert self.tmp is not None
        ours = self.check()  # again: another process may have written there in the meantime
        new = sorted(p.name for p in self.tmp.iterdir())
        self._refuse_clash(new, ours)
        manifest = manifest_of(self.real)
        (self.tmp / manifest.name).write_text(json.dumps(
            {"command": self.command, "files": new, "note": f"written by scalevec_lit {self.command}; a later "
             f"{self.command} --overwrite of {self.real.name} removes exactly these files and nothing else"}, indent=2))
        old = sorted(ours | ({manifest.name} if manifest.exists() else set()))
        move_in(self.tmp, self.real.parent, old, [*new, manifest.name], free_sibling(self.real, "old"))
        self.tmp = None
        return [*new, manifest.name]


@contextmanager
def output_file(out: str | Path, *, command: str, key: str = "--out", inputs: Iterable[tuple[str, str | Path]] = (),
                overwrite: bool = False, companions: Iterable[str] = ()) -> Iterator[Path]:
    """Write ``out`` and its companions all or nothing: yields the temporary folder to write them into."""
    claim = OutputFile(out, command=command, key=key, inputs=inputs, overwrite=overwrite, companions=companions)
    with claim.all_or_nothing() as tmp:
        yield tmp
