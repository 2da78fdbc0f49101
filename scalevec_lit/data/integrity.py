"""The prepared folder's own record of its chunks, checked when a run starts; the data's fingerprint for resume.

``prepare`` records in ``meta.json`` (``chunks``) every chunk file that litdata's ``index.json`` of
``train/`` and ``val/`` lists: its name, its size in bytes and its SHA-256 (``record_chunks``; 11 ms for
the 2.6 MB of the embedded corpus, whose prepare takes 10 s). ``TokenDataModule`` checks the folder before litdata
reads anything (``check_prepared``): every chunk that ``index.json`` lists exists with the recorded size,
the chunk list is the one prepare recorded, and the token counts of ``index.json`` add up to those of
``meta.json``; a missing, truncated or corrupt chunk is a ``RunError`` that names the file, what differs
and the prepare command to run again (litdata would otherwise stop only when it reaches that chunk, with
"Timed out ... waiting for chunk"). ``data.verify`` sets how much is read:

- ``auto`` (default): sizes always; the checksums too when the chunks of the folder total at most
  ``AUTO_CHECKSUM_BYTES`` (1 GiB). Measured on one core of the shared 2-core machine, files in the page
  cache: SHA-256 0.65-1.7 GB/s (1.5 s for 1 GiB; CRC32 0.9 s, so not worth a weaker sum), i.e. 15 s per
  process for a 10 GB folder, more from a cold disk; above 1 GiB only the sizes are checked by default;
- ``sizes``: sizes, the chunk list and the token counts only (no chunk file is read);
- ``checksums``: every chunk read and hashed, whatever its size.

Folders prepared before the record existed are checked by the sizes that ``index.json`` lists
(``chunk_bytes``); ``checksums`` asks for a new prepare there. A remote folder (``s3://``) is checked the
same way against one listing of its bucket prefix (every chunk there with its recorded size), from the
indexes its cache holds (``cache.mirror``); its checksums are checked as each chunk is downloaded
(``cache.ChunkDownloader``), never by reading the bucket twice.

``fingerprint`` identifies a prepared split by content (the chunk list of ``index.json`` and the recorded
checksums), not by path: a resumed run whose data folder moved continues at the saved position when the
fingerprints agree (``datamodule.py``).

Must not import Lightning or torch.
"""
from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path
from typing import Optional

from ..errors import RunError, UserError, notice

SPLITS = ("train", "val")
ALGORITHM = "sha256"
VERIFY_MODES = ("auto", "sizes", "checksums")
#: ``data.verify=auto`` hashes the chunks of a folder that holds at most this many bytes of them
AUTO_CHECKSUM_BYTES = 1 << 30
_BLOCK = 1 << 22


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_BLOCK):
            h.update(block)
    return h.hexdigest()


def _index(root: Path, split: str, meta: Optional[dict] = None) -> dict:
    path = root / split / "index.json"
    try:
        index = json.loads(path.read_text())
        if not isinstance(index.get("chunks"), list):
            raise ValueError("no chunk list")
        return index
    except FileNotFoundError:
        raise RunError(str(path), "missing", "the prepared folder has no index of its chunks (an interrupted "
                       "prepare?)", _fix(root, meta or {})) from None
    except (ValueError, AttributeError) as err:
        raise RunError(str(path), "unreadable", f"not litdata's chunk index ({err}); it was cut short or changed",
                       _fix(root, meta or {})) from None


def record_chunks(root: Path) -> dict:
    """``meta.json``'s ``chunks``: for each split, every chunk file ``index.json`` lists (name, bytes, SHA-256)."""
    root = Path(root)
    out: dict = {"algorithm": ALGORITHM}
    for split in SPLITS:
        out[split] = [{"name": c["filename"], "bytes": (root / split / c["filename"]).stat().st_size,
                       ALGORITHM: file_sha256(root / split / c["filename"])} for c in _index(root, split)["chunks"]]
    return out


def _fix(root, meta: dict) -> str:
    """The prepare command that rebuilds ``root`` from the inputs ``meta.json`` names."""
    source = meta.get("source")
    inputs = " ".join(source) if isinstance(source, list) else (source or "<the same input>")
    extra = "".join(f" {flag} {meta[key]}" for flag, key, default in (
        ("--val-fraction", "val_fraction", 0.05), ("--segment-chars", "segment_chars", 4000),
        ("--chunk-tokens", "chunk_tokens", 1 << 17)) if meta.get(key) not in (None, default))
    tok = f" --tokenizer {meta['tokenizer']}" if meta.get("tokenizer") else ""
    return (f"prepare that folder again: python -m scalevec_lit prepare --input {inputs}{tok} --output {root}"
            f"{extra} --overwrite (a chunk cannot be repaired alone)")


