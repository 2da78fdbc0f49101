"""Hugging Face architecture adapters (``scalevec_lit/arch/``): one per architecture, found by a registry.

- every shipped adapter's name table maps both ways: each tensor of our folded model has exactly one name,
  export then import through the table gives back every tensor bit for bit (the four importable ones also
  through the files: ``config.json`` + safetensors read by ``load_hf``), and the plan chooses that adapter;
- a block or model no adapter knows is refused by export by name with the way out (``--format native``),
  before anything is written; import names the architectures it reads (the registered ones that import);
- an adapter defined in this file is registered without touching the library: export chooses it, its
  ``config.json`` keys and block are used both ways, the other adapters' messages name it; unregistered, the
  same model is refused again.

No transformers needed: ``test_export.py`` and ``test_import.py`` compare against transformers' models.
"""
from __future__ import annotations

import copy
import json
from typing import Any

import pytest
import torch
from torch import nn

from helpers import tiny_config
from scalevec_lit.errors import UserError
from scalevec_lit.export import ARCHITECTURES, HFExportError, hf_layout, main, save_hf, save_native, write_safetensors
from scalevec_lit.arch import HFArchitecture, architecture, architectures, facts_of, register, unregister
from scalevec_lit.arch.names import native_tensor
from scalevec_lit.checkpoint.hf import config_from_hf, load_hf
from scalevec_lit.model.block import Block, ParallelBlock
from scalevec_lit.model.spec import build_from_spec
from scalevec_lit.model.transformer import Transformer
from scalevec_lit.scale.fold import fold_scales
from scalevec_lit.scale.registry import scale_parameters
from export_models import perturb_scales_, preset_spec

pytestmark = pytest.mark.usefixtures("one_thread")

QK = {"output_shape": "head"}
#: (architecture, preset, strategy overrides, moe, config overrides): one model each adapter holds
SHIPPED = [
    ("LlamaForCausalLM", "hg", {}, None, {}),
    ("Qwen3ForCausalLM", "qk_norm", QK, None, {"tie_embeddings": True}),
    ("Qwen3MoeForCausalLM", "unified", QK, {"first_dense_layers": 1, "route_norm": False}, {"n_layer": 3}),
    ("MixtralForCausalLM", "dp", {}, {}, {}),
    ("Glm4MoeForCausalLM", "qk_norm", QK, {"router": "sigmoid", "bias_balancing": True, "num_shared_experts": 1,
                                           "first_dense_layers": 1}, {"n_layer": 3}),
]


def tiny(preset: str, strategy: dict, moe: dict | None, config: dict, block: type = Block) -> Transformer:
    """A tiny model of ``preset`` with every scale moved away from its init (so folding is not the identity)."""
    spec = preset_spec(preset, strategy, moe, **{"n_embd": 32, "vocab_size": 128, "seq_len": 16, **config})
    spec["block"] = {"class_path": f"{block.__module__}.{block.__qualname__}"}
    model = build_from_spec(spec).eval()
    perturb_scales_(model)
    return model


def write_hf_folder(model, out) -> dict[str, torch.Tensor]:
    """``save_hf`` without the tokenizer files (these models have 128 tokens); returns the tensors written."""
    layout = hf_layout(model)
    out.mkdir()
    write_safetensors(layout.tensors, out)
    (out / "config.json").write_text(json.dumps(layout.config))
    return layout.tensors


