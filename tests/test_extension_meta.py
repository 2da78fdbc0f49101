"""User classes and the meta device, and a user scale site in ``convert`` (issue 45, item 3).

The model is first built on the meta device (fit's start-up check that checkpoints rebuild it, a sharded fit,
``--print_plan``, every reader of a checkpoint): a user scale class whose ``__init__`` computes from its argument
(``float(torch.log(torch.tensor(init)))``) trains; one that reads a parameter's value there is refused naming the
class and the rule, not the model's ``build_model``/``init_args``. A user ``ScaleSite`` joins ``convert`` with
``convert_from_``; one without it is refused naming the class and that method. User code: ``tests/extensions/user_sites.py``.
"""
from __future__ import annotations

import math

import pytest
import torch

import scalevec_lit.cli  # noqa: F401  (Lightning's log handlers bind to the session's stderr, not to one test's capture)
from extension_runs import fit_args, tokens
from helpers import main_in_process

VECTOR = "model:\n  strategy:\n    vector:\n      class_path: extensions.user_sites.{}\n      init_args: {{init: 2.0}}\n"
BLOCK = "model:\n  block:\n    class_path: extensions.user_sites.{}\n"
SOFTPLUS = "model:\n  strategy:\n    vector:\n      class_path: extensions.scales.SoftplusScale\n"


def _errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("error:")]


def _fit(capfd, data, root, recipe: str, name: str, steps: int = 1) -> tuple[int, str]:
    path = root.parent / f"{root.name}.yaml"
    path.write_text(recipe)
    return main_in_process(capfd, fit_args(data, root, steps, "--trainer.limit_val_batches=0", "--config", str(path)))


def test_a_scale_class_that_computes_from_its_argument_trains(prepared_data, tmp_path, capfd):
    from scalevec_lit.export import load_model

    code, text = _fit(capfd, prepared_data, tmp_path / "run", VECTOR.format("LogScale"), "log")
    assert code == 0 and _errors(text) == [], text[-3000:]
    model, _ = load_model(tmp_path / "run" / "checkpoints" / "last.ckpt")  # rebuilt on the meta device too
    vectors = [m for m in model.modules() if type(m).__name__ == "LogScale"]
    assert vectors and all(v.log_init == pytest.approx(math.log(2.0)) for v in vectors)
    assert not any(p.is_meta for p in model.parameters())


def test_a_scale_class_that_reads_a_parameter_value_is_named_with_the_rule(prepared_data, tmp_path, capfd):
    code, text = _fit(capfd, prepared_data, tmp_path / "run", VECTOR.format("PeekScale"), "peek")
    assert code == 2, text[-3000:]
    assert _errors(text) == [
        "error: extensions.user_sites.PeekScale: RuntimeError: Tensor.item() cannot be called on meta tensors: cannot "
        "be built on the meta device; the model is first built on the meta device, where tensors have shapes but no "
        "values: in __init__, compute numbers with math (math.log(init)) or from tensors made of one Python number "
        "(torch.tensor(init)), and never read the value of a parameter or of a tensor made with a shape (torch.zeros, "
        "torch.full, ...) (docs/subclassing.md)"], text[-3000:]
    assert "build_model" not in text and "Traceback" not in text
    assert not list(tmp_path.rglob("*.ckpt"))


def test_a_user_scale_site_with_convert_from_converts_exactly(prepared_data, tmp_path, capfd):
    from scalevec_lit.export import load_model

    code, text = _fit(capfd, prepared_data, tmp_path / "run", BLOCK.format("ResidualGainBlock"), "gain", steps=2)
    assert code == 0, text[-3000:]
    (tmp_path / "softplus.yaml").write_text(SOFTPLUS)
    out = tmp_path / "conv"
    code, text = main_in_process(capfd, ["convert", "--ckpt", tmp_path / "run" / "checkpoints" / "last.ckpt",
                                         "--strategy", tmp_path / "softplus.yaml", "--out", out])
    assert code == 0 and _errors(text) == [], text[-3000:]
    trained, _ = load_model(tmp_path / "run" / "checkpoints" / "last.ckpt")
    converted, _ = load_model(out)
    gains = [m for m in converted.modules() if type(m).__name__ == "ResidualScale"]
    assert len(gains) == 4 and all(type(g.scale).__name__ == "SoftplusScale" for g in gains)
    idx = tokens(converted)
    with torch.no_grad():
        a, b = trained.double()(idx), converted.double()(idx)
    torch.testing.assert_close(b, a, rtol=0, atol=16 * torch.finfo(torch.float32).eps * a.abs().max().item())


def test_a_user_scale_site_without_convert_from_is_refused_naming_the_method(prepared_data, tmp_path, capfd):
    code, text = _fit(capfd, prepared_data, tmp_path / "run", BLOCK.format("ResidualGainNoConvertBlock"), "nc")
    assert code == 0, text[-3000:]
    (tmp_path / "softplus.yaml").write_text(SOFTPLUS)
    out = tmp_path / "conv"
    code, text = main_in_process(capfd, ["convert", "--ckpt", tmp_path / "run" / "checkpoints" / "last.ckpt",
                                         "--strategy", tmp_path / "softplus.yaml", "--out", out])
    assert code == 2, text[-3000:]
    assert _errors(text) == [
        "error: blocks.0.attn_gain: extensions.user_sites.ResidualScaleNoConvert: a scale site the conversion does "
        "not know (it has no convert_from_ method); give the class the method convert_from_(self, source) -> "
        "list[str] that sets its parameters from the same site of the source model (another strategy) and returns "
        "what it could not keep (`return copy_scales_(self, source)` from scalevec_lit.scale.convert when the site "
        "only multiplies by its vectors' γ; docs/subclassing.md)"], text[-3000:]
    assert not out.exists()
