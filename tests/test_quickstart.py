"""The README's Quick start, run in the order shown on a fresh copy, and the one-folder-per-run rule
(``scalevec_lit/lit/runfolder.py``) that lets its second ``fit`` run after the first."""
from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from jsonargparse import Namespace

from helpers import ROOT

from scalevec_lit.lit import runfolder


# -- the folder rule, on a parsed config (no training) -------------------------------------------------------
def _config(*configs: str, root=None, name="smoke", version=None, ckpt_path=None, logger=True) -> Namespace:
    args = Namespace(save_dir="runs", name=name, version=version)
    tb = Namespace(class_path="lightning.pytorch.loggers.TensorBoardLogger", init_args=args)
    return Namespace(config=[Path(c) for c in configs], ckpt_path=ckpt_path,
                     trainer=Namespace(default_root_dir=root, logger=tb if logger else False))


@pytest.fixture()
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for key in ("WORLD_SIZE", "SLURM_NTASKS", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv(runfolder.ENV, "")  # a run sets it for the processes it starts: undone after the test
    return tmp_path


def test_each_fresh_run_gets_the_next_version_of_its_recipe_and_strategy(in_tmp):
    first, second = _config("recipes/smoke.yaml"), _config("recipes/smoke.yaml")
    assert runfolder.resolve_run_folder(first, "fit") == Path("runs/smoke/version_0")
    assert runfolder.resolve_run_folder(second, "fit") == Path("runs/smoke/version_1")
    unified = _config("recipes/smoke.yaml", "recipes/strategy/unified.yaml")
    assert runfolder.resolve_run_folder(unified, "fit") == Path("runs/smoke/unified/version_0")
    # the logger writes into the same folder: save_dir/name/version_N
    args = unified.trainer.logger.init_args
    assert (args.save_dir, args.name, args.version) == ("runs/smoke", "unified", 0)
    assert unified.trainer.default_root_dir == "runs/smoke/unified/version_0"


def test_without_a_logger_name_the_first_config_names_the_recipe(in_tmp):
    cfg = _config("my/recipe.yaml", "recipes/optim/muon_wsd.yaml", name="lightning_logs")
    assert runfolder.resolve_run_folder(cfg, "fit") == Path("runs/recipe/muon_wsd/version_0")
    assert runfolder.resolve_run_folder(_config("a.yaml", logger=False), "fit") == Path("runs/a/version_0")


def test_ckpt_path_last_resumes_the_newest_version_holding_a_checkpoint(in_tmp):
    for n in range(3):
        (in_tmp / f"runs/smoke/version_{n}").mkdir(parents=True)
    (in_tmp / "runs/smoke/version_1/checkpoints").mkdir()
    (in_tmp / "runs/smoke/version_1/checkpoints/last.ckpt").write_bytes(b"")
    (in_tmp / "runs/smoke/version_2/checkpoints").mkdir()  # a run stopped before its first checkpoint
    (in_tmp / "runs/smoke/version_2/checkpoints/nonfinite.ckpt").write_bytes(b"")  # never a resume point
    cfg = _config("recipes/smoke.yaml", ckpt_path="last")
    assert runfolder.resolve_run_folder(cfg, "fit") == Path("runs/smoke/version_1")
    assert cfg.trainer.logger.init_args.version == 1
    # nothing of that strategy to resume: a new version of it, as Lightning starts afresh
    other = _config("recipes/smoke.yaml", "recipes/strategy/unified.yaml", ckpt_path="last")
    assert runfolder.resolve_run_folder(other, "fit") == Path("runs/smoke/unified/version_0")
    # a fresh run never reuses a number, even an empty folder's
    assert runfolder.resolve_run_folder(_config("recipes/smoke.yaml"), "fit") == Path("runs/smoke/version_3")


def test_an_explicit_folder_or_version_keeps_full_control(in_tmp):
    cfg = _config("recipes/smoke.yaml", root="elsewhere")
    assert runfolder.resolve_run_folder(cfg, "fit") is None
    assert cfg.trainer.default_root_dir == "elsewhere" and cfg.trainer.logger.init_args.version is None
    assert not (in_tmp / "runs").exists()
    named = _config("recipes/smoke.yaml", version="try3")
    assert runfolder.resolve_run_folder(named, "fit") == Path("runs/smoke/try3")


def test_ranks_started_together_share_the_stable_folder(in_tmp, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "8")
    cfg = _config("recipes/dense_1b.yaml", "recipes/strategy/unified.yaml", name="dense_1b", ckpt_path="last")
    assert runfolder.resolve_run_folder(cfg, "fit") == Path("runs/dense_1b/unified")
    assert cfg.trainer.logger.init_args.version is None  # the logger numbers its own versions inside it
    assert not (in_tmp / "runs").exists()  # nothing claimed before the ranks can talk


def test_processes_lightning_starts_reuse_their_parents_folder(in_tmp, monkeypatch):
    import os

    parent = _config("recipes/smoke.yaml")
    folder = runfolder.resolve_run_folder(parent, "fit")
    monkeypatch.setenv(runfolder.ENV, f"{os.getppid()}:{folder}")  # as a child of this process would see it
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert runfolder.resolve_run_folder(_config("recipes/smoke.yaml"), "fit") == folder
    monkeypatch.setenv(runfolder.ENV, f"{os.getppid() + 1}:{folder}")  # set by another process: not ours
    monkeypatch.delenv("WORLD_SIZE")
    assert runfolder.resolve_run_folder(_config("recipes/smoke.yaml"), "fit") == Path("runs/smoke/version_1")



def test_a_run_that_wrote_nothing_leaves_no_folder(in_tmp):
    (in_tmp / "runs").mkdir()
    folder = runfolder.resolve_run_folder(_config("recipes/smoke.yaml", "recipes/strategy/hg.yaml"), "fit")
    assert folder == Path("runs/smoke/hg/version_0") and folder.is_dir()
    runfolder.release_unused()  # the command was refused after the folder was chosen
    assert sorted(p.name for p in (in_tmp / "runs").iterdir()) == []  # runs/ was there before: it stays
    kept = runfolder.resolve_run_folder(_config("recipes/smoke.yaml"), "fit")
    (kept / "config.yaml").write_text("trainer: {}\n")
    runfolder.release_unused()
    assert kept.is_dir() and runfolder.resolve_run_folder(_config("recipes/smoke.yaml"), "fit").name == "version_1"

# -- the Quick start, run in the order shown -------------------------------------------------------------
FAST = ["--trainer.max_steps=2", "--trainer.limit_val_batches=0", "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false"]  # the README says every fit takes --trainer.max_steps=N


def quickstart_commands() -> list[list[str]]:
    """The commands of the README's Quick start fences, in order (comments dropped)."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("\n## Quick start\n"):]
    section = section[:section.index("\n## ", 1)]
    commands, fence = [], False
    for line in section.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif fence and line.strip():
            commands.append(shlex.split(line, comments=True))
    return commands


def make_recipe(target: str, seen=()) -> list[list[str]]:
    """The ``$(BIN)/python ...`` lines ``make <target>`` runs, prerequisites first (the venv is this one)."""
    makefile = (ROOT / "Makefile").read_text()
    head, _, rest = makefile.partition(f"\n{target}:")
    assert rest, f"the Makefile has no target {target!r}"
    deps, *lines = rest.split("\n")
    body = []
    for line in lines:
        if not line.startswith("\t"):
            break
        body.append(line.strip())
    out = []
    for dep in deps.split():
        if not dep.startswith("$(") and dep not in seen:
            out += make_recipe(dep, (*seen, target))
    return out + [shlex.split(line)[1:] for line in body if line.startswith("$(BIN)/python -m scalevec_lit")]


def _run(capfd, argv: list[str]) -> str:
    from helpers import main_in_process

    code, text = main_in_process(capfd, argv[2:] if argv[:2] == ["-m", "scalevec_lit"] else argv)
    assert code == 0, (argv, text[-3000:])
    return text


def test_the_quick_start_runs_in_the_order_shown(tmp_path, monkeypatch, capfd, prepared_data):
    import shutil

    import torch

    shutil.copytree(ROOT / "recipes", tmp_path / "recipes")
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "data" / "prepared").mkdir(parents=True)
    (tmp_path / "data" / "prepared" / "shakespeare").symlink_to(prepared_data, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    for key in ("WORLD_SIZE", "SLURM_NTASKS", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv(runfolder.ENV, "")
    commands = quickstart_commands()
    assert commands[:2] == [["make", "fit"], ["make", "test"]]
    readme = (ROOT / "README.md").read_text()
    ran = []
    for words in commands:
        if words[:2] == ["make", "fit"]:
            for argv in make_recipe("fit"):
                extra = FAST if argv[2] == "fit" else []
                text = _run(capfd, argv + extra)
                if argv[2] == "fit":
                    printed = next(line for line in text.splitlines() if line.startswith("run folder: "))
                    assert " ".join(printed.split()) in " ".join(readme.split())  # the line the README quotes
            assert (tmp_path / "runs/smoke/version_0/checkpoints/last.ckpt").is_file()
        elif words[:3] == ["python", "-m", "scalevec_lit"] and words[3] == "fit":
            _run(capfd, words[1:] + FAST)
        elif words[:3] == ["python", "-m", "scalevec_lit"] and words[3] == "generate":
            ckpt = Path(words[words.index("--ckpt") + 1])
            assert ckpt.is_file(), f"the Quick start's generate reads {ckpt}, which the fits above did not write"
            text = _run(capfd, words[1:] + ["--max-new-tokens", "4", "--device", "cpu"])
            assert "ROMEO:" in text
        else:
            assert words[0] in ("make", "source", "tensorboard"), words  # set-up, the test suite, a viewer
            continue
        ran.append(words[:4])
    assert ran == [["make", "fit"], ["python", "-m", "scalevec_lit", "fit"], ["python", "-m", "scalevec_lit", "generate"]]
    # the second fit ran beside the first, each in its own folder with its events and config
    for run in ("runs/smoke/version_0", "runs/smoke/unified/version_0"):
        assert (tmp_path / run / "config.yaml").is_file() and list((tmp_path / run).glob("events.out.tfevents.*"))
    assert torch.load(tmp_path / "runs/smoke/unified/version_0/checkpoints/last.ckpt", map_location="cpu",
                      weights_only=False)["global_step"] == 2
    # "the same command with --ckpt_path last resumes it": the newest smoke run, two steps further
    fit = next(argv for argv in make_recipe("fit") if argv[2] == "fit")
    text = _run(capfd, fit + FAST + ["--trainer.max_steps=4", "--ckpt_path", "last"])
    assert "run folder: runs/smoke/version_0 (resuming its newest checkpoint)" in text
    assert torch.load(tmp_path / "runs/smoke/version_0/checkpoints/last.ckpt", map_location="cpu",
                      weights_only=False)["global_step"] == 4
    assert sorted(p.name for p in (tmp_path / "runs/smoke").iterdir()) == ["unified", "version_0"]
