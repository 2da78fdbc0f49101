"""A stop signal while a command's modules are imported under ``run_guarded`` (``cli.py`` imports Lightning only
for fit/validate/test): the line and exit 128 + the signal at once (``stopsignal.importing``), never the error an
interrupted import turns into (numpy retries a half-done submodule import until the recursion limit)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from helpers import ROOT

# Sends SIGINT to itself in the middle of numpy.random's first import (inside Lightning's import). This exact
# moment does not reproduce the RecursionError (that needs scipy's attribute walk over a half-imported numpy, seen
# in tests/test_signals.py's 0.3 s Ctrl-C): it checks the outcome of a signal mid-import, deterministically.
HOOK = """
import importlib.abc, os, signal, sys
class Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "numpy.random._pickle":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, Hook())
sys.argv = ["scalevec_lit", *sys.argv[1:]]
import runpy
runpy.run_module("scalevec_lit", run_name="__main__", alter_sys=True)
"""


def test_importing_sets_the_at_once_handler_and_restores_the_previous():
    from scalevec_lit import stopsignal

    before = {s: signal.getsignal(s) for s in stopsignal.STOP_SIGNALS}
    with stopsignal.importing():
        assert all(signal.getsignal(s) is stopsignal._exit_now for s in stopsignal.STOP_SIGNALS)
    assert {s: signal.getsignal(s) for s in stopsignal.STOP_SIGNALS} == before


@pytest.mark.slow
def test_a_signal_inside_lightnings_import_is_the_start_up_line_and_130(tmp_path):
    if "numpy.random" in subprocess.run([sys.executable, "-c", "import scalevec_lit.cli, sys; print(sorted(sys.modules))"],
                                        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout:
        pytest.fail("numpy.random is imported before the command runs: the hook would fire outside run_guarded")
    res = subprocess.run([sys.executable, "-c", HOOK, "fit", "--config", str(ROOT / "recipes" / "smoke.yaml"),
                          "--trainer.max_steps=1"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.returncode == 130, res.stderr[-3000:]
    assert lines == ["error: stopped by SIGINT during start-up (before the first training step): nothing was trained "
                     "since the command started, nothing was saved; run the same command again (add --ckpt_path last "
                     "to resume an earlier run)"], res.stderr[-3000:]
    assert not any(tmp_path.iterdir())