def check_prepared(data_dir: str, meta: dict, verify: str = "auto", local: Optional[Path] = None,
                   listing: Optional[dict[str, int]] = None) -> Optional[str]:
    """Check the chunks of a prepared folder against its record; ``RunError`` naming the first bad chunk.

    A remote ``data_dir`` is checked from its cache folder ``local`` (the indexes) and ``listing`` (every
    object under the URL with its size); without them it is not checked (``None``). Returns what was
    checked (``"sizes"`` or ``"checksums"``; a remote folder's checksums are checked on download)."""
    if verify not in VERIFY_MODES:
        raise UserError("data.verify", verify, f"not one of {', '.join(VERIFY_MODES)}",
                        "use auto (default: checksums for folders up to 1 GiB of chunks, sizes above), sizes or "
                        "checksums")
    remote = "://" in data_dir
    if remote and (local is None or listing is None):
        return None
    root = Path(local) if remote else Path(data_dir)

    def shown(*parts: str) -> str:  # a file's name in messages: its URL for a remote folder
        return "/".join([data_dir.rstrip("/"), *parts]) if remote else str(root.joinpath(*parts))

    record = meta.get("chunks") if isinstance(meta.get("chunks"), dict) else None
    indexes = {split: _index(root, split, meta) for split in SPLITS}
    total = sum(int(c.get("chunk_bytes") or 0) for index in indexes.values() for c in index["chunks"])
    if verify == "checksums" and record is None:
        raise RunError("data.verify", "checksums", f"{root / 'meta.json'} records no chunk checksums (prepared "
                       "before they were recorded)", _fix(root, meta) + ", or check sizes only: --data.verify=sizes")
    hashing = record is not None and (verify == "checksums" or (verify == "auto" and total <= AUTO_CHECKSUM_BYTES))
    hashing = hashing and not remote
    for split, index in indexes.items():
        chunks = index["chunks"]
        listed = [c["filename"] for c in chunks]
        recorded = {r["name"]: r for r in record.get(split, [])} if record is not None else None
        if recorded is not None and listed != list(recorded):
            extra = [n for n in listed if n not in recorded]
            gone = [n for n in recorded if n not in listed]
            raise RunError(shown(split, "index.json"), f"{len(listed)} chunks",
                           f"not the chunks prepare recorded in meta.json ({len(recorded)}; listed but not recorded: "
                           f"{extra[:3] or 'none'}, recorded but not listed: {gone[:3] or 'none'}): the folder mixes "
                           "two prepares", _fix(root, meta))
        tokens = sum(int(c.get("dim") or 0) for c in chunks)
        want = (meta.get("tokens") or {}).get(split)
        if want is not None and tokens != want:
            raise RunError(shown(split, "index.json"), f"{tokens} tokens",
                           f"meta.json records {want} {split} tokens: index.json and meta.json come from different "
                           "prepares", _fix(root, meta))
        for c in chunks:
            path = root / split / c["filename"]
            rec = recorded[c["filename"]] if recorded is not None else None
            size = int(rec["bytes"]) if rec is not None else c.get("chunk_bytes")
            if remote:
                have = listing.get(f"{split}/{c['filename']}")
                where = shown(split, c["filename"])
                if have is None:
                    raise RunError(where, "missing", f"index.json lists this chunk ({size} bytes) but the bucket has no "
                                   "such object", _fix(data_dir, meta))
                if size is not None and have != int(size):
                    raise RunError(where, f"{have} bytes", f"prepare wrote {size} bytes (the object was replaced or cut "
                                   "short)", _fix(data_dir, meta))
                continue
            if not path.is_file():
                raise RunError(str(path), "missing", f"index.json lists this chunk ({size} bytes) but the file is not "
                               "there", _fix(root, meta))
            have = path.stat().st_size
            if size is not None and have != int(size):
                what = "truncated" if have < int(size) else "longer than written"
                raise RunError(str(path), f"{have} bytes", f"{what}: prepare wrote {size} bytes", _fix(root, meta))
            if hashing and rec is not None and file_sha256(path) != rec[ALGORITHM]:
                raise RunError(str(path), f"{have} bytes", f"corrupt: its {ALGORITHM} differs from the one prepare "
                               "recorded in meta.json (same size, other bytes)", _fix(root, meta))
    return "checksums" if hashing else "sizes"


