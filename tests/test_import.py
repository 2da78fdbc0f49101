"""Start from a pretrained model: import transformers checkpoints, convert between strategies, continue training.

Tiny random models of every importable architecture are built with transformers here (norm weights moved
away from 1, some negative, so that every conversion has something to keep) and saved; then:
import → our logits equal transformers' → convert to every exact strategy → our logits unchanged → two
training steps → export → transformers loads it and agrees. Tolerances, from what is compared:

- ours vs transformers after import: transformers' RMSNorm computes in float32 even in a float64 model and
  its grouped expert matmul has no float64 kernel, so dense models are compared in float64 and MoE models
  in float32, both within 1e-5 relative (max |Δ| / max |logits|; observed ≤ 3e-7);
- ours vs ours after an exact conversion: float64 on both sides, so only reduction order and the last bit
  of each γ rewrite differ: 1e-12 relative (observed ≤ 4e-16);
- after training and export: float32 on both sides, 1e-4 as in ``test_export.py``.
"""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from helpers import ROOT
from scalevec_lit.data.tokenizer import DEFAULT_TOKENIZER
from scalevec_lit.errors import UserError
from scalevec_lit.export import hf_layout, load_model, write_safetensors
from scalevec_lit.hub import config_from_hf, convert_model, load_hf, read_strategy
from scalevec_lit.scale import ExpMagnitudeDirectionScale, MagnitudeDirectionScale, PlainScale, UnitOffsetScale
from scalevec_lit.scale.convert import set_scale_

pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")

IMPORT_TOL, EXACT, EXPORT_TOL = 1e-5, 1e-12, 1e-4
PRESETS = ROOT / "recipes" / "strategy"
LLAMA_EXACT = ["baseline", "unit_offset", "hg", "dp", "or", "er", "no_scale", "unified_no_dnp"]
QK_EXACT = ["qk_norm", "dnp", "unified", "unified_wide_qk"]  # u head-shaped → channel-shaped repeats exactly
MEASURED: dict[str, float] = {}


def tiny_hf(arch: str, vocab: int = 256, **overrides):
    """A random transformers model of ``arch`` with norm weights in ±[0.5, 1.5] (a fifth negative)."""
    import transformers as tf

    common = dict(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                  max_position_embeddings=64, rms_norm_eps=1e-5, intermediate_size=48)
    extra = {"Qwen3ForCausalLM": dict(head_dim=12),
             "Qwen3MoeForCausalLM": dict(moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
                                         norm_topk_prob=True, mlp_only_layers=[0], num_hidden_layers=3),
             "MixtralForCausalLM": dict(intermediate_size=16, num_local_experts=4, num_experts_per_tok=2)}
    name = arch.replace("ForCausalLM", "")
    config = getattr(tf, f"{name}Config")(**{**common, **extra.get(arch, {}), **overrides})
    torch.manual_seed(0)
    model = getattr(tf, arch)(config).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("norm.weight"):
                sign = torch.where(torch.rand(p.shape, generator=gen) < 0.2, -1.0, 1.0)
                p.copy_(sign * (0.5 + torch.rand(p.shape, generator=gen)))
    return model


def save(model, folder: Path, shard: str = "5GB", tokenizer: bool = False) -> Path:
    model.save_pretrained(folder, max_shard_size=shard)
    if tokenizer:
        shutil.copy(DEFAULT_TOKENIZER, folder / "tokenizer.json")
    return folder


def write_hf(model, out: Path) -> None:
    """``save_hf`` without the tokenizer files (these models have 256 tokens; the embedded tokenizer 4096)."""
    layout = hf_layout(model)
    out.mkdir()
    write_safetensors(layout.tensors, out)
    (out / "config.json").write_text(json.dumps(layout.config))


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def tokens(vocab: int, n: int = 24, seed: int = 3) -> torch.Tensor:
    return torch.randint(0, vocab, (2, n), generator=torch.Generator().manual_seed(seed))


def strategy(preset: str, **over):
    import dataclasses

    return dataclasses.replace(read_strategy(PRESETS / f"{preset}.yaml", eps=1e-5), **over)  # frozen: a value


