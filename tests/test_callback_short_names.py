"""Every callback of this library is accepted by its short name (``--trainer.callbacks+=SharpnessMonitor``) in
a fresh process, not only once something else has imported its module: jsonargparse resolves a short name
among the subclasses already imported, and the package loads its modules lazily."""
from __future__ import annotations

import inspect
import os
import subprocess
import sys

import pytest

import scalevec_lit.callbacks as callbacks
from lightning.pytorch.callbacks import Callback

SMOKE = "recipes/smoke.yaml"


def _needs_no_argument(cls) -> bool:
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    return all(p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) for p in params)


NAMES = [n for n in dir(callbacks) if isinstance(getattr(callbacks, n), type)
         and issubclass(getattr(callbacks, n), Callback) and _needs_no_argument(getattr(callbacks, n))]


def test_the_list_holds_the_callbacks_users_name():
    assert {"SharpnessMonitor", "ScaleVectorMonitor", "MoELoadMonitor"} <= set(NAMES)


@pytest.mark.slow
def test_each_callback_is_accepted_by_its_short_name_in_a_fresh_process():
    options = [f"--trainer.callbacks+={name}" for name in NAMES]
    proc = subprocess.run([sys.executable, "-m", "scalevec_lit", "fit", "--config", SMOKE, *options, "--print_plan"],
                          capture_output=True, text=True, timeout=300,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "error" not in proc.stderr.lower(), proc.stderr[-2000:]
