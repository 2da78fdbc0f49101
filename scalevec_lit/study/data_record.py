"""Which prepared data a study's runs read, and the same data at every start of the study.

A study's runs take days on a shared machine and are resumed (``study run`` again) after each stop, possibly
on another machine whose data were prepared again. ``prepare`` gives the same chunks from the same inputs
(``data/prepare.py``), so the same data have the same fingerprint (``data/integrity.fingerprint``: the chunk
list and checksums of a split). The runner records the fingerprints in ``study_meta.json`` when it first starts
and refuses to run more of the study on data with other fingerprints (``--allow-data-change`` overrides): its
seeds would otherwise be paired across two different streams of text. The report's Data line names them.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import yaml

from ..errors import UserError
from .spec import Study


def data_dir_of(study: Study, meta: dict) -> Optional[str]:
    """The prepared data folder of the runs: ``study run --data``, the study's args, or the base recipe's."""
    data_dir = meta.get("data_dir")
    for a in study.args if data_dir is None else []:
        if a.startswith("--data.data_dir="):
            data_dir = a.split("=", 1)[1]
    if data_dir is None:
        for recipe in study.base:
            try:
                data_dir = ((yaml.safe_load(Path(recipe).read_text()) or {}).get("data") or {}).get("data_dir", data_dir)
            except OSError:
                pass
    return data_dir


def fingerprints(data_dir: Optional[str]) -> Optional[dict]:
    """``{"train": sha256, "val": sha256}`` of a local prepared folder; ``None`` for a remote, missing or
    unreadable one (nothing to compare: the runs' own start checks what they read)."""
    from ..data.integrity import fingerprint

    if not data_dir or "://" in str(data_dir) or not (Path(data_dir) / "meta.json").is_file():
        return None
    try:
        meta = json.loads((Path(data_dir) / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    prints = {split: fingerprint(str(data_dir), meta, split) for split in ("train", "val")}
    return prints if all(prints.values()) else None


def check_same_data(meta: dict, data_dir: Optional[str], now: Optional[dict], out: Path, allow: bool) -> None:
    """Refuse to continue a study whose recorded data fingerprints differ from the data's now."""
    then = (meta.get("data") or {}).get("fingerprints")
    if allow or not then or not now or then == now:
        return
    changed = ", ".join(f"{split} {then.get(split, '?')[:16]} then, {now[split][:16]} now" for split in ("train", "val")
                        if then.get(split) != now[split])
    raise UserError(f"study: {out}", data_dir,
                    f"the runs in this folder read other data: it has been prepared again with other content since "
                    f"({changed}), and the seeds would be paired across two streams of text",
                    "prepare the same inputs again with the same tokenizer (prepare gives the same chunks each time), "
                    "or pass --allow-data-change")