# -- each shipped adapter: the name table both ways ----------------------------------------------------------
@pytest.mark.parametrize("arch,preset,strategy,moe,config", SHIPPED, ids=[s[0] for s in SHIPPED])
def test_each_adapter_maps_every_tensor_once_and_back(arch, preset, strategy, moe, config, tmp_path):
    model = tiny(preset, strategy, moe, config)
    folded = fold_scales(model).eval()
    adapter = ARCHITECTURES[arch]
    assert architecture(arch) is adapter and hf_layout(model).architecture == arch
    qk = facts_of(folded).qk_norm
    rows = adapter.names(folded, qk)
    assert len({name for name, _ in rows}) == len(rows) and len({ref for _, ref in rows}) == len(rows)

    # every element of every tensor of the folded model (scale vectors aside) is named exactly once
    scales = {id(sp.param) for sp in scale_parameters(folded)}
    owned = [p for p in folded.parameters() if id(p) not in scales]
    owned += [b for n, b in folded.named_buffers() if n.endswith("expert_bias")]
    seen = {id(p): torch.zeros(p.shape, dtype=torch.int64) for p in owned}
    for _, ref in rows:
        t = native_tensor(folded, ref)
        if t is None:
            continue  # norm weights (written through the scale layer) and Glm4's absent parts
        base = next(p for p in owned if p.data_ptr() <= t.data_ptr() < p.data_ptr() + p.numel() * p.element_size())
        view = seen[id(base)].view(-1)[(t.data_ptr() - base.data_ptr()) // t.element_size():][:t.numel()]
        view += 1
    assert all(bool((count == 1).all()) for count in seen.values()), [n for n, p in folded.named_parameters()
                                                                     if id(p) in seen and not (seen[id(p)] == 1).all()]

    # export → a copy with every such tensor NaN, through the same table: every tensor back, bit for bit
    exported = {name: adapter.export_tensor(folded, ref) for name, ref in rows}
    fresh = copy.deepcopy(folded)
    fresh_scales = {id(sp.param) for sp in scale_parameters(fresh)}
    fresh_owned = {n: t for n, t in [*fresh.named_parameters(), *fresh.named_buffers()]
                   if id(t) not in fresh_scales and (isinstance(t, nn.Parameter) or n.endswith("expert_bias"))}
    with torch.no_grad():
        for p in fresh_owned.values():
            p.fill_(float("nan"))
        for name, ref in rows:
            t = native_tensor(fresh, ref)
            if t is not None:
                t.copy_(exported[name])
    state = dict(folded.named_parameters()) | dict(folded.named_buffers())
    assert fresh_owned and all(torch.equal(p, state[n]) for n, p in fresh_owned.items())

    if not adapter.importable:
        with pytest.raises(UserError, match=rf"architectures: \['{arch}'\].*is not an architecture import reads"):
            config_from_hf(hf_layout(model).config)
        return
    # and through the files, read by import
    tensors = write_hf_folder(model, tmp_path / "hf")
    back, got = load_hf(tmp_path / "hf")
    assert got == arch
    for name, ref in rows:
        if native_tensor(back, ref) is not None:
            assert torch.equal(native_tensor(back, ref), tensors[name]), name
    idx = torch.randint(0, 128, (2, 16))
    with torch.no_grad():
        a, b = back(idx), folded(idx)
    assert float((a - b).abs().max() / b.abs().max()) <= 64 * torch.finfo(torch.float32).eps


def test_registry_lists_the_shipped_adapters_in_their_order():
    assert [a.architecture for a in architectures()][:5] == [
        "LlamaForCausalLM", "Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "MixtralForCausalLM", "Glm4MoeForCausalLM"]
    assert [a.title for a in architectures() if a.importable] == ["Llama", "Qwen3", "Qwen3-MoE", "Mixtral"]
    with pytest.raises(ValueError, match=r"LlamaForCausalLM is already registered by scalevec_lit\.arch\.llama"):
        register(type("Llama", (HFArchitecture,), {"architecture": "LlamaForCausalLM", "title": "Llama"}))
    assert ARCHITECTURES["LlamaForCausalLM"].title == "Llama"  # the shipped one stays
    assert [type(a).__module__ for a in architectures()][:5] == [  # found in the package's own folder
        f"scalevec_lit.arch.{m}" for m in ("llama", "qwen3", "qwen3_moe", "mixtral", "glm4_moe")]


def test_the_former_module_name_is_the_same_registry():
    """``scalevec_lit.export.arch`` (the adapters' former home) still works for existing scripts: the same objects."""
    import scalevec_lit.arch as arch
    import scalevec_lit.export.arch as former

    assert former.register is arch.register
    assert former.__all__ == arch.__all__
    assert [n for n in arch.__all__ if getattr(former, n) is not getattr(arch, n)] == []


# -- unknown blocks, models and architectures: refused by name ------------------------------------------------
class AttentionOnlyBlock(Block):
    """A user block without ``.mlp`` (attention only)."""

    def __init__(self, config, layer: int, strategy) -> None:
        nn.Module.__init__(self)
        self.layer = layer
        self.attn = self.build_attention(config, layer, strategy)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        return x + self.attn(x, cos, sin)


def test_a_block_without_mlp_is_refused_by_name_with_the_way_out(tmp_path, capsys):
    """Was ``internal: AttributeError: 'AttentionOnlyBlock' object has no attribute 'mlp'``."""
    model = tiny("baseline", {}, None, {"vocab_size": 4096}, block=AttentionOnlyBlock)  # the embedded tokenizer's
    with pytest.raises(HFExportError, match=r"every layer, model\.block: AttentionOnlyBlock is not the Pre-Norm Block"
                                            r".*scalevec_lit\.arch\.register.*--format native"):
        save_hf(model, tmp_path / "out")
    assert not (tmp_path / "out").exists()

    save_native(model, tmp_path / "native")  # the command: exit 2, one paragraph naming the block
    with pytest.raises(SystemExit) as info:
        main(["--ckpt", str(tmp_path / "native"), "--out", str(tmp_path / "hf")])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "internal" not in err and "AttributeError" not in err
    assert "AttentionOnlyBlock is not the Pre-Norm Block" in err and "--format native" in err
    assert not (tmp_path / "hf").exists()


def test_a_model_class_no_adapter_reads_is_refused_by_name(tmp_path):
    class MyTransformer(Transformer):
        pass

    with pytest.raises(HFExportError, match=r"the model is a MyTransformer, not scalevec_lit's Transformer \(no "
                                            r"Hugging Face architecture adapter reads it\); or export the native format"):
        save_hf(MyTransformer(tiny_config(n_embd=32, vocab_size=128)), tmp_path / "out")


# -- an adapter of the user's own, registered from here ---------------------------------------------------------
class FakeParallel(HFArchitecture):
    """A made-up architecture for the parallel block: the Llama layout, its own config.json key and block."""

    architecture, model_type, title = "FakeParallelForCausalLM", "fake_parallel", "FakeParallel"
    blocks = (ParallelBlock,)

    def config_extra(self, model, qk_norm: bool) -> dict[str, Any]:
        return {"parallel_residual": True}

    def import_checks(self, cfg: dict[str, Any]) -> list[tuple[str, Any, Any, str]]:
        return super().import_checks(cfg) + [("parallel_residual", cfg.get("parallel_residual"), True, "blocks are parallel")]


class SharedSoftmax(HFArchitecture):
    """A made-up softmax-routed MoE architecture with shared experts, tried before Mixtral."""

    architecture, model_type, title, priority = "SharedSoftmaxForCausalLM", "shared_softmax", "SharedSoftmax", 1
    moe, router, shared_experts = True, "softmax", True


@pytest.fixture()
def fake_adapters():
    register(FakeParallel)
    register(SharedSoftmax)
    yield
    unregister(FakeParallel.architecture)
    unregister(SharedSoftmax.architecture)


def test_a_registered_adapter_is_used_both_ways_and_named_by_the_others(fake_adapters, tmp_path):
    model = tiny("hg", {}, None, {}, block=ParallelBlock)
    tensors = write_hf_folder(model, tmp_path / "hf")  # refused without the adapter (below)
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert cfg["architectures"] == ["FakeParallelForCausalLM"] and cfg["parallel_residual"] is True
    assert "model.layers.1.mlp.up_proj.weight" in tensors
    back, arch = load_hf(tmp_path / "hf")  # import builds the adapter's block
    assert arch == "FakeParallelForCausalLM" and all(type(b) is ParallelBlock for b in back.blocks)
    idx = torch.randint(0, 128, (2, 16))
    with torch.no_grad():
        a, b = back(idx), model(idx)
    assert float((a - b).abs().max() / b.abs().max()) <= 64 * torch.finfo(torch.float32).eps
    with pytest.raises(UserError, match=r"config\.json: parallel_residual: None: .*\(blocks are parallel\); only True"):
        config_from_hf({**cfg, "parallel_residual": None})
    for archs in (["NoSuchForCausalLM"], ["Glm4MoeForCausalLM"], ["LlamaForCausalLM", "Qwen3ForCausalLM"]):
        with pytest.raises(UserError) as info:  # the architectures import reads: the registered ones that import
            config_from_hf({**cfg, "architectures": archs}, "x/config.json")
        assert str(info.value) == (f"x/config.json: architectures: {archs!r}: is not an architecture import reads; "
                                   "import a checkpoint of SharedSoftmaxForCausalLM, LlamaForCausalLM, Qwen3ForCausalLM, "
                                   "Qwen3MoeForCausalLM, MixtralForCausalLM, FakeParallelForCausalLM")

    # a softmax MoE with shared experts: Mixtral refuses it, the registered SharedSoftmax holds it
    moe = tiny("baseline", {}, {"num_shared_experts": 1}, {})
    assert hf_layout(moe).architecture == "SharedSoftmaxForCausalLM"
    sandwich = tiny("sandwich", {}, None, {})  # every adapter's message lists the registered ones
    with pytest.raises(HFExportError, match=r"has no place in SharedSoftmax, Llama, Qwen3, Qwen3-MoE, Mixtral, "
                                            r"Glm4-MoE or FakeParallel; set it to false"):
        hf_layout(sandwich)


def test_without_the_adapter_the_same_models_are_refused(tmp_path):
    with pytest.raises(HFExportError, match=r"ParallelBlock is not the Pre-Norm Block.*--format native"):
        hf_layout(tiny("hg", {}, None, {}, block=ParallelBlock))
    with pytest.raises(HFExportError, match=r"shared experts .* have no place in Mixtral \(routed experts only\); set "
                                            r"num_shared_experts: 0, or router: sigmoid \(then Glm4-MoE holds it\)"):
        hf_layout(tiny("baseline", {}, {"num_shared_experts": 1}, {}))
