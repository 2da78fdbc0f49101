"""Shared fixtures: the embedded corpus prepared once per session, a seed per test, one intra-op thread
for files that ask for it (and for every pytest-xdist worker), and the bad-input ``world`` (helpers:
``tests/helpers.py``)."""
from __future__ import annotations

import os
from pathlib import Path

import lightning.pytorch  # noqa: F401 - here, not inside a test: see below
import pytest
import torch

from helpers import ROOT, file_hashes

# Lightning gives its loggers a StreamHandler bound to sys.stderr as it is when Lightning is first imported. Imported
# first inside a test that captures output (capfd, capsys), the handler would keep that test's capture stream, which
# pytest closes after it: every later message of Lightning ("Seed set to 42") then prints a logging traceback into the
# next tests' output. Imported here, the handler keeps the session's stream.


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


# What each of the heavier test files cost (setup + call + teardown of its tests, seconds) in the run of
# 2026-12-05 recorded in docs/development.md: only the order matters. A file not listed costs less than 20 s.
FILE_COST = {
    "test_compile.py": 727, "test_scale.py": 633, "test_resume.py": 293, "test_cli.py": 285,
    "test_global_batch.py": 212, "test_reshard_resume.py": 165, "test_moe_compile.py": 156,
    "test_study_exit.py": 137, "test_study.py": 124, "test_bad_input.py": 118, "test_remote_fit.py": 113,
    "test_signals.py": 108, "test_extension_suite.py": 105, "test_study_endpoint.py": 100,
    "test_restart_policy.py": 190, "test_distributed.py": 88, "test_exit_codes.py": 79, "test_plan_memory.py": 73,
    "test_installed.py": 70, "test_moe_model.py": 69, "test_callbacks.py": 62, "test_remote_data.py": 62,
    "test_study_loggers.py": 62, "test_extensions.py": 54, "test_lost_rank.py": 53, "test_downstream_eval.py": 51,
    "test_export_files.py": 49, "test_generate.py": 48, "test_compile_memory.py": 42, "test_async_checkpoint.py": 85,
    "test_study_estimate.py": 37, "test_evaluate_ranks.py": 35, "test_compile_report.py": 31,
    "test_reshard_workers.py": 70,  # estimated: 62 s of real fits measured on a busy machine, 6 s of loaders
    "test_data_threads.py": 30,  # estimated: 14 s measured on a busy machine (server, two prepares, three fits)
    "test_checkpoint_folder.py": 36,  # measured on a busy machine: a 2-process FSDP2 fit and its resume
    "test_checkpoint_folder_full.py": 22,  # measured on a busy machine: two 1-process FSDP2 fits
    "test_output_folders.py": 23, "test_optim.py": 23, "test_first_run.py": 90,
    "test_class_values.py": 16,  # measured on a busy machine (load 5): 32 in-process parses of fit
    # issue 45 (measured alone on the 2-core machine): restart_policy's stopped rank waits out torchrun's
    # 30-second grace (+90 s); two 2-process fits and a resume; two servers and fits from them
    "test_lost_rank_cases.py": 70, "test_remote_midfit.py": 60,
    # issue 46 (measured alone on the 2-core machine): a SLURM cluster and its jobs; two hosts in namespaces,
    # their four faults and the elastic run; the global-batch resume chain; test_first_run's prepare, CSV and
    # 2-process fits, test_async_checkpoint's FSDP2 kill
    "test_slurm.py": 175, "test_elastic_hosts.py": 120, "test_two_hosts.py": 95, "test_reshard_global_batch.py": 70,
}


def pytest_collection_modifyitems(config, items):
    """Under pytest-xdist, the files heaviest first (``FILE_COST``; the others after them, in their order),
    a file's own tests in their order. ``make test`` hands whole files to the workers in this order
    (``--dist loadfile --no-loadscope-reorder``): a long file started last would keep one worker busy while
    the other has nothing left to do; started first, the short files fill in around it."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: -FILE_COST.get(item.path.name, 0))  # stable: the rest keeps its order


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
