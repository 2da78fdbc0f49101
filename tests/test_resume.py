"""Reliability: exact resume after SIGKILL and after a stop signal (SIGINT, SIGTERM, SIGUSR1 save a checkpoint
at the current step), atomic and checked checkpoints, the NaN guard (the folder lock: test_bad_input.py)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from helpers import ROOT, finish, recipe, run_cli, smoke_args
from helpers import scalars

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


@pytest.fixture(scope="module")
def reference_losses(prepared_data, tmp_path_factory) -> dict[int, float]:
    """The losses of an uninterrupted 2N-step run."""
    a_root = tmp_path_factory.mktemp("reference")
    res = run_cli(_args(prepared_data, a_root), cwd=a_root)
    assert res.returncode == 0, res.stderr[-3000:]
    reference = _losses(a_root, "version_0")
    assert sorted(reference) == list(range(2 * N))  # steps 0 .. 2N-1 logged
    return reference


def _start_and_signal(prepared_data, root: Path, signum: int, delay: float = 0.0) -> tuple[subprocess.Popen, str]:
    """Start a run, wait for its step-N checkpoint (+ ``delay`` s), send ``signum``, wait for the end; its stderr."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONFAULTHANDLER": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "scalevec_lit", *_args(prepared_data, root)], cwd=root,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    target = root / "checkpoints" / f"step{N:06d}.ckpt"
    deadline = time.time() + 600
    while not target.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(delay)
    assert proc.poll() is None, "the run ended before the signal"
    proc.send_signal(signum)
    _, err = finish(proc, 600)
    assert target.exists()
    return proc, err


def _check_resume(prepared_data, root: Path, reference: dict[int, float]) -> int:
    res = run_cli(_args(prepared_data, root, "--ckpt_path=last"), cwd=root)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "exists and is not empty" not in res.stderr  # a resume in its own folder: Lightning's warning is noise
    resumed = _losses(root, "version_1")
    last_saved = min(resumed)
    assert N <= last_saved < 2 * N
    assert sorted(resumed) == list(range(last_saved, 2 * N))
    for step, value in resumed.items():
        assert value == reference[step], (step, value, reference[step])  # bitwise
    return last_saved


