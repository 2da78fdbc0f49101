"""A stop signal whose ``StopSignal`` was swallowed while ``fit`` started up (a library's ``__del__`` or its
``except BaseException``, before the first training step) stops the run when ``SafeModelCheckpoint`` takes the
signals over at train start (``callbacks/_stop_signals.py``): no step is trained, nothing is saved, the line is
the start-up one and the exit code 128 + the signal. Before, the run trained to its end and only then exited
with the signal's code. In process: the signal is raised by a callback of the run itself, under ``run_guarded``
as the command line runs ``fit``; with no signal the same run trains."""
from __future__ import annotations

import gc
import signal
from pathlib import Path

import lightning.pytorch as pl
import pytest

from scalevec_lit import stopsignal
from scalevec_lit.errors import run_guarded
from plain_module import OwnLoader

pytestmark = pytest.mark.usefixtures("one_thread")

START_UP = ("error: stopped by {} during start-up (before the first training step): nothing was trained since the "
            "command started, nothing was saved; run the same command again (add --ckpt_path last to resume an "
            "earlier run)\n")


class _Pipe:
    def __del__(self):
        signal.raise_signal(signal.SIGINT)  # the handler runs here: its StopSignal cannot leave __del__


class Swallow(pl.Callback):
    """Takes a stop signal while the run sets up: ``how`` is ``del`` (SIGINT in a ``__del__``), ``catch`` (SIGTERM
    under a catch-all) or ``none``."""

    def __init__(self, how: str) -> None:
        self.how = how

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.how == "del":
            pipe = _Pipe()
            del pipe
            gc.collect()
        elif self.how == "catch":
            try:
                signal.raise_signal(signal.SIGTERM)
            except BaseException:  # noqa: BLE001 - a library that takes everything
                pass




def _fit(folder: Path, how: str, module: OwnLoader) -> None:
    from scalevec_lit.callbacks import SafeModelCheckpoint

    cb = SafeModelCheckpoint(dirpath=folder, every_n_train_steps=2, save_top_k=-1)
    trainer = pl.Trainer(accelerator="cpu", max_steps=3, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[Swallow(how), cb])
    run_guarded(lambda argv: trainer.fit(module), ["fit"])


@pytest.mark.parametrize("how, name, code", [("del", "SIGINT", 130), ("catch", "SIGTERM", 143)])
def test_a_stop_swallowed_while_fit_starts_stops_before_the_first_step(tmp_path, capsys, how, name, code):
    before = {s: signal.getsignal(s) for s in stopsignal.STOP_SIGNALS}
    module = OwnLoader()
    with pytest.raises(SystemExit) as exit_:
        _fit(tmp_path / "checkpoints", how, module)
    assert exit_.value.code == code
    err = capsys.readouterr().err  # perhaps Lightning's own start-up lines, then ours
    assert err.endswith(START_UP.format(name)) and err.count("error:") == 1
    assert module.steps == 0  # not one step trained
    assert not any(p.suffix == ".ckpt" for p in (tmp_path / "checkpoints").glob("*"))  # nothing saved
    assert {s: signal.getsignal(s) for s in stopsignal.STOP_SIGNALS} == before  # the handlers from before are back
    assert stopsignal._state["raised"] is None


def test_without_a_signal_the_run_trains(tmp_path, capsys):
    module = OwnLoader()
    _fit(tmp_path / "checkpoints", "none", module)
    assert module.steps == 3
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("*.ckpt")) == ["epoch=0-step=2.ckpt",
                                                                              "epoch=0-step=3.ckpt"]
    assert "error:" not in capsys.readouterr().err
