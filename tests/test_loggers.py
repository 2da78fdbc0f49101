"""Every figure to every Lightning logger (callbacks/_log_sinks.py) and every logger's files read back
(scalevec_lit/study/metrics_readers.py): one tiny MoE fit with TensorBoard, CSV, MLflow (a file store in
tmp) and W&B (offline, in tmp) at once; what each wrote is compared with the values the fit had."""
from __future__ import annotations

import io
import json
import os
import struct
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from helpers import tiny_config
from scalevec_lit.callbacks import MoELoadMonitor, ScaleVectorMonitor
from scalevec_lit.callbacks._log_sinks import HIST_BINS, Histogram, log_to_loggers
from scalevec_lit.study.events import read_scalars
from scalevec_lit.study.metrics_readers import read_csv, read_mlflow, read_wandb, wandb_history, wandb_records

SCALE = "scale/input/final/shared/final/scale"  # the histogram checked: the final norm's γ
MOE = "moe/layer01/fraction"
HEATMAP = "scale/input/heatmap"
STEPS = 2


def _png(data: bytes | Path) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data) if isinstance(data, bytes) else data).convert("RGB"))


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """One fit, four loggers; what the fit had at its last log (step 2): the γ, the MoE shares, the heatmap."""
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    import lightning as L
    from lightning.pytorch.callbacks import Callback
    from lightning.pytorch.loggers import CSVLogger, MLFlowLogger, TensorBoardLogger, WandbLogger

    from scalevec_lit.lit.module import CausalLM
    from scalevec_lit.lit.schedules import Constant
    from scalevec_lit.model import MoEConfig
    from scalevec_lit.scale.registry import scale_parameters
    from scalevec_lit.scale.strategy import ScaleStrategy

    root = tmp_path_factory.mktemp("loggers")
    env = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "MLFLOW_ALLOW_FILE_STORE": "true"}
    env.update({k: str(root / "wandb_home") for k in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR",
                                                      "WANDB_DATA_DIR")})
    scale_monitor = ScaleVectorMonitor(every_n_steps=2, histogram_every_n_steps=2)
    want: dict = {}

    class Record(Callback):  # after the monitors, at the last log: what they logged
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if trainer.global_step == STEPS:
                gamma = next(sp.param for sp in scale_parameters(pl_module.model) if SCALE.endswith(sp.info.tag))
                want["gamma"] = gamma.detach().float().numpy().copy()
                layers = dict(MoELoadMonitor.layer_stats(pl_module))
                want["fraction"] = layers[1]["fraction"].float().numpy().copy()
                rows, cols, panels = scale_monitor.collect(pl_module.model).heatmaps["input"]
                want["heatmap"] = scale_monitor.render_heatmap("input", rows, cols, panels, STEPS)

    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        torch.manual_seed(0)
        cfg = tiny_config(vocab_size=128, moe=MoEConfig(num_experts=4, top_k=2, expert_intermediate_size=64))
        lm = CausalLM(config=cfg, strategy=ScaleStrategy(), optimizer=partial(torch.optim.AdamW, lr=0.02),
                      schedule=Constant())
        loggers = [TensorBoardLogger(str(root), name="tb", version=0), CSVLogger(str(root), name="csv", version=0),
                   MLFlowLogger(experiment_name="t", tracking_uri=(root / "mlruns").as_uri()),
                   WandbLogger(save_dir=str(root), project="t", offline=True)]
        trainer = L.Trainer(accelerator="cpu", devices=1, max_steps=STEPS, logger=loggers, log_every_n_steps=1,
                            callbacks=[scale_monitor, MoELoadMonitor(every_n_steps=2, histograms=True), Record()],
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            val_check_interval=STEPS, limit_val_batches=1, num_sanity_val_steps=0)
        data = torch.randint(0, 128, (16, 33))
        trainer.fit(lm, train_dataloaders=DataLoader(data, batch_size=4),
                    val_dataloaders=DataLoader(data[:4], batch_size=4))
        import wandb

        wandb.finish()
    return root, want


pytestmark = pytest.mark.slow  # the fit starts W&B's service process


def _hist(values) -> Histogram:
    h = Histogram.of(values)
    assert h.counts.sum() == np.asarray(values).size and len(h.counts) == HIST_BINS
    return h


