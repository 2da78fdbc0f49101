"""``scalevec_lit.checkpoint.open_model`` opens each of the four forms a model comes in (a ``.ckpt``, a
distributed checkpoint folder, a native export folder, a Hugging Face folder read through the adapters) into the
rebuilt model with the spec, the form and what the checkpoint records; ``inspect`` carries that spec and
describes the strategy from it, not from the live model. In process, one tiny model (no transformers needed)."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from test_generate import perturbed, spec_for, tokenizer_record, write_ckpt, write_dcp
from scalevec_lit.checkpoint.forms import OpenedModel, is_hf_folder, open_model
from scalevec_lit.export import hf_layout, save_native, write_safetensors
from scalevec_lit.model.spec import build_from_spec
from scalevec_lit.scale.fold import fold_scales

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def forms(tmp_path_factory):
    """``(model, spec, {form: path})``: one perturbed ``hg`` model written in the four forms."""
    root = tmp_path_factory.mktemp("forms")
    spec = spec_for("hg")
    model = perturbed(spec)
    hf = root / "hf"
    layout = hf_layout(model)
    hf.mkdir()
    write_safetensors(layout.tensors, hf)
    (hf / "config.json").write_text(json.dumps(layout.config))
    save_native(model, root / "native")
    paths = {"ckpt": write_ckpt(model, spec, root / "run.ckpt"), "dcp": write_dcp(model, spec, root / "step.ckpt"),
             "native": root / "native", "hf": hf}
    return model, spec, paths


def _same_weights(a, b) -> list[str]:
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    return [k for k in sa if not torch.equal(sa[k], sb[k])]


@pytest.mark.parametrize("form, kind", [("ckpt", "checkpoint"), ("dcp", "distributed checkpoint"),
                                        ("native", "native folder")])
def test_each_checkpoint_form_opens_into_its_model_spec_and_record(forms, form, kind):
    model, spec, paths = forms
    opened = open_model(paths[form])
    assert isinstance(opened, OpenedModel) and not is_hf_folder(paths[form])
    assert (opened.path, opened.kind, opened.architecture) == (paths[form], kind, None)
    if form == "native":  # save_native writes the spec the model gives, the tokenizer beside it
        assert opened.spec == json.loads((paths[form] / "scalevec_spec.json").read_text())
        assert (opened.extra, opened.tokenizer) == ({}, None)
    else:
        assert opened.spec == spec
        assert opened.tokenizer == tokenizer_record() and opened.extra["spec"] == spec
    assert _same_weights(opened.model, model) == [] and not opened.model.training


def test_a_hugging_face_folder_opens_through_the_adapter_with_the_spec_it_was_built_from(forms):
    model, _, paths = forms
    assert is_hf_folder(paths["hf"])
    opened = open_model(paths["hf"])
    assert (opened.kind, opened.architecture) == ("Hugging Face folder (LlamaForCausalLM)", "LlamaForCausalLM")
    assert (opened.extra, opened.tokenizer) == ({}, None)
    assert opened.spec["strategy"] != forms[1]["strategy"]  # the folded model: one plain γ per norm
    rebuilt = build_from_spec(opened.spec)  # the spec carried builds the same model
    assert [(n, p.shape) for n, p in rebuilt.named_parameters()] == [
        (n, p.shape) for n, p in opened.model.named_parameters()]
    idx = torch.randint(0, model.config.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want = opened.model(idx), fold_scales(model).eval()(idx)
    assert float((got - want).abs().max() / want.abs().max()) <= 64 * torch.finfo(torch.float32).eps


def test_inspect_describes_the_strategy_of_the_spec_it_read_not_of_the_live_model(forms, monkeypatch):
    """The live model's strategy is made to differ from the checkpoint's spec while it is rebuilt: the line
    inspect prints still describes the spec (read once and carried)."""
    import scalevec_lit.checkpoint.rebuild as rebuild
    from scalevec_lit.inspect import load
    from scalevec_lit.inspect.load import describe_strategy, summary_line

    _, spec, paths = forms
    build = rebuild.build_from_spec

    def drifted(s):
        m = build(s)
        m.strategy = dataclasses.replace(m.strategy, branch_specific=not m.strategy.branch_specific)
        return m

    monkeypatch.setattr(rebuild, "build_from_spec", drifted)
    loaded = load(paths["ckpt"])
    assert loaded.model.strategy.branch_specific is not build(spec).strategy.branch_specific  # the patch took
    assert loaded.spec == spec
    assert loaded.strategy == describe_strategy(spec) == "PlainScale, placement all input, branch-specific (HG)"
    assert summary_line(loaded).endswith("; PlainScale, placement all input, branch-specific (HG)")
    assert describe_strategy({"config": {}}) == "unknown strategy"
