"""The embedded corpus on a fresh checkout: a fit whose ``data.data_dir`` is the default location and holds
nothing yet prepares it there first (``TokenDataModule`` calls this for each folder)."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from .inputs import MANIFEST
from .prepare import DEFAULT_OUTPUT, META


def prepare_default_if_missing(data_dir: str, wait_s: float = 1800.0) -> bool:
    """Prepare the embedded corpus when ``data_dir`` is its default location (``data/prepared/shakespeare``
    under the working directory) and holds nothing yet; one line says so. Any other folder is left alone.
    Under several processes the first local rank prepares and the others wait for its ``meta.json``."""
    if "://" in data_dir:
        return False
    root = Path(data_dir)
    if root.resolve() != (Path.cwd() / DEFAULT_OUTPUT).resolve() or (root / META).is_file():
        return False
    interrupted = root.is_dir() and (root / MANIFEST).is_file()  # prepare's own files, without meta.json
    if root.exists() and (not root.is_dir() or any(root.iterdir())) and not interrupted:
        return False  # something else is there: the usual checks say what
    if os.environ.get("LOCAL_RANK", "0") != "0":
        deadline = time.monotonic() + wait_s
        while not (root / META).is_file() and time.monotonic() < deadline:
            time.sleep(1.0)
        return False
    from .prepare import prepare

    print(f"data.data_dir: {data_dir} is not prepared yet: preparing the embedded Shakespeare corpus there (once; "
          f"`python -m scalevec_lit prepare` does the same)"
          f"{'; an earlier prepare there was interrupted' if interrupted else ''}",
          file=sys.stderr, flush=True)
    prepare(output_dir=root, overwrite=interrupted)  # overwrite: removes only prepare's own files
    return True
