"""The command line end to end: the smoke run, every recipe's --print_config, subclassing, bad input."""
from __future__ import annotations

import glob
import re
from pathlib import Path

import pytest
import torch

from helpers import ROOT, print_config, recipe, run_cli, scalars, smoke_args


@pytest.mark.slow
def test_smoke_fit_end_to_end(prepared_data, tmp_path):
    res = run_cli(smoke_args(prepared_data, tmp_path, 60, "--trainer.log_every_n_steps=1",
                             "--trainer.val_check_interval=30"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    out = res.stdout + res.stderr
    assert "parameters: 1,836,160 total, 1,152 in scale vectors" in out
    assert "optimizer parameter groups" in out
    logs = scalars(tmp_path)
    loss = [v for _, v in sorted(logs["train/loss"])]
    assert len(loss) == 60
    assert sum(loss[-5:]) / 5 < sum(loss[:5]) / 5 - 1.0, loss  # a clear margin (about 8.3 -> ~5.5)
    val = [v for _, v in sorted(logs["val/loss"])]
    assert len(val) == 2 and val[1] < val[0]
    assert {"val/ppl", "train/tokens", "train/tokens_per_sec", "lr/matrix", "lr/scale"} <= set(logs)
    ckpts = list(tmp_path.rglob("last.ckpt"))
    assert len(ckpts) == 1
    ckpt = torch.load(ckpts[0], map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 60
    assert ckpt["scalevec"]["tokens_seen"] == 60 * 16 * 128
    assert ckpt["scalevec"]["spec"]["config"]["vocab_size"] == 4096


ALL_RECIPES = sorted(str(Path(p).relative_to(ROOT / "recipes")) for p in glob.glob(str(ROOT / "recipes" / "**" / "*.yaml"), recursive=True))


@pytest.mark.parametrize("name", [r for r in ALL_RECIPES if r.count("/") == 0])
def test_print_config_works_for_every_top_level_recipe(name):
    text = print_config("--config", recipe(name))
    assert "model:" in text and "data:" in text and "trainer:" in text


@pytest.mark.parametrize("name", [r for r in ALL_RECIPES if r.count("/") == 1 and not r.startswith("ablation/")])
def test_every_composable_recipe_composes_with_smoke(name):
    text = print_config("--config", recipe("smoke.yaml"), "--config", recipe(name))
    assert "seq_len: 128" in text  # the smoke model is kept; the second file only adds its part


@pytest.mark.slow
def test_subclassed_block_trains_from_yaml(prepared_data, tmp_path):
    res = run_cli(smoke_args(prepared_data, tmp_path, 12, "--config", recipe("examples", "parallel_block.yaml")),
                  cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    ckpt = torch.load(next(tmp_path.rglob("last.ckpt")), map_location="cpu", weights_only=False)
    assert ckpt["scalevec"]["spec"]["block"]["class_path"] == "scalevec_lit.model.block.ParallelBlock"


@pytest.mark.slow
def test_unknown_recipe_key_is_named(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  config:\n    n_layers: 3\n")
    res = run_cli(["fit", "--config", recipe("smoke.yaml"), "--config", str(bad), "--print_config"], cwd=tmp_path)
    assert res.returncode != 0
    assert "unknown key 'model.config.n_layers'; did you mean 'model.config.n_layer'" in res.stderr


@pytest.mark.slow
def test_wrong_value_type_is_named(tmp_path):
    res = run_cli(["fit", "--config", recipe("smoke.yaml"), "--model.config.n_layer=four", "--print_config"], cwd=tmp_path)
    assert res.returncode != 0
    assert "model.config.n_layer" in res.stderr and "four" in res.stderr


@pytest.mark.slow
def test_bad_placement_is_named(tmp_path):
    res = run_cli(["fit", "--config", recipe("smoke.yaml"), "--model.strategy.placement.q=dnpp", "--print_config"],
                  cwd=tmp_path)
    assert res.returncode != 0
    assert "placement.q" in res.stderr and "dnpp" in res.stderr and "dual_norm" in res.stderr


@pytest.mark.slow
def test_missing_data_folder_stops_with_the_fix(tmp_path):
    res = run_cli(smoke_args(tmp_path / "not_prepared", tmp_path, 2), cwd=tmp_path)
    assert res.returncode != 0
    assert "data.data_dir:" in res.stderr and "not_prepared" in res.stderr and "prepare" in res.stderr


def test_model_vocab_smaller_than_tokenizer_is_refused(prepared_data, tmp_path):
    import lightning as L

    from helpers import tiny_config
    from scalevec_lit.data.datamodule import TokenDataModule
    from scalevec_lit.lit.module import CausalLM

    module = CausalLM(tiny_config(vocab_size=1000))
    dm = TokenDataModule(str(prepared_data), seq_len=32, batch_size=2)
    trainer = L.Trainer(max_steps=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        default_root_dir=tmp_path)
    with pytest.raises(ValueError, match=r"model.config.vocab_size: 1000 is smaller than the vocabulary \(4096\)"):
        trainer.fit(module, dm)


@pytest.mark.slow
def test_progress_bar_counts_optimizer_steps_against_max_steps(prepared_data, tmp_path):
    """``step n/max_steps`` (accumulation included), not Lightning's ``Epoch 1/-2``. (A recipe that lists a bar,
    run with ``--trainer.enable_progress_bar=false``, drops it: every GPU recipe in tests/test_global_batch.py.)"""
    res = run_cli(smoke_args(prepared_data, tmp_path, 6, "--trainer.enable_progress_bar=true",
                             "--trainer.accumulate_grad_batches=2", "--trainer.limit_val_batches=0"), cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    bar = (res.stdout + res.stderr).replace("\r", "\n")
    assert re.search(r"^step: 100%.*\| 6/6 ", bar, re.M), bar[-2000:]
    assert "Epoch" not in bar and "/-2" not in bar and " 12/" not in bar  # 12 micro-batches, 6 steps
