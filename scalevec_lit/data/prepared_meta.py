"""A prepared folder's ``meta.json`` read where it lies, for the commands that need only its record and not
the data module: ``fit --print_plan`` (the vocabulary, ``lit/plan_count.py``) and ``export`` of a checkpoint
older than the tokenizer record (the tokenizer its run's data was prepared with, ``export/tokenizer.py``).

A local folder is read from the disk; an ``s3://`` folder through ``remote.Remote``, the one client the data
module reads it with (same endpoint, credentials and ``data.storage_options``), so a folder a fit can read
is read here too.

Must not import Lightning or torch.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from ..errors import RunError
from .remote import Remote, check_options, is_remote, join

META = "meta.json"


def meta_location(data_dir: Any) -> str:
    """Where ``data_dir``'s ``meta.json`` is: its URL, or its local path."""
    return join(str(data_dir), META) if is_remote(data_dir) else str(Path(str(data_dir)) / META)


def _remote(data_dir: Any, options: dict, key: str) -> Remote:
    remote = Remote(str(data_dir), options, key=key)
    remote.resume_hint = ""  # not a fit: nothing to resume
    return remote


def read_meta(data_dir: Any, storage_options: Optional[dict] = None, key: str = "data.data_dir",
              tries: Optional[int] = None, timeout: Optional[float] = None) -> Optional[dict]:
    """``data_dir``'s ``meta.json``, or ``None`` when it has none (a local folder that is not there or not
    prepared, a prefix without one). ``tries`` and ``timeout`` cap those of ``storage_options`` (a quick
    look). A remote folder that cannot be read (endpoint down, no bucket, credentials refused) and a
    ``meta.json`` that is not JSON: a ``RunError`` naming ``key``, the URL or path, why, and the fix; a bad
    ``storage_options`` key or another scheme than ``s3://``: a ``UserError``, as the data module refuses it."""
    where = meta_location(data_dir)
    if is_remote(data_dir):
        options = check_options(storage_options)
        if tries is not None:
            options["retries"] = max(1, min(int(options.get("retries", tries)), tries))
        if timeout is not None:
            options["timeout"] = min(float(options.get("timeout", timeout)), timeout)
        remote = _remote(data_dir, options, key)
        try:
            raw = remote.read(META, missing_ok=True)
        except RunError as err:
            raise RunError(key, where, err.problem, err.fix) from None
        if raw is None:
            return None
    else:
        path = Path(where)
        if not path.is_file():
            return None
        raw = path.read_bytes()
    try:
        meta = json.loads(raw)
        if not isinstance(meta, dict):
            raise ValueError(f"a {type(meta).__name__}, not an object")
    except ValueError as err:
        raise RunError(key, where, f"unreadable ({err})", f"prepare that folder again with --output {data_dir} "
                       "--overwrite") from None
    return meta


def tokenizer_copy(data_dir: Any, storage_options: Optional[dict] = None, cache_dir: Optional[str] = None,
                   key: str = "data.data_dir") -> Optional[Path]:
    """The copy of the tokenizer that ``prepare`` uploaded beside a remote ``data_dir``'s ``meta.json``, in the
    data cache (``cache.cached_tokenizer``, where a fit finds it too); ``None`` when there is none. A remote
    folder that cannot be read: a ``RunError`` naming ``key``, as ``read_meta``'s."""
    from .cache import cached_tokenizer

    return cached_tokenizer(_remote(data_dir, check_options(storage_options), key), cache_dir)
