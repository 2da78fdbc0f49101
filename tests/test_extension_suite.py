"""The extension suite: user-style extensions (``tests/extensions/``, a package outside the library, chosen by
the YAML recipes beside it) through every command, as a user would run them.

Extensions (``EXTENSIONS``): the shipped one-norm parallel block chosen from YAML; a sandwich-norm block with
``OutputNorm`` sites and the same block written with ``nn.RMSNorm``; a block overriding ``build_mlp`` (an MLP of
its own composing a ``NormSite``) and two overriding ``build_attention`` (an attention of its own: no scale site,
no cache; a ``CausalSelfAttention`` subclass that bypasses the cache); a ``CausalLM`` subclass overriding
``build_model`` without new parameters (``SoftCapLM``) and one with a parameter (``TemperatureLM``); a block with
``init_args`` (``ResidualScaleBlock``); two new parameterizations (``SoftplusScale`` with an inverse,
``TanhScale`` without one). Each is fitted once per session (2 steps, in-process, shared with the other
extension test files); then: the count printed and the norm report, the
monitor's tags, the decay groups, ``export`` (exact, or refused by name), ``convert`` to the same strategy (a
copy), resume, the ``generate`` command and the Python ``generate()``. One fit runs as ``python -m scalevec_lit``
in a process of its own, with the user package on ``PYTHONPATH`` only. Conversion to another strategy and the
single cases are in ``tests/test_extension_cases.py`` (the shared runs: ``tests/extension_runs.py``);
``docs/internals/extensions.md`` names the tests of each statement of ``docs/subclassing.md``.
"""
from __future__ import annotations

import pytest
import torch

from extension_runs import (BASELINE, EXT, EXTENSIONS, SAME_STRATEGY, assert_same_function, fit_args, fitted, recipe,
                            tokens)
from helpers import ROOT, main_in_process, run_cli, scalars

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(params=list(EXTENSIONS))
def run(request, prepared_data, tmp_path_factory):
    return fitted(request.param, prepared_data, tmp_path_factory)


# -- fit ----------------------------------------------------------------------------------------------------
def test_fit_counts_the_model_built_and_reports_norm_gains_that_are_not_scale_vectors(run):
    from scalevec_lit.lit.norm_report import describe_unregistered
    from scalevec_lit.model.transformer import count_parameters
    from scalevec_lit.scale import scale_parameters

    model = run["model"]
    assert f"{type(model).__name__}: {count_parameters(model).summary()}" in run["lines"]
    report = [line for line in run["stderr"].splitlines() if line.startswith("warning: norm gains")]
    if run["name"] == "plain_norm":
        names = [(f"blocks.{i}.{s}_post.weight", "RMSNorm") for i in range(2) for s in ("attn", "mlp")]
        assert report == [f"warning: {describe_unregistered(names)}"]
        assert "blocks.*.attn_post.weight (RMSNorm, ×2), blocks.*.mlp_post.weight (RMSNorm, ×2)" in report[0]
        assert "scalevec_lit.scale.OutputNorm(dim, strategy" in report[0]
    else:
        assert report == []
    vectors = {type(sp.vector).__module__ + "." + type(sp.vector).__qualname__ for sp in scale_parameters(model)}
    if run["kind"] == "vector":  # every scale vector of the model is the user's class
        assert vectors == {EXTENSIONS[run["name"]][2]}


def test_checkpoint_records_the_user_class(run):
    spec = torch.load(run["ckpt"], map_location="cpu", weights_only=False)["scalevec"]["spec"]
    where = {"block": spec["block"]["class_path"], "model": spec["model"]["class_path"],
             "vector": spec["strategy"]["vector"]["class_path"]}
    assert where[run["kind"]] == EXTENSIONS[run["name"]][2]
    init_args = {"softcap": ("model", {"cap": 5.0}), "temperature": ("model", {"temperature_init": 2.0}),
                 "residual": ("block", {"residual_scale": 0.5})}
    if run["name"] in init_args:
        entry, args = init_args[run["name"]]
        assert spec[entry]["init_args"] == args


