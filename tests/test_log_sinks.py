"""callbacks/_log_sinks.py without a trainer: CSV loggers get the figures as files beside metrics.csv, a log's
histograms are binned and drawn once whatever the number of loggers that take pictures."""
from __future__ import annotations

import json

import numpy as np

from scalevec_lit.callbacks import _monitor_figures
from scalevec_lit.callbacks._log_sinks import Histogram, log_to_loggers, sink_for


def test_two_csv_loggers_share_one_drawing_and_get_the_same_files(tmp_path, monkeypatch):
    from lightning.pytorch.loggers import CSVLogger

    drawn = []
    real = _monitor_figures.histogram_image

    def counting(tag, counts, edges, step):
        drawn.append(tag)
        return real(tag, counts, edges, step)

    monkeypatch.setattr(_monitor_figures, "histogram_image", counting)
    values = np.array([0.5, 1.0, 1.0, 2.0, np.nan])
    image = np.zeros((4, 6, 3), np.uint8)
    image[1, 2] = (255, 0, 0)
    loggers = [CSVLogger(str(tmp_path), name="a", version=0), CSVLogger(str(tmp_path), name="b", version=0)]
    log_to_loggers(loggers, 3, {"x/y": 1.5}, {"h/one": values}, {"i/map": image})
    assert drawn == ["h/one"]
    want = Histogram.of(values).as_dict()
    assert want["nonfinite"] == 1 and sum(want["counts"]) == 4
    for logger in loggers:
        logger.save()
        folder = tmp_path / logger.name / "version_0"
        assert json.loads((folder / "figures" / "h" / "one" / "step_00000003.json").read_text()) == want
        from PIL import Image

        assert np.array_equal(np.asarray(Image.open(folder / "figures" / "i" / "map" / "step_00000003.png")), image)
        assert (folder / "metrics.csv").read_text().splitlines() == ["step,x/y", "3,1.5"]
    single = CSVLogger(str(tmp_path), name="c", version=0)  # a sink used alone bins and draws for itself
    sink_for(single).write(4, {}, {"h/one": values}, {})
    written = tmp_path / "c" / "version_0" / "figures" / "h" / "one" / "step_00000004.json"
    assert json.loads(written.read_text()) == want
