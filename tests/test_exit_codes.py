"""Every row of the exit-code table in docs/troubleshooting.md, through the real command line
(``python -m scalevec_lit ...`` in a subprocess): the code, one ``error:`` line with the key or file and the fix,
no traceback. Cheap on purpose: tiny inputs, and every case fails before training except the full disk, which
needs a save (two steps of the smoke recipe). ``study``'s rows are in the study tests.

- 0: done (``--help`` lists every command the dispatcher runs);
- 1: a failure at run time: a checkpoint with a damaged member name, a full disk while saving (a real short
  write: the process's file-size limit, which torch reports as ``unexpected pos``, as it does a full device);
- 2: a bad command line or input: an unknown command, a negative optimizer weight decay, a checkpoint of
  another model;
- 128 + N: stopped by a signal (SIGINT during ``prepare``: 130).
"""
from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time

import pytest
import torch

from helpers import ROOT, run_cli, smoke_args

pytestmark = pytest.mark.slow  # every case starts `python -m scalevec_lit`
FILE_LIMIT = 2 << 20  # bytes: more than every file a 2-step smoke fit writes before its checkpoint (~15 MB)


def _one_error(res: subprocess.CompletedProcess, code: int) -> str:
    assert "Traceback" not in res.stderr, res.stderr[-3000:]
    assert res.returncode == code, (res.returncode, res.stderr[-3000:])
    errors = [line for line in res.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, res.stderr[-3000:]
    return errors[0]


def _damaged_name(path):
    """A torch checkpoint whose last zip member name holds a byte that is not UTF-8 (a flipped bit)."""
    torch.save({"state_dict": {"w": torch.zeros(8)}}, path)
    data = bytearray(path.read_bytes())
    entry = data.rfind(b"PK\x01\x02")  # the directory entry of the last member
    data[entry + 46 + 2] = 0xFF  # the name's third byte
    path.write_bytes(bytes(data))
    return path


# -- 0 -----------------------------------------------------------------------------------------------------
def test_help_lists_every_command_and_exits_0(tmp_path):
    from scalevec_lit.checks import LIGHTNING_COMMANDS
    from scalevec_lit.cli import COMMAND_HELP, EXTRA_COMMANDS

    res = run_cli(["--help"], cwd=tmp_path)
    assert res.returncode == 0 and res.stderr == "", res.stderr[-3000:]
    listed = [line.split()[0] for line in res.stdout.splitlines() if line.startswith("  ")]
    assert listed == [*LIGHTNING_COMMANDS, *EXTRA_COMMANDS]
    width = max(map(len, listed))
    for name in listed:  # each with its line
        assert f"  {name:<{width}}  {COMMAND_HELP[name]}" in res.stdout.splitlines()


# -- 2 -----------------------------------------------------------------------------------------------------
def test_an_unknown_command_exits_2(tmp_path):
    line = _one_error(run_cli(["fitt"], cwd=tmp_path), 2)
    assert line.startswith("error: command: fitt: unknown command; did you mean 'fit'? the commands are fit, ")


def test_a_negative_weight_decay_exits_2_with_our_message(prepared_data, tmp_path):
    res = run_cli(smoke_args(prepared_data, tmp_path, 2, "--model.optimizer.init_args.weight_decay=-0.1"), cwd=tmp_path)
    assert _one_error(res, 2) == (
        "error: model.optimizer.init_args.weight_decay: -0.1: a negative weight decay makes the optimizer grow every "
        "decayed weight at every step (away from 0 instead of towards it); set a value >= 0 (0 turns decay off), "
        "e.g. --model.optimizer.init_args.weight_decay=0.1")
    assert not list(tmp_path.rglob("*.ckpt"))


def test_a_checkpoint_of_another_model_exits_2(prepared_data, tmp_path):
    import lightning

    from helpers import SMOKE, module_from_config, print_config

    module = module_from_config(print_config("--config", SMOKE, "--model.config.n_layer=1"))
    module.configure_model()
    other = tmp_path / "other.ckpt"
    torch.save({"state_dict": {f"model.{k}": v for k, v in module.model.state_dict().items()},
                "scalevec": {"spec": module.spec()}, "pytorch-lightning_version": lightning.__version__},
               other)
    args = smoke_args(prepared_data, tmp_path / "run", 2, f"--ckpt_path={other}")
    line = _one_error(run_cli(["validate", *args[1:]], cwd=tmp_path), 2)
    assert line.startswith(f"error: checkpoint {other} was written by another model: config.n_layer: checkpoint 1, "
                           "this run 4")
    assert "Resume with the recipe that wrote it" in line


# -- 1 -----------------------------------------------------------------------------------------------------
def test_a_damaged_member_name_exits_1_naming_the_file(tmp_path):
    bad = _damaged_name(tmp_path / "bad.ckpt")
    line = _one_error(run_cli(["export", "--ckpt", str(bad), "--out", str(tmp_path / "hf")], cwd=tmp_path), 1)
    assert line.startswith(f"error: checkpoint {str(bad)!r} is truncated or corrupt (ValueError: a member name in "
                           "its zip directory is not valid UTF-8 (byte ff at 2))")
    assert "codec" not in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.ckpt"]


def _limit_file_size():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing
    resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))


