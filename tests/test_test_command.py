"""``test``: the held-out loss of a checkpoint on the val split of a prepared folder, computed as ``validate``
computes it (the same batches, the same token-weighted mean) and logged as ``test/loss``, ``test/ppl`` and, with
several folders, ``test/<name>/loss``. A test set is prepared into a folder of its own and given with
``--data.data_dir``; prepared folders hold only train and val splits, so ``test`` reads the val split.

The losses are compared exactly: both commands run the same forward passes on the same batches, in the same
order, on one CPU process, and sum them into the same metric, so any difference is a bug, not rounding."""
from __future__ import annotations

from pathlib import Path

import pytest

import scalevec_lit.cli  # noqa: F401 - Lightning imported before output is captured (see test_bad_input.py)
from helpers import SMOKE, main_in_process, scalars, smoke_args

pytestmark = pytest.mark.usefixtures("one_thread")

BATCHES = 3  # both commands read the same first batches of the val split


@pytest.fixture(scope="module")
def ckpt(prepared_data, tmp_path_factory) -> Path:
    """A 2-step fit of the smoke recipe on the embedded corpus: its last checkpoint."""
    from scalevec_lit.cli import main

    root = tmp_path_factory.mktemp("fit")
    main(smoke_args(prepared_data, root, 2))
    return next(root.rglob("last.ckpt"))


def _run(capfd, command: str, ckpt: Path, out: Path, *data: Path) -> tuple[dict[str, float], str]:
    """``command`` (validate or test) of ``ckpt`` on ``data``: its exit code checked, its logged scalars."""
    data_dir = str(data[0]) if len(data) == 1 else "[" + ", ".join(map(str, data)) + "]"
    code, text = main_in_process(capfd, [
        command, "--config", SMOKE, f"--data.data_dir={data_dir}", f"--ckpt_path={ckpt}",
        f"--trainer.default_root_dir={out}", f"--trainer.logger.init_args.save_dir={out}",
        f"--trainer.limit_val_batches={BATCHES}", f"--trainer.limit_test_batches={BATCHES}",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
    ])
    assert code == 0, text
    return {tag: values[-1][1] for tag, values in scalars(out).items()}, text


def test_test_logs_the_validation_loss_of_the_checkpoint(ckpt, prepared_data, tmp_path, capfd):
    val, _ = _run(capfd, "validate", ckpt, tmp_path / "validate", prepared_data)
    test, text = _run(capfd, "test", ckpt, tmp_path / "test", prepared_data)
    assert "No test_step()" not in text
    assert 0 < val["val/loss"] < 20
    assert test["test/loss"] == val["val/loss"]
    assert test["test/ppl"] == val["val/ppl"]
    assert not any(tag.startswith("val/") for tag in test), sorted(test)


def test_test_logs_each_source_as_validation_does(ckpt, prepared_data, tmp_path, capfd):
    # the same folder twice: two sources, named after their folders (shakespeare, shakespeare_2)
    val, _ = _run(capfd, "validate", ckpt, tmp_path / "validate", prepared_data, prepared_data)
    test, _ = _run(capfd, "test", ckpt, tmp_path / "test", prepared_data, prepared_data)
    for name in ("shakespeare", "shakespeare_2"):
        assert test[f"test/{name}/loss"] == val[f"val/{name}/loss"]
        assert test[f"test/{name}/ppl"] == val[f"val/{name}/ppl"]
    assert test["test/loss"] == val["val/loss"]
