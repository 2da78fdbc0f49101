"""Shared fixtures: the embedded corpus prepared once per session, a seed per test, one intra-op thread
for files that ask for it (and for every pytest-xdist worker), and the bad-input ``world`` (helpers:
``tests/helpers.py``)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from helpers import ROOT, file_hashes


def pytest_configure(config):
    """Under pytest-xdist (``make test``: one worker per core) each worker computes with one intra-op thread,
    and so do the processes its tests start (``OMP_NUM_THREADS``, unless a test sets it): two workers with
    two threads each on a 2-core CPU would run four threads on two cores."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker:
        torch.set_num_threads(1)
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        # inductor's kernel cache, one per worker: two workers compiling the same kernel into one shared cache
        # can load the other's half-written library ("file too short"); kept between runs as the default is
        import getpass
        import tempfile

        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(
            tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}", f"xdist_{worker}"))


@pytest.fixture(scope="session")
def prepared_data(tmp_path_factory) -> Path:
    """The embedded Shakespeare corpus, tokenized with the embedded tokenizer, in a temp folder."""
    from scalevec_lit.data.prepare import prepare

    out = tmp_path_factory.mktemp("data") / "shakespeare"
    prepare(output_dir=out, num_workers=1)
    return out


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


@pytest.fixture()
def one_thread():
    """Tiny models on a 2-core CPU shared with other jobs: one intra-op thread avoids oversubscription
    (a file opts in with ``pytestmark = pytest.mark.usefixtures("one_thread")``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture()
def world(tmp_path, prepared_data):
    """The files a run may read but never change: this test's inputs, the prepared data, the recipes
    (``helpers.check`` asserts they are unchanged); a run writes under ``world.path / "out"``."""
    roots = (tmp_path, prepared_data, ROOT / "recipes", ROOT / "scalevec_lit" / "data" / "corpus")
    out = tmp_path / "out"

    class World:
        path = tmp_path
        data = prepared_data

        def __init__(self):
            self.before = None

        def freeze(self):
            self.before = file_hashes(*roots, exclude=(out,))

        def unchanged(self):
            assert file_hashes(*roots, exclude=(out,)) == self.before

    return World()