def train_steps(model, steps: int = 2) -> None:
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        idx = tokens(model.config.vocab_size, 17, seed=7)
        F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten()).backward()
        opt.step()
        opt.zero_grad()
    model.eval()


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    if MEASURED:
        print("\nmax relative logit difference:")
        for name, value in MEASURED.items():
            print(f"  {name:50s} {value:.2e}")


CASES = [  # (architecture, transformers overrides, shard size, exact presets)
    ("LlamaForCausalLM", {}, "40KB", LLAMA_EXACT),
    ("LlamaForCausalLM", {"tie_word_embeddings": True}, "5GB", ["baseline", "hg", "no_scale"]),
    ("Qwen3ForCausalLM", {}, "5GB", QK_EXACT),
    ("Qwen3MoeForCausalLM", {}, "5GB", ["qk_norm", "dnp", "unified"]),
    ("MixtralForCausalLM", {}, "40KB", ["baseline", "hg", "dp", "er", "no_scale"]),
]


@pytest.mark.parametrize("arch,over,shard,exact", CASES, ids=[c[0] + "-tied" * bool(c[1]) for c in CASES])
def test_import_convert_train_export_agrees_with_transformers(arch, over, shard, exact, tmp_path):
    hf = tiny_hf(arch, **over)
    folder = save(hf, tmp_path / "hf", shard)
    assert shard == "5GB" or (folder / "model.safetensors.index.json").is_file()
    ours, got_arch = load_hf(folder)
    assert got_arch == arch and ours.tied == bool(over.get("tie_word_embeddings"))
    moe = "Moe" in arch or "Mixtral" in arch
    dtype = torch.float32 if moe else torch.float64
    idx = tokens(256)
    with torch.no_grad():
        theirs = hf.to(dtype)(input_ids=idx).logits
        mine = ours.to(dtype)(idx)
    name = arch + "-tied" * bool(over)
    MEASURED[f"{name} import vs transformers"] = rel(mine, theirs)
    assert rel(mine, theirs) <= IMPORT_TOL

    ours = ours.double()
    reference = ours(idx).detach()
    for preset in exact:
        for shape in (["head", "channel"] if preset in QK_EXACT else ["channel"]):
            converted, report, moved = convert_model(ours, strategy(preset, output_shape=shape))
            assert not report.changes, (preset, report.changes)
            with torch.no_grad():
                diff = rel(converted(idx), reference)
            MEASURED[f"{name} → {preset} ({shape})"] = diff
            assert diff <= EXACT and moved <= EXACT, (preset, shape, diff, moved)
            if preset == "no_scale" and over:
                assert not converted.tied and not converted.config.tie_embeddings  # γ_final folded into the head
            if shape == "channel" and preset in QK_EXACT:
                continue  # a channel-shaped u on q/k is not exportable once trained (its heads differ)
            trained = converted.float()
            train_steps(trained)
            out = tmp_path / f"{preset}-{shape}"
            write_hf(trained, out)
            from transformers import AutoModelForCausalLM

            back = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
            with torch.no_grad():
                diff = rel(back(input_ids=idx).logits, trained(idx))
            MEASURED[f"{name} → {preset} ({shape}) trained, exported"] = diff
            assert diff <= EXPORT_TOL, (preset, diff)


def test_function_changes_are_refused_unless_allowed():
    ours, _ = load_hf_model("LlamaForCausalLM")
    for preset in ("dnp", "qk_norm", "sandwich"):
        with pytest.raises(UserError, match=r"changes what the model computes: blocks\.\*\.attn\..*--allow-function-change"):
            convert_model(ours, strategy(preset, output_shape="head"))
    converted, report, moved = convert_model(ours, strategy("qk_norm"), allow_function_change=True)
    assert any("adds a normalization" in c for c in report.changes) and moved > 1e-3
    qwen, _ = load_hf_model("Qwen3ForCausalLM")
    with pytest.raises(UserError, match=r"attn\.input\.q: removes a normalization"):
        convert_model(qwen, strategy("hg"))
    with pytest.raises(UserError, match=r"eps 1e-05 → 0\.001"):
        convert_model(qwen, strategy("qk_norm", eps=1e-3))


def load_hf_model(arch: str):
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        return load_hf(save(tiny_hf(arch), Path(d) / "hf"))