def test_a_full_disk_while_saving_exits_1_with_one_line_and_leaves_no_partial_file(prepared_data, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    res = subprocess.run([sys.executable, "-m", "scalevec_lit",
                          *smoke_args(prepared_data, tmp_path, 2, "--trainer.limit_val_batches=0")],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env,
                         preexec_fn=_limit_file_size)
    line = _one_error(res, 1)
    folder = next(tmp_path.rglob("checkpoints"))
    assert line.startswith(f"error: checkpoint: {folder}/")
    assert f"the file outgrew the largest file allowed there (a file-size limit: `ulimit -f`, or the file system's " \
           f"own) while writing it in {folder} (File too large); the checkpoints written before are intact; free " \
           "space there, or point the checkpoints elsewhere (--trainer.default_root_dir=<a folder with room>), then " \
           "resume with --ckpt_path last" in line
    assert "internal" not in line and "unexpected pos" not in line
    assert not [p for p in folder.iterdir() if p.suffix in (".ckpt", ".tmp")]  # no partial checkpoint


# -- 128 + N -----------------------------------------------------------------------------------------------
def _children(pid: int) -> list[int]:
    """The processes ``pid`` started (Linux: their parent pid in /proc)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/stat") as stat:
                if entry.isdigit() and int(stat.read().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry))
        except (OSError, IndexError, ValueError):
            continue
    return found


def _wait_for(proc: subprocess.Popen, split: str, workers: bool) -> str:
    """Read prepare's stderr until its progress bar for ``split`` shows; with ``workers``, wait then until it
    has forked litdata's workers (mid-optimize). Returns what was read."""
    seen = ""
    while f"prepare: tokenizing {split}" not in seen:
        char = proc.stderr.read(1)
        assert char, seen  # prepare ended first
        seen += char
    deadline = time.monotonic() + 60
    while workers and not _children(proc.pid):
        assert time.monotonic() < deadline and proc.poll() is None, seen
        time.sleep(0.01)
    return seen


@pytest.mark.parametrize("signum, split, workers, group", [
    (signal.SIGINT, "train", True, True),  # Ctrl-C: the whole process group, litdata's workers too
    (signal.SIGINT, "val", False, False),  # between the train and the val optimize
    (signal.SIGTERM, "train", True, False),
], ids=["SIGINT-group-mid-optimize", "SIGINT-between-optimizes", "SIGTERM-mid-optimize"])
def test_a_signal_exits_128_plus_its_number(tmp_path, signum, split, workers, group):
    """Sent at a known moment (not after a guessed delay): prepare's progress bar for ``split`` shows, and with
    ``workers`` litdata's workers run. litdata makes SIGINT end the process with exit code 0 (the stop lost, the
    temporary sibling and its workers left) unless prepare keeps the signals its own (data/workers.py)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "scalevec_lit", "prepare", "--output", str(tmp_path / "data")],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        seen = _wait_for(proc, split, workers)
        assert proc.poll() is None
        os.killpg(proc.pid, signum) if group else proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=120)
        stderr = seen + stderr
        line = _one_error(subprocess.CompletedProcess([], proc.returncode, "", stderr), 128 + signum)
        assert line == f"error: stopped by {signal.Signals(signum).name} during prepare: nothing was written (an " \
                       "output folder is left as it was); run the same command again"
        assert sorted(p.name for p in tmp_path.iterdir()) == []  # no data folder, no temporary sibling
        with pytest.raises(ProcessLookupError):  # no worker outlives the command
            os.killpg(proc.pid, 0)
    finally:
        if proc.poll() is None:
            proc.kill()
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