def fingerprint(data_dir: str, meta: dict, split: str = "train", local: Optional[Path] = None) -> Optional[str]:
    """A SHA-256 of a split's content record: ``index.json``'s chunks and config (not its time stamp) and the
    checksums of ``meta.json``; equal for the same prepared data wherever it lies (a remote folder: read from
    its cache folder ``local``). ``None`` when unreadable."""
    if "://" in data_dir and local is None:
        return None
    try:
        index = json.loads((Path(local or data_dir) / split / "index.json").read_text())
    except (OSError, ValueError):
        return None
    record = meta.get("chunks") if isinstance(meta.get("chunks"), dict) else {}
    content = {"chunks": index.get("chunks"), "config": index.get("config"), "record": record.get(split)}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def relocate_state(state: dict, data_dirs: list[str], fingerprints: list[Optional[str]],
                   saved: Optional[list], local_dirs: Optional[list] = None) -> dict:
    """A saved ``StreamingDataLoader`` position (``state``) whose training folder of each source is moved to
    this run's folder (``data_dirs``) when the data are the same: the checkpoint's fingerprint (``saved``,
    from the data module's state) equals this folder's, or, for a checkpoint without one, the old folder is
    still there with the same fingerprint. Otherwise a ``RunError`` naming both folders; the same folder (or
    URL) prepared again with other data since is refused too."""
    state = copy.deepcopy(state)
    ds = state.get("dataset") or {}
    children = [ds] if "input_dir_path" in ds else [ds.get(str(i)) for i in range(len(data_dirs))]
    for i, (d, child) in enumerate(zip(data_dirs, children)):
        if not isinstance(child, dict) or not child.get("input_dir_path"):
            continue
        local = local_dirs[i] if local_dirs is not None else d  # a remote folder: its cache folder here
        if "://" in str(local):
            continue
        here, old = str(Path(local, "train").absolute().resolve()), child["input_dir_path"]  # as litdata resolves it
        same_url = "://" in d and (child.get("input_dir_url") or "").rstrip("/") == f"{d.rstrip('/')}/train"
        if same_url or old == here:
            then = saved[i].get("fingerprint") if saved is not None and i < len(saved) else None
            if then is not None and fingerprints[i] is not None and then != fingerprints[i]:
                raise RunError("data.data_dir", d, "the checkpoint continues a data position in this folder, which "
                               "has been prepared again since: it holds other data (their chunk lists or checksums "
                               "differ), so that position would read other sequences than the run's",
                               "give the data the checkpoint was trained on (prepare the same inputs again, into "
                               "this folder or another), or start from its weights with a fresh data position: "
                               "--model.init_from <checkpoint> instead of --ckpt_path")
            if same_url:
                child["input_dir_path"] = here  # the same URL, cached in another folder (another node, cache_dir)
            continue
        old_dir = str(Path(old).parent)
        other = "holds other data than this folder (their chunk lists or checksums differ)"
        if saved is not None and i < len(saved):
            then = saved[i].get("fingerprint")
        else:  # a checkpoint written before the fingerprints: the old folder itself, when it is still there
            try:
                then = fingerprint(old_dir, json.loads((Path(old_dir) / "meta.json").read_text()))
            except (OSError, ValueError):
                then, other = None, "is gone, and the checkpoint predates data fingerprints: nothing shows that " \
                    "this folder holds the same data"
        if then is None or then != fingerprints[i]:
            raise RunError("data.data_dir", d, f"the checkpoint continues a data position in {old_dir}, which {other}",
                           f"give --data.data_dir={old_dir} (the data it was trained on; a symbolic link there is "
                           "enough), or start from its weights with a fresh data position: --model.init_from "
                           "<checkpoint> instead of --ckpt_path")
        child["input_dir_path"] = here
        notice(f"data.data_dir: {d}: the checkpoint's data position was saved in {old_dir}; the same prepared data "
               "(same chunks and checksums): resuming at that position here")
    return state