# -- monitor tags and decay groups ----------------------------------------------------------------------------
def test_monitor_tags_are_the_registered_scale_vectors(run):
    from scalevec_lit.scale import scale_parameters
    from scalevec_lit.scale.sites import layer_label, parse_scale_tag

    model = run["model"]
    tags = [t for t in map(parse_scale_tag, scalars(run["root"])) if t is not None and t.stat == "mean"]
    logged = {t[:5] for t in tags if t.part not in ("gamma", "precond")}  # the parts' own statistics
    registered = {(sp.info.role, sp.info.site, sp.info.branch, layer_label(sp.info.layer), sp.info.part)
                  for sp in scale_parameters(model)}
    assert logged == registered
    gammas = {t[:4] for t in tags if t.part == "gamma"}  # γ itself, where it is not simply its parameter
    assert gammas == ({t[:4] for t in registered} if run["kind"] == "vector" else set())
    sites = {t[1] for t in logged}
    expected = {"sandwich": {"attn_post", "mlp_post"} <= sites, "plain_norm": not sites & {"attn_post", "mlp_post"},
                "own_attention": "attn_input" not in sites and "mlp_input" in sites,
                "gelu_mlp": ("input", "mlp_input", "shared", "layer01", "scale") in logged}
    assert expected.get(run["name"], True)
    if run["name"] == "sandwich":
        assert ("output", "attn_post", "out", "layer00", "scale") in logged


def test_decay_groups_follow_the_roles(run):
    from scalevec_lit.scale import scale_parameters

    module, trainer = run["cli"].model, run["cli"].trainer
    opt = trainer.optimizers[0]
    kind_of = {id(p): g["kind"] for g in opt.param_groups for p in g["params"]}
    scales = list(scale_parameters(module.model))
    assert {kind_of[id(sp.param)] for sp in scales} == {"scale"}
    assert sum(len(g["params"]) for g in opt.param_groups if g["kind"] == "scale") == len(scales)
    if run["name"] == "plain_norm":  # the RMSNorm gains: plain vectors, the optimizer's own (zero) decay
        gains = [m.weight for b in module.model.blocks for m in (b.attn_post, b.mlp_post)]
        assert {kind_of[id(p)] for p in gains} == {"vector"}
    decay = next(cb for cb in trainer.callbacks if type(cb).__name__ == "RoleWeightDecay")
    rows = {r[0]: r[3] for r in decay.build_plan(module.model, opt)[1:] if r[0].startswith("scale ")}
    expected = {f"scale {sp.info.role} {sp.info.site} {sp.info.part}": "0.1" if sp.info.role == "input" else "0"
                for sp in scales}
    assert rows == expected  # iwd: input role decayed with the matrices' λ, output role (OutputNorm's γ) not
    if run["name"] == "sandwich":
        assert rows["scale output attn_post scale"] == "0"


# -- export, convert ------------------------------------------------------------------------------------------
HF_REFUSAL = {
    "block": "every layer, model.block: {short} is not the Pre-Norm Block (no Hugging Face architecture adapter reads "
             "it; one that does is registered with scalevec_lit.arch.register); use Block, or export the "
             "native format (--format native",
    "model": "the model is a {short}, not scalevec_lit's Transformer (no Hugging Face architecture adapter reads it); "
             "or export the native format (--format native",
}


def test_export_is_exact_or_refused_by_name(run, tmp_path):
    from scalevec_lit.export import export, load_model
    from scalevec_lit.export.errors import ExportError

    model, kind = run["model"], run["kind"]
    export(run["ckpt"], tmp_path / "native", format="native")
    assert_same_function(load_model(tmp_path / "native")[0], model)
    if kind == "vector":  # the stock Pre-Norm model with the user's γ: folded into a Llama, the same logits
        from transformers import AutoModelForCausalLM

        result = export(run["ckpt"], tmp_path / "hf", format="hf")
        assert result.architecture == "LlamaForCausalLM"
        hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
        idx = tokens(model)
        with torch.no_grad():
            a, b = model(idx), hf(input_ids=idx).logits
        # float32 both, the same products in another order (γ folded into the weights): a few ulps of the largest
        torch.testing.assert_close(b, a, rtol=0, atol=64 * torch.finfo(torch.float32).eps * a.abs().max().item())
        return
    with pytest.raises(ExportError) as err:
        export(run["ckpt"], tmp_path / "hf", format="hf")
    assert HF_REFUSAL[kind].format(short=EXTENSIONS[run["name"]][2].rpartition(".")[2]) in str(err.value)
    assert not (tmp_path / "hf").exists()


