"""The extension suite's single cases (the per-extension run-through is ``tests/test_extension_suite.py``):
conversion of a fitted user model to another strategy (exact through the target's inverse, or refused by name),
weights that no longer fit a user class, a recipe block that is not a ``Block``, a Python block without ``.mlp``,
an attention that bypasses the key/value cache, the inverse of a user ``ScaleVector``, and the tests that
``docs/internals/extensions.md`` names (the statement-to-test map of ``docs/subclassing.md``).
"""
from __future__ import annotations

import pytest
import torch

from extension_runs import BASELINE, EXT, assert_same_function, fit_args, fitted, tokens
from helpers import ROOT, main_in_process

pytestmark = pytest.mark.usefixtures("one_thread")


# -- convert to another strategy: exact, or refused by name ---------------------------------------------------
STRATEGY = ROOT / "recipes" / "strategy"
CONVERSIONS = [  # (extension, target strategy, None: exact, else words of the refusal)
    ("softcap", EXT / "softplus_scale.yaml", None),  # γ written through SoftplusScale.set_gamma_
    ("softplus", BASELINE, None),  # a user γ read by the stock PlainScale's inverse
    ("sandwich", STRATEGY / "hg.yaml", None),  # a user block (its OutputNorm γ too) into another strategy
    ("one_norm_parallel", STRATEGY / "hg.yaml", None),  # its one γ into one γ per branch (q, k, v, gate, up)
    ("softcap", EXT / "tanh_scale.yaml", "extensions.scales.TanhScale has no inverse"),
    ("sandwich", STRATEGY / "unified.yaml", "--allow-function-change"),
]


@pytest.mark.parametrize("name, strategy, refusal", CONVERSIONS, ids=[f"{n}-{s.stem}" for n, s, _ in CONVERSIONS])
def test_convert_to_another_strategy_is_exact_or_refused_by_name(name, strategy, refusal, prepared_data,
                                                                 tmp_path_factory, tmp_path, capfd):
    from scalevec_lit.export import load_model

    run = fitted(name, prepared_data, tmp_path_factory)
    out = tmp_path / "conv"
    code, printed = main_in_process(capfd, ["convert", "--ckpt", run["ckpt"], "--strategy", strategy, "--out", out])
    if refusal is not None:
        assert code == 2 and printed.startswith(f"error: --strategy: {strategy}: ") and refusal in printed, printed
        assert not out.exists()
        return
    assert code == 0, printed
    converted, _ = load_model(out)
    assert type(converted) is type(run["model"]) and type(converted.blocks[0]) is type(run["model"].blocks[0])
    trained = load_model(run["ckpt"])[0]  # the trained model (tests above: the same function as in memory)
    idx = tokens(converted)
    with torch.no_grad():
        a, b = trained.double()(idx), converted.double()(idx)
    # float64 logits of the float32 weights as trained and as converted: apart only by float32 rounding
    torch.testing.assert_close(b, a, rtol=0, atol=16 * torch.finfo(torch.float32).eps * a.abs().max().item())


# -- a block that is not a Block subclass, without .mlp: from Python only -------------------------------------
def test_a_recipe_block_must_be_a_block_subclass(prepared_data, tmp_path, capfd):
    refused = ("error: model.block: extensions.blocks.AttentionOnlyBlock: is not a subclass of "
               "scalevec_lit.model.block.Block: a recipe's block must be one (from Python, Transformer(config, "
               "block=...) takes any callable (config, layer, strategy)); subclass scalevec_lit.model.Block (override "
               "forward, build_attention or build_mlp)\n")
    recipe = tmp_path / "block.yaml"
    recipe.write_text("model:\n  block:\n    class_path: extensions.blocks.AttentionOnlyBlock\n")
    for given in (["--model.block.class_path=extensions.blocks.AttentionOnlyBlock"],
                  ["--model.block", "extensions.blocks.AttentionOnlyBlock"], ["--config", str(recipe)]):
        code, out = main_in_process(capfd, fit_args(prepared_data, tmp_path / "run", 1, *given))
        assert (code, out) == (2, refused)
    assert not (tmp_path / "run").exists()


def test_a_python_block_without_mlp_exports_natively_decodes_and_is_refused_by_hf_export_by_name(tmp_path, capfd):
    from extensions.blocks import AttentionOnlyBlock

    from helpers import tiny_config
    from scalevec_lit.export import export, load_model
    from scalevec_lit.export.write import save_native
    from scalevec_lit.generate import generate
    from scalevec_lit.model import Transformer

    model = Transformer(tiny_config(), block=AttentionOnlyBlock).eval()
    tokenizer = ROOT / "scalevec_lit" / "data" / "corpus" / "tokenizer.json"
    save_native(model, tmp_path / "native", tokenizer=tokenizer)
    loaded = load_model(tmp_path / "native")[0]
    assert_same_function(loaded, model)
    assert not hasattr(loaded.blocks[0], "mlp")
    prompt = tokens(model, 5)
    assert torch.equal(generate(loaded, prompt, 6), generate(model, prompt, 6, use_cache=False))  # with the cache
    code, out = main_in_process(capfd, ["export", "--ckpt", tmp_path / "native", "--out", tmp_path / "hf"])
    assert code == 2 and "internal" not in out
    assert ("model.block: AttentionOnlyBlock is not the Pre-Norm Block (no Hugging Face architecture adapter reads "
            "it; one that does is registered with scalevec_lit.arch.register); use Block, or export the native "
            "format (--format native") in out
    assert not (tmp_path / "hf").exists()


