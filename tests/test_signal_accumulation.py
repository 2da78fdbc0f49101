"""A stop signal with gradient accumulation saves at the end of the optimizer step, not inside its window
(``callbacks/_stop_signals.py``). Found by ``tests/test_elastic_hosts.py``: torchrun stops the workers with SIGTERM
when a lost host comes back, and the checkpoint the one-host start saved then was written after 3 of its 4
micro-batches (its gradients lost), which no start on two hosts could resume ("written in the middle of an
accumulation window")."""
from __future__ import annotations

import os

import torch

from helpers import ROOT, run_cli, smoke_args


def test_sigterm_inside_an_accumulation_window_saves_at_the_end_of_the_step(prepared_data, tmp_path):
    args = smoke_args(prepared_data, tmp_path, 6, "--trainer.accumulate_grad_batches=4", "--data.batch_size=2",
                      "--model.config.n_layer=1", "--model.config.n_embd=32", "--model.config.seq_len=32",
                      "--trainer.limit_val_batches=0", "--trainer.callbacks+=elastic_probe.SignalInWindow",
                      "--trainer.callbacks.init_args.batch=5")  # micro-batch 2 of 4 of step 1
    res = run_cli(args, cwd=tmp_path, env={"OMP_NUM_THREADS": "1", "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}"})
    assert res.returncode == 143, res.stderr[-3000:]
    assert "note: stopped by SIGTERM at step 2: saved " in res.stderr, res.stderr[-3000:]  # before: at step 1
    ckpt = torch.load(tmp_path / "checkpoints" / "step000002.ckpt", map_location="cpu", weights_only=False)
    progress = ckpt["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]
    assert ckpt["global_step"] == 2 and progress["ready"] == 8, progress  # 2 whole steps of 4 micro-batches
