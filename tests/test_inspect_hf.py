"""``inspect`` on Hugging Face models: tiny transformers models of every architecture import reads (Llama, Qwen3,
Qwen3-MoE, Mixtral) saved with ``save_pretrained``, checked against their own tensors by name; and the other
folders a checkpoint becomes (distributed checkpoint, native export, HF export), with ``--compare`` before and
after export. Tolerances as in ``test_inspect.py`` (REL).
"""
from __future__ import annotations

import importlib.util

import pytest
import torch

from test_generate import perturbed, spec_for, write_ckpt
from test_inspect import REL, assert_fold_targets, close, column_sq, direct_stats, run_main
from scalevec_lit.inspect import load, rows_of

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
HF_ARCHS = ["LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM"]


# -- tiny transformers models, read as import reads them --------------------------------------------------------
@pytest.fixture(scope="module")
def hf_models(tmp_path_factory):
    """``{architecture: (transformers model, saved folder)}`` for the four architectures import reads."""
    from test_import import save, tiny_hf

    root = tmp_path_factory.mktemp("hf")
    return {arch: (model, save(model, root / arch)) for arch in HF_ARCHS for model in [tiny_hf(arch)]}


def hf_expected(model) -> dict[tuple, tuple[torch.Tensor, list[torch.Tensor]]]:
    """``(layer, site, branch, role)`` → (the HF norm weight, the HF weights whose columns read it), by HF name."""
    params = dict(model.named_parameters())
    out = {(-1, "final", "shared", "input"): (params["model.norm.weight"], [params["lm_head.weight"]])}
    for i in range(model.config.num_hidden_layers):
        p = f"model.layers.{i}."
        attn = [params[f"{p}self_attn.{x}_proj.weight"] for x in "qkv"]
        mlp = [w for n, w in params.items() if n.startswith(f"{p}mlp.") and "down" not in n]
        out[(i, "attn_input", "shared", "input")] = (params[f"{p}input_layernorm.weight"], attn)
        out[(i, "mlp_input", "shared", "input")] = (params[f"{p}post_attention_layernorm.weight"], mlp)
        for b in "qk":
            if f"{p}self_attn.{b}_norm.weight" in params:
                out[(i, "attn_proj", b, "output")] = (params[f"{p}self_attn.{b}_norm.weight"], [])
    return out


@pytest.mark.parametrize("arch", HF_ARCHS)
def test_hf_model_roles_statistics_conservation_and_folds(arch, hf_models):
    model, folder = hf_models[arch]
    loaded = load(folder)
    assert loaded.kind == f"Hugging Face folder ({arch})"
    rows = {r.view.key: r for r in rows_of(loaded.model)}
    expected = hf_expected(model)
    assert set(rows) == set(expected)  # every HF norm, with the role the library gives it, and nothing else
    qk_norm = arch.startswith("Qwen3")
    assert any(k[1] == "attn_proj" for k in rows) == qk_norm
    for key, (weight, readers) in expected.items():
        row = rows[key]
        want = direct_stats(weight)
        for name, value in want.items():
            assert close(row.stats[name], value), (arch, key, name)
        if key[3] == "output":
            assert not row.view.folds and row.conserved is None and "QK-norm" in row.view.reason
            assert row.gamma.numel() == weight.numel() == loaded.model.config.head_dim  # one per head dimension
            continue
        assert row.view.folds
        expect = sum(column_sq(w) for w in readers) - weight.detach().double().square()
        assert torch.allclose(row.conserved, expect, rtol=0, atol=REL * float(expect.abs().max())), (arch, key)
    moe_layers = {k[0] for k, r in rows.items() if any(t.weight.endswith("router.weight") for t in r.view.targets)}
    want_moe = {0, 1} if arch == "MixtralForCausalLM" else {1, 2} if arch == "Qwen3MoeForCausalLM" else set()
    assert moe_layers == want_moe  # Qwen3-MoE's mlp_only_layers=[0] is a dense MLP
    assert_fold_targets(loaded.model, list(rows.values()))




def test_reads_distributed_native_and_exported_folders_and_compares_before_and_after_export(tmp_path):
    from test_generate import write_dcp
    from scalevec_lit.export import export

    spec = spec_for("qk_norm", moe=True)
    model = perturbed(spec)
    ckpt = write_ckpt(model, spec, tmp_path / "run.ckpt")
    want = [(r.view.key, r.gamma) for r in rows_of(model)]
    dcp = load(write_dcp(model, spec, tmp_path / "step.ckpt"))
    export(ckpt, tmp_path / "native", format="native")
    nat = load(tmp_path / "native")
    assert (dcp.kind, nat.kind) == ("distributed checkpoint", "native folder")
    for loaded in (dcp, nat):
        got = [(r.view.key, r.gamma) for r in rows_of(loaded.model)]
        assert [k for k, _ in got] == [k for k, _ in want]
        assert all(torch.equal(g, w) for (_, g), (_, w) in zip(got, want))
    assert export(ckpt, tmp_path / "hf").architecture == "Qwen3MoeForCausalLM"
    code, out, err = run_main([str(ckpt), "--compare", str(tmp_path / "hf")])
    assert code == 0, err
    lines = [line.split() for line in out.splitlines() if line.startswith(("layer", "final")) and "site" not in line]
    # after export every input-role γ is folded away (γ ≡ 1 in the HF folder); the QK-norm weights are the same
    assert {line[2] for line in lines if line[1] == "attn_proj"} == {"q", "k"}
    for line in lines:
        if line[1] == "attn_proj":
            assert line[6] == "0" and line[13] == "0", line  # Δmean, max|Δγ|
        else:
            assert line[5] == "1" and line[8] == "1", line  # mean B, RMS B