def test_convert_to_the_same_strategy_is_a_copy(run, tmp_path):
    from scalevec_lit.export import load_model
    from scalevec_lit.hub.convert import convert_checkpoint

    done = convert_checkpoint(run["ckpt"], SAME_STRATEGY.get(run["name"], BASELINE), tmp_path / "conv")
    assert not done.report.changes
    converted = load_model(tmp_path / "conv")[0]
    assert_same_function(converted, run["model"])
    for (name, a), b in zip(converted.state_dict().items(), run["model"].state_dict().values()):
        assert torch.equal(a, b), name  # nothing folded, nothing restarted: every tensor as trained


# -- resume, generate -----------------------------------------------------------------------------------------
def test_resume_with_the_recipe(run):
    from scalevec_lit.cli import main

    cli = main(fit_args(run["data"], run["root"] / "resumed_by_suite", 3, "--config", recipe(run["name"]),
                        "--ckpt_path", str(run["ckpt"])))
    assert cli.trainer.global_step == 3 and type(cli.model.model) is type(run["model"])
    assert type(cli.model.model.blocks[0]) is type(run["model"].blocks[0])


def test_generate_command_continues_the_prompt_as_the_trained_model(run, capfd):
    from scalevec_lit.data.tokenizer import Tokenizer
    from scalevec_lit.export.tokenizer import find_tokenizer
    from scalevec_lit.generate import generate

    code, out = main_in_process(capfd, ["generate", "--ckpt", run["ckpt"], "--prompt", "ROMEO:", "--temperature", "0",
                                        "--max-new-tokens", "6", "--ignore-eos"])
    assert code == 0, out
    tok = Tokenizer(find_tokenizer(run["ckpt"], None)[0])
    ids = torch.tensor([tok.encode("ROMEO:", eos=False)])
    text = tok.decode(generate(run["model"], ids, 6, use_cache=False)[0].tolist())
    assert f"ROMEO:{text}\n" in out
    notes = {"own_attention": "block 0 (extensions.blocks.PlainAttentionBlock) has no CausalSelfAttention, the "
                              "module that reads the key/value cache",
             "cache_blind": "attention layer 0 (extensions.blocks.CacheBlindAttention) did not read the key/value "
                            "cache (2 of 2 layers did not)"}
    if run["name"] in notes:
        assert f"note: {notes[run['name']]}: generating without the key/value cache" in out
        assert "key/value cache off" in out
    else:
        assert "key/value cache on" in out


@torch.no_grad()
def test_python_generate_uses_the_cache_only_where_it_gives_the_same_logits(run):
    from scalevec_lit.generate import Sampling, generate

    model = run["model"]
    prompt = tokens(model, 5)
    sampling = Sampling(temperature=1.0)

    def sample(**kw):
        return generate(model, prompt, 8, sampling, generator=torch.Generator().manual_seed(1), **kw)

    reference = sample(use_cache=False)
    assert torch.equal(sample(), reference)
    refused = {"own_attention": r"block 0 \(extensions\.blocks\.PlainAttentionBlock\) has no CausalSelfAttention",
               "cache_blind": r"attention layer 0 \(extensions\.blocks\.CacheBlindAttention\) did not read"}
    if run["name"] in refused:
        with pytest.raises(ValueError, match=refused[run["name"]]):
            sample(use_cache=True)
        return
    idx = tokens(model, 10)
    cache = model.new_cache()
    cached = torch.cat([model.forward_cached(idx[:, :6], cache), model.forward_cached(idx[:, 6:], cache)], 1)
    full = model(idx).double()
    # the same float32 computation in another order: a few ulps of the largest logit
    atol = 64 * torch.finfo(torch.float32).eps * full.abs().max().item()
    torch.testing.assert_close(cached.double(), full, rtol=0, atol=atol)


# -- one fit as a user runs it: python -m scalevec_lit, the package on PYTHONPATH only --------------------------
@pytest.mark.slow
def test_fit_from_the_command_line_with_the_package_on_pythonpath(prepared_data, tmp_path):
    args = fit_args(prepared_data, tmp_path / "run", 1, "--config", recipe("sandwich"))
    res = run_cli(args, cwd=tmp_path, env={"PYTHONPATH": f"{ROOT}:{EXT.parent}"})
    assert res.returncode == 0, res.stderr[-2000:]
    spec = torch.load(tmp_path / "run" / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert spec["scalevec"]["spec"]["block"]["class_path"] == "extensions.blocks.SandwichBlock"