@pytest.mark.parametrize("cls", [PlainScale, UnitOffsetScale, MagnitudeDirectionScale, ExpMagnitudeDirectionScale])
def test_every_parameterization_takes_any_gamma_exactly(cls):
    """γ with negative entries: α carries the signs, β = RMS(γ)·√(1+ε) > 0 (so ER's b = ln β exists)."""
    gamma = torch.tensor([0.7, -1.3, 2.0, -0.01, 1.0], dtype=torch.float64)
    vec = cls(5).double()
    assert set_scale_(vec, gamma)
    assert rel(vec(), gamma) <= 4 * torch.finfo(torch.float64).eps
    zero = torch.zeros(5, dtype=torch.float64)
    assert set_scale_(vec, zero) is (cls is not ExpMagnitudeDirectionScale)  # exp(b) > 0 cannot be 0
    if cls is ExpMagnitudeDirectionScale:
        assert rel(vec(), gamma) <= 4 * torch.finfo(torch.float64).eps  # refused: left as it was


BAD_CONFIGS = [  # (change to a Llama config.json, words of the message)
    ({"architectures": ["GPT2LMHeadModel"]}, ["architectures", "GPT2LMHeadModel", "LlamaForCausalLM"]),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0}}, ["rope_scaling.rope_type", "'llama3'", "default"]),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, ["rope_parameters.rope_type", "'yarn'"]),
    ({"attention_bias": True}, ["attention_bias", "True", "no bias"]),
    ({"mlp_bias": True}, ["mlp_bias"]),
    ({"hidden_act": "gelu"}, ["hidden_act", "'gelu'", "silu"]),
    ({"use_sliding_window": True}, ["use_sliding_window"]),
    ({"layer_types": ["sliding_attention", "full_attention"]}, ["layer_types", "sliding_attention"]),
]


@pytest.mark.parametrize("change,words", BAD_CONFIGS, ids=lambda v: next(iter(v)) if isinstance(v, dict) else None)
def test_unsupported_options_are_refused_with_the_key(change, words):
    cfg = {**tiny_hf("LlamaForCausalLM").config.to_dict(), "architectures": ["LlamaForCausalLM"], **change}
    with pytest.raises(UserError) as info:
        config_from_hf(cfg)
    for word in words:
        assert word in str(info.value), f"{word!r} not in {info.value}"
    moe = {**tiny_hf("Qwen3MoeForCausalLM").config.to_dict(), "architectures": ["Qwen3MoeForCausalLM"]}
    with pytest.raises(UserError, match=r"mlp_only_layers: '?\[1\]"):
        config_from_hf({**moe, "mlp_only_layers": [1]})


def test_weights_that_do_not_fit_the_architecture_are_named(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = save(tiny_hf("LlamaForCausalLM"), tmp_path / "hf")
    tensors = load_file(folder / "model.safetensors")
    tensors["model.layers.0.self_attn.q_proj.bias"] = torch.zeros(32)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(folder / "model.safetensors"))
    with pytest.raises(UserError, match=r"missing: \['model\.layers\.1\.mlp\.up_proj\.weight'\].*q_proj\.bias'\] \(biases\?\)"):
        load_hf(folder)


def test_init_from_takes_the_checkpoint_vocabulary_and_its_weights(tmp_path):
    """Hub models pad their vocabulary: a smaller tokenizer trains the checkpoint's embedding as it is."""
    import dataclasses

    from scalevec_lit.hub import import_hf
    from scalevec_lit.lit.init_from import load_init_weights, read_init
    from scalevec_lit.model import Transformer
    from scalevec_lit.model.block import Block

    import_hf(save(tiny_hf("Qwen3ForCausalLM", vocab=4096), tmp_path / "hf", tokenizer=True), tmp_path / "native")
    imported, spec = load_model(tmp_path / "native")
    recipe = dataclasses.replace(imported.config, vocab_size=4000, seq_len=16)  # a smaller tokenizer, shorter runs
    config, state = read_init(str(tmp_path / "native"), recipe, imported.strategy, Block)
    assert config.vocab_size == 4096 and config.seq_len == 16
    model = Transformer(config, imported.strategy)
    load_init_weights(model, state, str(tmp_path / "native"))
    idx = tokens(4096, 16)
    with torch.no_grad():
        assert torch.equal(model.eval()(idx), imported(idx))
    with pytest.raises(UserError, match=r"vocabulary \(4096\) is smaller than the tokenizer's \(5000\)"):
        read_init(str(tmp_path / "native"), dataclasses.replace(recipe, vocab_size=5000), imported.strategy, Block)


