"""Bad input, as a new user gives it: every case asserts the exit code, the one-paragraph message, that no
traceback is printed, and that no file outside the run's own output changed (hashes before and after).

Most cases run the command in-process (``scalevec_lit.cli.main``), which is what ``python -m scalevec_lit``
runs, so that the whole file takes a minute or two; one case runs a real subprocess to check the exit code
and stderr end to end. The cases of ``prepare`` are in ``test_bad_prepare.py``.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

import scalevec_lit.cli  # noqa: F401 - imports Lightning before any test captures stderr: the log handler it
#                          installs must not keep a per-test stream that is closed afterwards
from helpers import ROOT, SMOKE, check, fit, recipe, run_cli, smoke_args


# -- the command line and the recipe (exit 2) ---------------------------------------------------------
def test_unknown_command(world, capfd):
    check(world, capfd, ["fitt", "--config", SMOKE], 2, "command: fitt: unknown command", "did you mean 'fit'")


def test_no_command(world, capfd):
    check(world, capfd, [], 2, "no command given", "fit")


def test_missing_recipe_file(world, capfd):
    check(world, capfd, ["fit", "--config", "recipes/smoke.yml"], 2, "--config: recipes/smoke.yml: no such file",
          "recipes/smoke.yaml")


def test_recipe_with_tabs(world, capfd):
    bad = world.path / "tabs.yaml"
    bad.write_text("trainer:\n\tmax_steps: 3\n")
    check(world, capfd, ["fit", "--config", SMOKE, "--config", bad], 2, f"{bad}:2", "indented with a tab",
          "replace the tabs by spaces")


def test_recipe_that_is_not_yaml(world, capfd):
    bad = world.path / "broken.yaml"
    bad.write_text("model:\n  config: {n_layer: 2\n")
    check(world, capfd, ["fit", "--config", bad], 2, f"{bad}:", "not valid YAML")


def test_unknown_key_suggests_the_closest(world, capfd):
    check(world, capfd, ["fit", "--config", SMOKE, "--model.config.n_layers=3"], 2,
          "unknown key 'model.config.n_layers'; did you mean 'model.config.n_layer'")


def test_wrong_type(world, capfd):
    check(world, capfd, ["fit", "--config", SMOKE, "--model.config.n_layer=four"], 2, "model.config.n_layer", "four")


def test_unknown_placement(world, capfd):
    check(world, capfd, ["fit", "--config", SMOKE, "--model.strategy.placement.q=dnpp"], 2, "placement.q", "dnpp",
          "dual_norm")


@pytest.mark.parametrize("key, value, parts", [
    ("model.optimizer.init_args.lr", "-0.001", ("model.optimizer.init_args.lr: -0.001: a negative learning rate",)),
    ("data.batch_size", "0", ("data.batch_size: 0: must be at least 1",)),
    ("model.config.seq_len", "0", ("model.config.seq_len: 0: must be at least 1",)),
    ("model.config.seq_len", "-3", ("model.config.seq_len: -3: must be at least 1",)),
    ("trainer.max_steps", "-5", ("trainer.max_steps: -5: must be a positive number", "--trainer.max_steps=")),
    ("trainer.max_steps", "0", ("trainer.max_steps: 0: a run needs at least one optimizer step",)),
    ("data.num_workers", "-1", ("data.num_workers: -1: must be at least 0",)),
])
def test_bad_values(world, capfd, key, value, parts):
    check(world, capfd, fit(world, f"--{key}={value}"), 2, *parts)


def test_data_dir_that_is_a_file(world, capfd):
    (world.path / "notes.txt").write_text("hello")
    check(world, capfd, fit(world, f"--data.data_dir={world.path / 'notes.txt'}"), 2,
          "notes.txt'", "is a file, not a prepared folder", "prepare --output")


def test_data_dir_that_does_not_exist(world, capfd):
    check(world, capfd, fit(world, f"--data.data_dir={world.path / 'nowhere'}"), 2, "data.data_dir:", "nowhere",
          "does not exist", "prepare")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the machine has a GPU")
def test_gpu_recipe_on_a_cpu_machine_says_how_to_run_on_cpu(world, capfd):
    check(world, capfd, ["fit", "--config", recipe("dense_2b.yaml")], 2,
          "trainer.accelerator: gpu: this recipe needs a CUDA GPU", "--trainer.accelerator=cpu", "recipes/smoke.yaml")


def test_gpu_recipe_with_the_cpu_flags_and_no_data(world, capfd):
    from scalevec_lit.checks import CPU_FLAGS

    check(world, capfd, ["fit", "--config", recipe("dense_2b.yaml"), *CPU_FLAGS.split(),
                         f"--data.data_dir={world.path / 'pretrain'}"], 2, "data.data_dir:", "pretrain", "prepare")


def test_missing_checkpoint(world, capfd):
    check(world, capfd, fit(world, f"--ckpt_path={world.path / 'nope.ckpt'}"), 2,
          "--ckpt_path:", "nope.ckpt", "no such checkpoint")


# -- runs that start, and the checkpoints they leave ----------------------------------------------------
@pytest.fixture(scope="module")
def trained(prepared_data, tmp_path_factory) -> Path:
    """A 2-step smoke run (a real checkpoint with its tokenizer recorded), in-process."""
    from scalevec_lit.cli import main

    root = tmp_path_factory.mktemp("trained")
    main(smoke_args(prepared_data, root, 2, "--trainer.limit_val_batches=0"))
    ckpt = root / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    return ckpt


def test_short_run_of_a_recipe_with_a_duplicated_callback_and_lr_zero(world, capfd):
    """``--trainer.max_steps=2`` (warmup 30 clipped), the README's ``callbacks+=`` of a callback the recipe has,
    and lr 0 (a warning): the run works, with one line for each."""
    text = check(world, capfd, fit(world, "--model.schedule.init_args.warmup_steps=30",
                                   "--trainer.callbacks+=scalevec_lit.callbacks.ScaleVectorMonitor",
                                   "--model.optimizer.init_args.lr=0"), 0,
                 "note: model.schedule.warmup_steps: 30 is longer than this run (2 steps); warming up over 2",
                 "note: trainer.callbacks: scalevec_lit.callbacks.ScaleVectorMonitor is given twice",
                 "warning: model.optimizer.init_args.lr: 0: the weights will not change")
    assert (world.path / "out" / "checkpoints" / "last.ckpt").is_file()
    assert text.count("is given twice") == 1


def test_differently_configured_evaluators_are_kept_and_equal_ones_merged(capfd):
    """Two ``DownstreamEval`` with other options are both kept (a legitimate set, like two checkpoint
    callbacks); the same one given twice is merged with a note, as for any other callback."""
    from jsonargparse import Namespace

    from scalevec_lit.checks import _dedupe_callbacks

    def cb(path, **kw):
        return Namespace(class_path=path, init_args=Namespace(**kw))

    ev = "scalevec_lit.callbacks.DownstreamEval"
    mon = "scalevec_lit.callbacks.ScaleVectorMonitor"
    cfg = Namespace(trainer=Namespace(callbacks=[cb(ev, tasks=["a"], every_n_steps=10), cb(mon),
                                                 cb(ev, tasks=["a"], every_n_steps=100, prefix="full"), cb(mon)]))
    _dedupe_callbacks(cfg)
    kept = [(c.class_path, dict(vars(c.init_args))) for c in cfg.trainer.callbacks]
    assert kept == [(ev, {"tasks": ["a"], "every_n_steps": 10}),
                    (ev, {"tasks": ["a"], "every_n_steps": 100, "prefix": "full"}), (mon, {})]
    assert capfd.readouterr().err.count("is given twice") == 1
    cfg = Namespace(trainer=Namespace(callbacks=[cb(ev, tasks=["a"]), cb(ev, tasks=["a"])]))
    _dedupe_callbacks(cfg)
    assert len(cfg.trainer.callbacks) == 1 and f"{ev} is given twice" in capfd.readouterr().err


def _damaged(trained: Path, folder: Path, how: str) -> Path:
    data = bytearray(trained.read_bytes())
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how.startswith("locator"):  # the zip64 end-record locator: its disk number (Python's zipfile fails),
        at = data.rfind(b"PK\x06\x07")  # or its offset (zipfile and every CRC pass, torch's reader fails)
        data[at + (4 if how == "locator_disk" else 12)] ^= 0xFF
    else:
        data[len(data) // 3] ^= 0xFF  # one flipped byte inside the weights
    bad = folder / f"{how}.ckpt"
    bad.write_bytes(bytes(data))
    return bad


@pytest.mark.parametrize("how", ["truncated", "flipped", "locator_disk", "locator_offset"])
def test_fit_refuses_a_damaged_checkpoint(world, capfd, trained, how):
    bad = _damaged(trained, world.path, how)
    check(world, capfd, fit(world, f"--ckpt_path={bad}"), 1, f"{how}.ckpt", "truncated or corrupt")


@pytest.mark.parametrize("how", ["truncated", "flipped", "locator_disk", "locator_offset"])
def test_export_refuses_a_damaged_checkpoint(world, capfd, trained, how):
    bad = _damaged(trained, world.path, how)
    check(world, capfd, ["export", "--ckpt", bad, "--out", world.path / "out" / "hf"], 1, f"{how}.ckpt",
          "truncated or corrupt")
    assert not (world.path / "out" / "hf" / "model.safetensors").exists()


@pytest.mark.parametrize("how", ["truncated", "locator_disk", "locator_offset"])
def test_generate_refuses_a_damaged_checkpoint(world, capfd, trained, how):
    bad = _damaged(trained, world.path, how)
    check(world, capfd, ["generate", "--ckpt", bad, "--prompt", "To be", "--max-new-tokens", "2"], 1,
          f"{how}.ckpt", "truncated or corrupt")


def test_a_folder_of_checkpoints_is_not_a_checkpoint(world, capfd, trained):
    folder = world.path / "checkpoints"
    folder.mkdir()
    shutil.copy(trained, folder / "step000001.ckpt")
    shutil.copy(trained, folder / "last.ckpt")
    newest = str(folder / "last.ckpt")
    check(world, capfd, fit(world, f"--ckpt_path={folder}"), 2, f"--ckpt_path: '{folder}': is a folder of 2 "
          "checkpoint(s), not a checkpoint", f"the newest is '{newest}'", "--ckpt_path last")
    check(world, capfd, ["export", "--ckpt", folder, "--out", world.path / "out" / "hf"], 2,
          f"--ckpt: '{folder}': is a folder of 2 checkpoint(s)", f"the newest is '{newest}'")
    check(world, capfd, ["generate", "--ckpt", folder, "--prompt", "To be"], 2,
          f"--ckpt: '{folder}': is a folder of 2 checkpoint(s)", f"the newest is '{newest}'")


def test_export_refuses_a_tokenizer_other_than_the_recorded_one(world, capfd, trained):
    from scalevec_lit.data.tokenizer import DEFAULT_TOKENIZER

    other = world.path / "other.json"
    other.write_text(DEFAULT_TOKENIZER.read_text().replace("<|endoftext|>", "<|end_of_text|>"))
    check(world, capfd, ["export", "--ckpt", trained, "--out", world.path / "out" / "hf", "--tokenizer", other], 2,
          "--tokenizer:", "other.json", "is not the tokenizer the model was trained with")


def test_export_refuses_when_the_recorded_tokenizer_is_gone(world, capfd, trained):
    ckpt = torch.load(trained, map_location="cpu", weights_only=False)
    assert ckpt["scalevec"]["tokenizer"]["sha256"]
    ckpt["scalevec"]["tokenizer"]["path"] = str(world.path / "moved" / "tokenizer.json")
    moved = world.path / "moved.ckpt"
    torch.save(ckpt, moved)
    check(world, capfd, ["export", "--ckpt", moved, "--out", world.path / "out" / "hf"], 2,
          "moved/tokenizer.json", "which is not there any more", "pass --tokenizer")


def test_export_ships_the_recorded_tokenizer(world, capfd, trained):
    text = check(world, capfd, ["export", "--ckpt", trained, "--out", world.path / "out" / "hf", "--format",
                                "native"], 0, "recorded in the checkpoint")
    assert "embedded" not in text


@pytest.mark.slow
def test_second_run_into_a_folder_in_use(world, capfd):
    import socket
    import subprocess
    import sys

    folder = world.path / "out" / "checkpoints"
    folder.mkdir(parents=True)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (folder / "run.lock").write_text(json.dumps({"pid": sleeper.pid, "host": socket.gethostname()}))
        check(world, capfd, fit(world), 1, "checkpoint folder", "in use", f"pid {sleeper.pid}",
              "--trainer.default_root_dir=")
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.slow
def test_stale_lock_of_a_dead_run_is_taken_over(world, capfd):
    import socket
    import subprocess
    import sys

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    folder = world.path / "out" / "checkpoints"
    folder.mkdir(parents=True)
    (folder / "run.lock").write_text(json.dumps({"pid": dead.pid, "host": socket.gethostname()}))
    check(world, capfd, fit(world), 0, "taking over the lock of a run that is no longer running")
    assert not (folder / "run.lock").exists() and (folder / "last.ckpt").exists()


def test_fresh_run_into_a_folder_with_another_runs_checkpoints(world, capfd, trained):
    folder = world.path / "out" / "checkpoints"
    folder.mkdir(parents=True)
    shutil.copy(trained, folder / "last.ckpt")
    check(world, capfd, fit(world), 2, "holds the checkpoints of an earlier run", "--ckpt_path last")
    assert sorted(p.name for p in folder.iterdir()) == ["last.ckpt"]


# -- end to end, one subprocess ---------------------------------------------------------------------------
@pytest.mark.slow
def test_subprocess_error_is_one_paragraph_with_its_exit_code(world, tmp_path):
    world.freeze()
    res = run_cli(["fit", "--config", SMOKE, "--data.batch_size=0"], cwd=tmp_path)
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().splitlines()[-1] == "error: data.batch_size: 0: must be at least 1; set e.g. " \
                                                  "--data.batch_size=1"
    world.unchanged()


@pytest.mark.parametrize("how", ["--debug", "SCALEVEC_DEBUG"])
def test_debug_shows_the_exception(world, monkeypatch, how):
    from scalevec_lit.cli import main

    monkeypatch.setenv("SCALEVEC_DEBUG", "1" if how == "SCALEVEC_DEBUG" else "0")
    args = fit(world, f"--data.data_dir={world.path / 'nowhere'}") + (["--debug"] if how == "--debug" else [])
    with pytest.raises(FileNotFoundError, match="data.data_dir"):
        main(args)


def test_debug_holds_for_its_command_only(world, monkeypatch, capfd):
    """``--debug`` given to one in-process command leaves the next one's errors as one line: SCALEVEC_DEBUG is
    set for that command only, not for the rest of the process."""
    from scalevec_lit.cli import main

    monkeypatch.delenv("SCALEVEC_DEBUG", raising=False)
    with pytest.raises(FileNotFoundError, match="data.data_dir"):
        main(fit(world, f"--data.data_dir={world.path / 'nowhere'}", "--debug"))
    assert "SCALEVEC_DEBUG" not in os.environ
    check(world, capfd, fit(world, f"--data.data_dir={world.path / 'nowhere'}"), 2, "data.data_dir")


# -- values a run would not use as given: refused, or used and reported in one line -----------------------
def test_a_vocabulary_smaller_than_the_tokenizer_is_refused(world, capfd):
    check(world, capfd, fit(world, "--model.config.vocab_size=1000"), 2,
          "model.config.vocab_size: 1000: is smaller than the vocabulary of the data's tokenizer (4096)",
          "leave it out")


def test_a_larger_vocabulary_is_used_as_given_and_the_saved_config_is_what_ran(world, capfd):
    check(world, capfd, fit(world, "--model.config.vocab_size=4160"), 0,
          "note: model.config.vocab_size: 4160: used as given, 64 rows more than the tokenizer's 4096")
    saved = (world.path / "out" / "smoke" / "version_0" / "config.yaml").read_text()
    assert "vocab_size: 4160" in saved
    ckpt = torch.load(world.path / "out" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["state_dict"]["model.embed.weight"].shape[0] == 4160


def test_a_strategy_recipe_without_its_base_recipe_is_refused(world, capfd):
    check(world, capfd, ["fit", "--config", recipe("strategy", "unified.yaml"), f"--data.data_dir={world.data}",
                         f"--trainer.default_root_dir={world.path / 'out'}"], 2,
          "trainer.max_steps: (not set): no run length", "unified.yaml",
          "--config recipes/smoke.yaml --config")
    assert not (world.path / "out").exists()


def test_a_run_without_a_checkpoint_callback_says_so(world, capfd):
    bare = world.path / "bare.yaml"
    bare.write_text(f"trainer:\n  max_steps: 1\n  logger: false\n  enable_progress_bar: false\n"
                    f"  default_root_dir: {world.path / 'out'}\n  limit_val_batches: 0\n"
                    f"data:\n  data_dir: {world.data}\n  batch_size: 2\nmodel:\n  config: {{seq_len: 32, n_layer: 1, "
                    "n_embd: 32, n_head: 2}\n")
    text = check(world, capfd, ["fit", "--config", bare], 0, "warning: trainer.callbacks: no checkpoint callback")
    assert text.count("no checkpoint callback") == 1