def test_tensorboard_keeps_its_tags_and_gets_the_values(logged):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    root, want = logged
    (events,) = (root / "tb").rglob("events.out.tfevents.*")
    acc = EventAccumulator(str(events), size_guidance={"scalars": 0, "histograms": 0, "images": 0})
    acc.Reload()
    assert {SCALE, MOE} <= set(acc.Tags()["histograms"])
    for tag, values in ((SCALE, want["gamma"]), (MOE, want["fraction"])):
        last = acc.Histograms(tag)[-1]
        assert last.step == STEPS
        assert (last.histogram_value.num, last.histogram_value.min, last.histogram_value.max) == (
            values.size, float(values.min()), float(values.max()))
    assert [e.step for e in acc.Images(HEATMAP)] == [0, STEPS]
    assert np.array_equal(_png(acc.Images(HEATMAP)[-1].encoded_image_string), want["heatmap"])


def test_wandb_offline_run_holds_histograms_and_the_image(logged):
    root, want = logged
    (run_file,) = (root / "wandb").rglob("run-*.wandb")
    rows = [values for step, values in wandb_history(run_file) if step == STEPS]
    found = {tag: value for row in rows for tag, value in row.items()}
    for tag, values in ((SCALE, want["gamma"]), (MOE, want["fraction"])):
        h = _hist(values)
        assert found[tag]["_type"] == "histogram"
        assert found[tag]["values"] == h.counts.tolist() and found[tag]["bins"] == h.edges.tolist()
    image = found[HEATMAP]
    assert image["_type"] == "image-file"
    assert np.array_equal(_png(run_file.parent / "files" / image["path"]), want["heatmap"])


def test_mlflow_file_store_holds_histograms_and_images(logged):
    root, want = logged
    (run,) = [m.parent for m in (root / "mlruns").rglob("meta.yaml") if (m.parent / "metrics").is_dir()]
    art = run / "artifacts"
    for tag, values in ((SCALE, want["gamma"]), (MOE, want["fraction"])):
        saved = json.loads((art / "histograms" / tag / f"step_{STEPS:08d}.json").read_text())
        assert saved == {**_hist(values).as_dict(), "nonfinite": 0}
    images = {p.name.split("+")[0]: p for p in (art / "images").glob(f"*+step+{STEPS}+*.png")}
    assert {HEATMAP.replace("/", "~"), SCALE.replace("/", "~"), MOE.replace("/", "~")} <= set(images)
    assert np.array_equal(_png(images[HEATMAP.replace("/", "~")]), want["heatmap"])


def test_csv_logger_gets_scalars_and_figures_beside_them(logged):
    root, want = logged
    log_dir = root / "csv" / "version_0"
    assert (log_dir / "metrics.csv").is_file()
    for tag, values in ((SCALE, want["gamma"]), (MOE, want["fraction"])):
        figure = log_dir / "figures" / tag
        assert json.loads((figure / f"step_{STEPS:08d}.json").read_text()) == _hist(values).as_dict()
        assert _png(figure / f"step_{STEPS:08d}.png").shape[2] == 3
    assert sorted(p.name for p in (log_dir / "figures" / HEATMAP).iterdir()) == ["step_00000000.png",
                                                                                "step_00000002.png"]
    assert np.array_equal(_png(log_dir / "figures" / HEATMAP / f"step_{STEPS:08d}.png"), want["heatmap"])


def test_study_reads_every_loggers_scalars_alike(logged):
    """``read_scalars`` (what ``study run`` and ``study report`` read) gets the same series from each logger's
    files: exactly the same from CSV, MLflow and W&B (all float64 text), TensorBoard's to float32."""
    root, want = logged
    csv_, mlflow_, wandb_ = (read_scalars(root / d) for d in ("csv", "mlruns", "wandb"))
    tb = read_scalars(root / "tb")
    assert set(csv_) == set(mlflow_) == set(wandb_) == set(tb)
    assert {"val/loss", "train/loss", f"{SCALE}/mean", "moe/layer01/load_max_over_mean"} <= set(csv_)
    for tag in csv_:
        assert csv_[tag] == mlflow_[tag] == wandb_[tag], tag
        assert [s for s, _ in tb[tag]] == [s for s, _ in csv_[tag]], tag
        assert [v for _, v in tb[tag]] == pytest.approx([v for _, v in csv_[tag]], rel=2 ** -23, abs=1e-30), tag
    assert csv_[f"{SCALE}/mean"][-1] == (STEPS, pytest.approx(float(want["gamma"].astype(np.float64).mean()),
                                                              rel=1e-6))
    assert read_csv(root / "csv", ("val/",)).keys() == {"val/loss", "val/ppl"}
    assert read_mlflow(root / "mlruns", ("val/loss",)) == {"val/loss": dict(csv_["val/loss"])}
    assert read_wandb(root / "wandb", ("val/loss",)) == {"val/loss": dict(csv_["val/loss"])}