def test_cli_import_fit_init_from_export(prepared_data, tmp_path, capsys):
    """The README's worked example: import (tied Llama, to HG) → fit 3 steps from it → export → transformers."""
    from scalevec_lit.cli import main

    hf = save(tiny_hf("LlamaForCausalLM", vocab=4096, tie_word_embeddings=True, max_position_embeddings=256),
              tmp_path / "tiny-llama", tokenizer=True)
    native = tmp_path / "tiny-llama-hg"
    main(["import", "--hf", str(hf), "--out", str(native), "--strategy", str(PRESETS / "hg.yaml")])
    out = capsys.readouterr().out
    assert "logits moved by" in out and (native / "model.yaml").is_file() and (native / "tokenizer.json").is_file()
    assert (native / "tokenizer.json").read_bytes() == DEFAULT_TOKENIZER.read_bytes()
    start, spec = load_model(native)
    dnp = ["convert", "--ckpt", str(native), "--strategy", str(PRESETS / "dnp.yaml"), "--out", str(tmp_path / "dnp")]
    with pytest.raises(SystemExit) as info:
        main(dnp)
    assert info.value.code == 2 and "adds a normalization" in capsys.readouterr().err and not (tmp_path / "dnp").exists()
    main(dnp + ["--allow-function-change"])
    out = capsys.readouterr().out
    moved = float(out.split("logits moved by ")[1].split()[0])
    assert moved > 1e-3 and "function changed (--allow-function-change)" in out
    assert spec["strategy"]["branch_specific"] and spec["config"]["tie_embeddings"]

    with pytest.raises(SystemExit) as info:  # the recipe's own model is not the checkpoint's: named, with the fix
        main(["fit", "--config", str(ROOT / "recipes/smoke.yaml"), f"--model.init_from={native}",
              f"--data.data_dir={prepared_data}"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "model.init_from" in err and "model.config.n_embd: checkpoint 32, recipe 128" in err
    assert "model.strategy.branch_specific: checkpoint True, recipe False" in err and "model.yaml" in err

    root = tmp_path / "run"
    main(["fit", "--config", str(ROOT / "recipes/smoke.yaml"), "--config", str(native / "model.yaml"),
          f"--model.init_from={native}", f"--data.data_dir={prepared_data}", "--trainer.max_steps=3",
          f"--trainer.default_root_dir={root}", f"--trainer.logger.init_args.save_dir={root}",
          "--trainer.val_check_interval=3", "--trainer.limit_val_batches=1", "--trainer.num_sanity_val_steps=0",
          "--data.batch_size=2", "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
          "--model.schedule.init_args.warmup_steps=1", "--model.optimizer.init_args.lr=1e-4"])
    (ckpt,) = root.glob("**/checkpoints/last.ckpt")
    trained, _ = load_model(ckpt)
    moved = {n: float((a - b).norm() / a.norm()) for (n, a), b in zip(start.state_dict().items(),
                                                                      trained.state_dict().values())}
    assert max(moved.values()) < 0.05 and min(moved.values()) > 0, moved  # 3 steps at lr 1e-4 from the import
    main(["convert", "--ckpt", str(ckpt), "--strategy", str(PRESETS / "er.yaml"), "--out", str(tmp_path / "er")])
    assert (tmp_path / "er" / "tokenizer.json").read_bytes() == DEFAULT_TOKENIZER.read_bytes()  # the recorded one
    er, _ = load_model(tmp_path / "er")
    idx = tokens(4096, 32)
    with torch.no_grad():
        assert rel(er(idx), trained(idx)) <= 1e-5  # a fit checkpoint converts too (float32 here)
    main(["export", "--ckpt", str(ckpt), "--out", str(tmp_path / "exported")])
    from transformers import AutoModelForCausalLM

    back = AutoModelForCausalLM.from_pretrained(tmp_path / "exported", dtype=torch.float32).eval()
    with torch.no_grad():
        diff = rel(back(input_ids=idx).logits, trained(idx))
    MEASURED["cli: import → fit 3 steps → export"] = diff
    assert diff <= EXPORT_TOL

