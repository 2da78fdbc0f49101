"""Reliability: exact resume after SIGKILL, atomic and checked checkpoints, the NaN guard."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import ROOT, recipe, run_cli, smoke_args
from test_cli import scalars

N = 10  # checkpoint interval; runs go to 2N


def _ckpt_config(tmp_path: Path, every: int) -> str:
    cfg = tmp_path / "ckpt.yaml"
    cfg.write_text(
        "trainer:\n  callbacks:\n    - class_path: scalevec_lit.callbacks.SafeModelCheckpoint\n"
        f"      init_args:\n        filename: 'step{{step:06d}}'\n        auto_insert_metric_name: false\n"
        f"        every_n_train_steps: {every}\n        save_last: true\n        save_top_k: -1\n"
    )
    return str(cfg)


def _args(data: Path, root: Path, *extra: str) -> list[str]:
    return smoke_args(data, root, 2 * N, "--config", _ckpt_config(root, N), "--trainer.log_every_n_steps=1",
                      "--trainer.val_check_interval=1000", "--trainer.limit_val_batches=0", *extra)


def _losses(root: Path, version: str) -> dict[int, float]:
    return dict(scalars(root / "smoke" / version)["train/loss"])


def test_resume_after_sigkill_is_bitwise_exact(prepared_data, tmp_path):
    a_root, b_root = tmp_path / "a", tmp_path / "b"
    a_root.mkdir(), b_root.mkdir()
    res = run_cli(_args(prepared_data, a_root), cwd=a_root)
    assert res.returncode == 0, res.stderr[-3000:]
    reference = _losses(a_root, "version_0")
    assert sorted(reference) == list(range(2 * N))  # steps 0 .. 2N-1 logged

    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "scalevec_lit", *_args(prepared_data, b_root)], cwd=b_root,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    target = b_root / "checkpoints" / f"step{N:06d}.ckpt"
    deadline = time.time() + 600
    while not target.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    assert target.exists()

    res = run_cli(_args(prepared_data, b_root, "--ckpt_path=last"), cwd=b_root)
    assert res.returncode == 0, res.stderr[-3000:]
    resumed = _losses(b_root, "version_1")
    last_saved = min(resumed)
    assert N <= last_saved < 2 * N
    assert sorted(resumed) == list(range(last_saved, 2 * N))
    for step, value in resumed.items():
        assert value == reference[step], (step, value, reference[step])  # bitwise
    ckpt = torch.load(b_root / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 2 * N and ckpt["scalevec"]["tokens_seen"] == 2 * N * 16 * 128


def test_crash_while_saving_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    from scalevec_lit.lit.checkpoint import SafeCheckpointIO

    io = SafeCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.ones(3)}, path)

    def crash(*args, **kwargs):
        Path(args[2]).write_bytes(b"PK\x03\x04 half a file")
        raise KeyboardInterrupt("killed while saving")

    monkeypatch.setattr("lightning.fabric.plugins.io.torch_io.TorchCheckpointIO.save_checkpoint", crash)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"step": 2, "w": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert io.load_checkpoint(path)["step"] == 1


def test_truncated_or_corrupt_checkpoint_names_the_file(tmp_path):
    from scalevec_lit.lit.checkpoint import CheckpointError, SafeCheckpointIO

    io = SafeCheckpointIO()
    good = tmp_path / "step000010.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.randn(1000)}, good)
    data = good.read_bytes()
    truncated = tmp_path / "truncated.ckpt"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"checkpoint '.*truncated.ckpt' is truncated or corrupt.*step000010.ckpt"):
        io.load_checkpoint(truncated)
    corrupt = tmp_path / "corrupt.ckpt"
    flipped = bytearray(data)
    mid = len(flipped) // 2
    flipped[mid : mid + 64] = bytes(64)
    corrupt.write_bytes(bytes(flipped))
    with pytest.raises(CheckpointError, match=r"checkpoint '.*corrupt.ckpt' is truncated or corrupt"):
        io.load_checkpoint(corrupt)


def test_corrupt_checkpoint_from_the_cli_is_named(prepared_data, tmp_path):
    bad = tmp_path / "broken.ckpt"
    bad.write_bytes(b"not a checkpoint")
    res = run_cli(smoke_args(prepared_data, tmp_path, 2, f"--ckpt_path={bad}"), cwd=tmp_path)
    assert res.returncode != 0
    assert "broken.ckpt' is truncated or corrupt" in res.stderr


def test_checkpoint_from_another_model_shape_is_refused(prepared_data, tmp_path):
    res = run_cli(smoke_args(prepared_data, tmp_path, 2), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    ckpt = next(tmp_path.rglob("last.ckpt"))
    res = run_cli(smoke_args(prepared_data, tmp_path / "other", 4, f"--ckpt_path={ckpt}", "--model.config.n_layer=2"),
                  cwd=tmp_path)
    assert res.returncode != 0
    assert "was written by another model: config.n_layer: checkpoint 4, this run 2" in res.stderr


@pytest.mark.parametrize("policy", ["skip", "stop"])
def test_nan_guard(policy, prepared_data, tmp_path):
    from scalevec_lit.cli import main
    from scalevec_lit.lit.module import CausalLM, NonFiniteLossError

    original = CausalLM._loss

    def poisoned(self, batch):
        loss, n = original(self, batch)
        return (loss * float("nan"), n) if self.training and self.global_step == 3 else (loss, n)

    CausalLM._loss = poisoned
    try:
        args = smoke_args(prepared_data, tmp_path, 6, f"--model.nonfinite={policy}", "--trainer.logger=false",
                          "--trainer.limit_val_batches=0", "--config", _ckpt_config(tmp_path, 100))
        if policy == "skip":
            cli = main(args)
            assert cli.model.skipped_steps == 1
            assert cli.trainer.global_step == 6  # the step counter advances over the skipped batch ...
            opt = cli.trainer.optimizers[0]
            steps = {int(opt.state[p]["step"]) for g in opt.param_groups for p in g["params"]}
            assert steps == {5}  # ... but the optimizer updated the weights 5 times, not 6
            assert all(torch.isfinite(p).all() for p in cli.model.parameters())
        else:
            with pytest.raises(NonFiniteLossError, match=r"non-finite loss nan at step 3: stopped after saving .*nonfinite.ckpt"):
                main(args)
            saved = torch.load(tmp_path / "checkpoints" / "nonfinite.ckpt", map_location="cpu", weights_only=False)
            assert saved["global_step"] == 3
    finally:
        CausalLM._loss = original