# -- the key/value cache: a user attention that would ignore it is refused, never silently wrong ------------------
@torch.no_grad()
def test_an_attention_that_ignores_the_cache_is_refused():
    from extensions.blocks import CacheBlindBlock

    from helpers import tiny_config
    from scalevec_lit.generate import generate
    from scalevec_lit.model import Transformer
    from scalevec_lit.model.cache import CacheNotRead
    from scalevec_lit.model.transformer import cache_problem

    model = Transformer(tiny_config(), block=CacheBlindBlock).eval()
    prompt = tokens(model, 5)
    named = (r"^attention layer 0 \(extensions\.blocks\.CacheBlindAttention\) did not read the key/value cache "
             r"\(2 of 2 layers did not\)")
    cache = model.new_cache()
    rest = r": its forward does not take the cache path, so the logits would ignore the earlier positions; use " \
           r"generate\(\.\.\., use_cache=False\)$"
    with pytest.raises(CacheNotRead, match=named + rest):
        model.forward_cached(prompt, cache)
    assert cache.length == 0  # refused after the call: nothing advanced
    assert cache_problem(model) == ("attention layer 0 (extensions.blocks.CacheBlindAttention) did not read the "
                                    "key/value cache (2 of 2 layers did not)")
    assert torch.equal(generate(model, prompt, 6), generate(model, prompt, 6, use_cache=False))  # without the cache
    with pytest.raises(CacheNotRead, match=named):
        generate(model, prompt, 6, use_cache=True)


# -- the ScaleVector inverse of a user class, and the page that maps all this to its tests --------------------------------
@torch.no_grad()
def test_scale_vector_inverse_contract():
    from extensions.scales import SoftplusScale, TanhScale

    from scalevec_lit.scale.vector import NoInverse

    vec = SoftplusScale(6)
    target = torch.tensor([0.25, 0.5, 1.0, 1.5, 3.0, 40.0])
    assert SoftplusScale.invertible() and vec.set_gamma_(target)
    torch.testing.assert_close(vec(), target, rtol=4 * torch.finfo(torch.float32).eps, atol=0)
    before = vec.scale.clone()
    assert vec.set_gamma_(torch.tensor([1.0, 1.0, -1.0, 1.0, 1.0, 1.0])) is False  # no w gives γ ≤ 0
    assert torch.equal(vec.scale, before)
    assert not TanhScale.invertible()
    with pytest.raises(NoInverse, match=r"^extensions\.scales\.TanhScale has no inverse \(ScaleVector\.set_gamma_\)"):
        TanhScale(6).set_gamma_(torch.ones(6))


def test_every_test_the_extensions_page_names_exists():
    """docs/internals/extensions.md maps each statement about user classes to its tests (the user page,
    docs/subclassing.md, names no test): every test it names exists, and every test of these files is named."""
    import re

    page = (ROOT / "docs" / "internals" / "extensions.md").read_text()
    named = set(re.findall(r"`(test_\w+)`", page))
    defined = set()
    for path in (ROOT / "tests").glob("test_extension*.py"):  # this file, test_extension_suite.py, test_extensions.py
        defined |= set(re.findall(r"^def (test_\w+)", path.read_text(), flags=re.M))
    assert named and named <= defined, sorted(named - defined)
    assert defined <= named, sorted(defined - named)


def test_weights_that_no_longer_fit_the_user_class_are_refused_naming_it(prepared_data, tmp_path_factory, tmp_path,
                                                                          capfd):
    import json

    from scalevec_lit.export import export

    run = fitted("gelu_mlp", prepared_data, tmp_path_factory)
    export(run["ckpt"], tmp_path / "native", format="native")
    spec_file = tmp_path / "native" / "scalevec_spec.json"
    spec = json.loads(spec_file.read_text())
    spec["block"]["class_path"] = "extensions.blocks.SandwichBlock"  # as if GeluMLPBlock had been rewritten
    spec_file.write_text(json.dumps(spec))
    capfd.readouterr()
    src = tmp_path / "native"
    for command in (["generate", "--ckpt", src, "--prompt", "ROMEO:"],
                    ["export", "--ckpt", src, "--out", tmp_path / "hf"],
                    ["convert", "--ckpt", src, "--strategy", BASELINE, "--out", tmp_path / "conv"]):
        code, out = main_in_process(capfd, command)
        assert code == 2, out
        assert out.startswith("error: --ckpt: the weights do not fit the model its spec names "
                              "(scalevec_lit.model.transformer.Transformer with the block "
                              "extensions.blocks.SandwichBlock; missing: ['blocks.0.mlp.input.proj.gate.weight'")
        assert ("other shapes: ['blocks.0.mlp.down.weight (128, 512) in the checkpoint, (128, 384) now', "
                "'blocks.1.mlp.down.weight (128, 512) in the checkpoint, (128, 384) now']") in out
        assert out.rstrip().endswith("that class now builds other parameters than when the checkpoint was written; "
                                     "restore the class (or its package version) that wrote it")
    assert not (tmp_path / "hf").exists() and not (tmp_path / "conv").exists()