@pytest.mark.slow
def test_resume_after_sigkill_is_bitwise_exact(prepared_data, tmp_path, reference_losses):
    b_root = tmp_path / "b"
    b_root.mkdir()
    proc, _ = _start_and_signal(prepared_data, b_root, signal.SIGKILL)
    assert proc.returncode == -signal.SIGKILL, "the run ended before it could be killed"
    _check_resume(prepared_data, b_root, reference_losses)
    ckpt = torch.load(b_root / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 2 * N and ckpt["scalevec"]["tokens_seen"] == 2 * N * 16 * 128


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGUSR1], ids=lambda s: s.name)
def test_stop_signal_saves_the_current_step_and_resume_is_bitwise_exact(signum, prepared_data, tmp_path,
                                                                         reference_losses):
    root = tmp_path / "run"
    root.mkdir()
    proc, err = _start_and_signal(prepared_data, root, signum, delay=1.0)
    assert proc.returncode == 128 + signum, err[-3000:]
    assert "Traceback" not in err
    stopped = [line for line in err.splitlines() if f"stopped by {signum.name} at step" in line]
    assert len(stopped) == 1, err[-3000:]
    step = int(stopped[0].split(" at step ")[1].split(":")[0])
    assert N <= step < 2 * N
    assert (root / "checkpoints" / f"step{step:06d}.ckpt").exists()  # saved at the step it stopped, not at N
    assert not (root / "checkpoints" / "run.lock").exists()  # the folder is released
    ckpt = torch.load(root / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == step
    assert _check_resume(prepared_data, root, reference_losses) == step


def test_crash_while_saving_keeps_the_last_good_checkpoint(tmp_path, monkeypatch):
    from scalevec_lit.callbacks.checkpoint import SafeCheckpointIO

    io = SafeCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1, "w": torch.ones(3)}, path)

    def crash(obj, fh, *args, **kwargs):
        fh.write(b"PK\x03\x04 half a file")
        raise KeyboardInterrupt("killed while saving")

    monkeypatch.setattr("scalevec_lit.callbacks._checkpoint_io.torch.save", crash)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"step": 2, "w": torch.zeros(3)}, path)
    monkeypatch.undo()
    assert io.load_checkpoint(path)["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]  # no half-written file left behind


def test_checkpoints_are_written_beside_themselves_not_staged_in_tmpdir(tmp_path, monkeypatch):
    """Lightning's writer stages every checkpoint in $TMPDIR (a small /tmp failed every save); ours does not."""
    import tempfile

    from scalevec_lit.callbacks.checkpoint import SafeCheckpointIO

    def no_tmpdir(*args, **kwargs):
        raise OSError(28, "No space left on device", tempfile.gettempdir())

    monkeypatch.setattr(tempfile, "mkstemp", no_tmpdir)
    monkeypatch.setattr(tempfile, "NamedTemporaryFile", no_tmpdir)
    io = SafeCheckpointIO()
    io.save_checkpoint({"step": 3, "w": torch.arange(4.0)}, tmp_path / "ckpts" / "step3.ckpt")
    monkeypatch.undo()
    assert io.load_checkpoint(tmp_path / "ckpts" / "step3.ckpt")["step"] == 3


def test_a_full_disk_while_saving_names_the_checkpoint_and_keeps_the_earlier_one(tmp_path, monkeypatch):
    import errno

    from scalevec_lit.callbacks.checkpoint import SafeCheckpointIO
    from scalevec_lit.errors import RunError

    io = SafeCheckpointIO()
    path = tmp_path / "last.ckpt"
    io.save_checkpoint({"step": 1}, path)

    def full(obj, fh, *args, **kwargs):
        fh.write(b"PK\x03\x04 the start")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("scalevec_lit.callbacks._checkpoint_io.torch.save", full)
    with pytest.raises(RunError) as info:
        io.save_checkpoint({"step": 2}, path)
    monkeypatch.undo()
    message = str(info.value)
    assert message.startswith(f"checkpoint: {path}: no space left on the device of {tmp_path}")
    assert "--trainer.default_root_dir=" in message and "--ckpt_path last" in message
    assert info.value.exit_code == 1
    assert io.load_checkpoint(path)["step"] == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt"]


def test_truncated_or_corrupt_checkpoint_names_the_file(tmp_path):
    from scalevec_lit.callbacks.checkpoint import SafeCheckpointIO
    from scalevec_lit.checkpoint.verify import CheckpointError

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


@pytest.mark.slow
def test_corrupt_checkpoint_from_the_cli_is_named(prepared_data, tmp_path):
    bad = tmp_path / "broken.ckpt"
    bad.write_bytes(b"not a checkpoint")
    res = run_cli(smoke_args(prepared_data, tmp_path, 2, f"--ckpt_path={bad}"), cwd=tmp_path)
    assert res.returncode != 0
    assert "broken.ckpt' is truncated or corrupt" in res.stderr


@pytest.mark.slow
def test_checkpoint_from_another_model_shape_is_refused(prepared_data, tmp_path):
    res = run_cli(smoke_args(prepared_data, tmp_path, 2), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    ckpt = next(tmp_path.rglob("last.ckpt"))
    res = run_cli(smoke_args(prepared_data, tmp_path / "other", 4, f"--ckpt_path={ckpt}", "--model.config.n_layer=2"),
                  cwd=tmp_path)
    assert res.returncode != 0
    assert "was written by another model: config.n_layer: checkpoint 4, this run 2" in res.stderr


@pytest.mark.parametrize("deferred", [False, True], ids=["immediate", "deferred"])
@pytest.mark.parametrize("policy", ["skip", "stop", "raise"])
def test_nan_guard(policy, deferred, prepared_data, tmp_path, monkeypatch):
    """A NaN loss at step 3: every policy, checked at once (CPU) and as on CUDA (deferred: no sync per step, the
    host sees the flag one step later; fused AdamW skips the update on the device through ``found_inf``)."""
    from scalevec_lit.cli import main
    from scalevec_lit.lit import nonfinite
    from scalevec_lit.lit.module import CausalLM, NonFiniteLossError

    original = CausalLM._loss

    def poisoned(self, batch):
        loss, n = original(self, batch)
        return (loss * float("nan"), n) if self.training and self.global_step == 3 else (loss, n)

    monkeypatch.setattr(CausalLM, "_loss", poisoned)
    monkeypatch.setattr(nonfinite, "DEFERRED_ON_CPU", deferred)
    args = smoke_args(prepared_data, tmp_path, 6, f"--model.nonfinite={policy}", "--trainer.logger=false",
                      "--trainer.limit_val_batches=0", "--config", _ckpt_config(tmp_path, 100),
                      "--model.optimizer.init_args.fused=true")
    if policy == "skip":
        cli = main(args)
        assert cli.model.skipped_steps == 1
        assert cli.trainer.global_step == 6  # the step counter advances over the skipped batch ...
        opt = cli.trainer.optimizers[0]
        steps = {int(opt.state[p]["step"]) for g in opt.param_groups for p in g["params"]}
        assert steps == {5}  # ... but the optimizer updated the weights 5 times, not 6
        assert all(torch.isfinite(p).all() for p in cli.model.parameters())
        saved = torch.load(tmp_path / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
        assert saved["scalevec"]["skipped_steps"] == 1
        return
    seen = 4 if deferred else 3
    with pytest.raises(SystemExit) as info:
        main(args)
    assert info.value.code == 1
    assert f"model.nonfinite: {policy}: non-finite loss nan at step 3" in str(info.value)
    if deferred:
        assert f"(seen at step {seen}" in str(info.value)
    if policy == "stop":
        assert "stopped after saving" in str(info.value) and "nonfinite.ckpt" in str(info.value)
        saved = torch.load(tmp_path / "checkpoints" / "nonfinite.ckpt", map_location="cpu", weights_only=False)
        assert saved["global_step"] == seen
        assert all(torch.isfinite(v).all() for v in saved["state_dict"].values() if v.is_floating_point())
        steps = {int(st["step"]) for st in saved["optimizer_states"][0]["state"].values()}
        assert steps == {seen - 1 if deferred else seen}  # the NaN step's update never happened
    else:
        assert not (tmp_path / "checkpoints" / "nonfinite.ckpt").exists()


def test_found_inf_skips_a_fused_adamw_step_on_the_device():
    """The mechanism of the sync-free skip: fused AdamW leaves weights, moments and step alone when found_inf is 1."""
    from scalevec_lit.lit.nonfinite import NonFiniteGuard, supports_found_inf

    w = torch.nn.Parameter(torch.ones(4))
    opt = torch.optim.AdamW([w], lr=0.1, weight_decay=0.1, fused=True)
    assert supports_found_inf(opt) and not supports_found_inf(torch.optim.AdamW([w], lr=0.1))
    guard = NonFiniteGuard()
    for step, value in enumerate([1.0, float("inf"), 2.0]):
        loss = (w * value).sum()
        guard.observe(loss, step, opt)
        loss.backward()
        before = (w.detach().clone(), {k: v.clone() for k, v in opt.state[w].items()})
        opt.step()
        opt.zero_grad()
        if step == 1:
            assert torch.equal(w, before[0]) and all(torch.equal(opt.state[w][k], v) for k, v in before[1].items())
        else:
            assert not torch.equal(w, before[0])
    assert guard.poll() == (1, float("inf"), 1) and guard.poll() is None  # reported once
