"""Export: folded models loaded with transformers give our logits and our greedy tokens; refusals; formats.

Every exportable strategy preset is built tiny, its scale parameters perturbed at random (so that folding
is not the identity), exported, and loaded with ``AutoModelForCausalLM``: logits within 1e-4 relative
(max |ours - theirs| / max |ours|) and the same 20 greedy tokens.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
from pathlib import Path

import pytest
import torch
import yaml

from helpers import ROOT, run_cli, smoke_args, spawn_gloo, tiny_config
from scalevec_lit.export import (
    ExportError,
    HFExportError,
    export,
    load_model,
    load_native,
    main,
    parse_size,
    read_checkpoint,
    save_hf,
    save_native,
)
from scalevec_lit.model.spec import build_from_spec, model_spec
from scalevec_lit.scale.registry import scale_parameters

# checked without importing it: the DCP test's worker processes re-import this module
pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")

REL_TOL = 1e-4
GEN_TOKENS = 20
MAX_REL_DIFF: dict[str, float] = {}  # printed at the end of the module (pytest -s)


# -- helpers -------------------------------------------------------------------------------------------
def preset_spec(preset: str, strategy: dict | None = None, moe: dict | None = None, **config) -> dict:
    """A model spec: a preset of recipes/strategy/ (with overrides) on a tiny config (MoE when ``moe``)."""
    strat = yaml.safe_load((ROOT / "recipes" / "strategy" / f"{preset}.yaml").read_text())["model"]["strategy"]
    for key, value in (strategy or {}).items():
        strat[key] = {**strat[key], **value} if isinstance(value, dict) else value
    cfg = dataclasses.asdict(tiny_config(**config))
    if moe is not None:
        cfg["moe"] = {"num_experts": 4, "top_k": 2, "expert_intermediate_size": 64, **moe}
    return {"config": cfg, "strategy": strat, "block": {"class_path": "scalevec_lit.model.block.Block"}}


@torch.no_grad()
def perturb_scales_(model, seed: int = 1, heads_equal: bool = False) -> None:
    """Move every scale parameter away from its init. ``heads_equal``: full-width q/k output scales get
    the same values in every head (a 'channel' u that Qwen3's per-head weight can still hold)."""
    gen = torch.Generator().manual_seed(seed)
    head_dim = model.config.head_dim
    for sp in scale_parameters(model):
        p = sp.param
        if heads_equal and sp.info.site == "attn_proj" and p.numel() > head_dim:
            noise = (0.3 * torch.randn(head_dim, generator=gen)).repeat(p.numel() // head_dim)
        else:
            noise = 0.3 * torch.randn(p.shape, generator=gen)
        p.add_(noise.view_as(p))
    for module in model.modules():  # MoE selection bias (aux-loss-free balancing): as after training
        bias = getattr(module, "expert_bias", None)
        if bias is not None:
            bias.add_(0.05 * torch.randn(bias.shape, generator=gen))


def make_model(preset: str, strategy: dict | None = None, heads_equal: bool = False, moe: dict | None = None,
               **config):
    torch.manual_seed(0)
    model = build_from_spec(preset_spec(preset, strategy, moe, **config)).eval()
    perturb_scales_(model, heads_equal=heads_equal)
    return model


@torch.no_grad()
def greedy(model, prompt: torch.Tensor, n: int) -> torch.Tensor:
    """Our greedy decoding: full forward each step, argmax of the last position."""
    ids = prompt
    for _ in range(n):
        ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids[:, prompt.shape[1]:]


def load_hf(folder: Path):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None  # always 20 tokens, as our loop
    return hf


@torch.no_grad()
def assert_same_model(ours, folder: Path, name: str, seed: int = 2):
    """Logits within 1e-4 relative on random input and 20 identical greedy tokens; returns the HF model."""
    hf = load_hf(folder)
    gen = torch.Generator().manual_seed(seed)
    vocab, seq_len = ours.config.vocab_size, ours.config.seq_len
    idx = torch.randint(0, vocab, (2, seq_len), generator=gen)
    a, b = ours(idx), hf(input_ids=idx).logits
    rel = float((a - b).abs().max() / a.abs().max())
    MAX_REL_DIFF[name] = rel
    assert rel < REL_TOL, f"{name}: logits differ by {rel:.3g} relative"
    prompt = torch.randint(0, vocab, (1, seq_len - GEN_TOKENS), generator=gen)
    theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=GEN_TOKENS, do_sample=False)
    assert theirs.shape[1] == prompt.shape[1] + GEN_TOKENS
    assert torch.equal(theirs[:, prompt.shape[1]:], greedy(ours, prompt, GEN_TOKENS)), name
    return hf


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    if MAX_REL_DIFF:
        print("\nmax relative logit difference, ours vs transformers:")
        for name, rel in MAX_REL_DIFF.items():
            print(f"  {name:40s} {rel:.2e}")


# -- every exportable preset ------------------------------------------------------------------------------
EXPORTABLE = [
    ("baseline", {}, "LlamaForCausalLM"),
    ("no_scale", {}, "LlamaForCausalLM"),
    ("unit_offset", {}, "LlamaForCausalLM"),
    ("hg", {}, "LlamaForCausalLM"),
    ("dp", {}, "LlamaForCausalLM"),
    ("or", {}, "LlamaForCausalLM"),
    ("er", {}, "LlamaForCausalLM"),
    ("qk_norm", {}, "Qwen3ForCausalLM"),
    ("dnp", {"output_shape": "head"}, "Qwen3ForCausalLM"),
    ("unified", {"output_shape": "head"}, "Qwen3ForCausalLM"),
]


@pytest.mark.parametrize("preset,strategy,arch", EXPORTABLE, ids=[e[0] + "-head" * bool(e[1]) for e in EXPORTABLE])
def test_preset_export_matches_transformers(preset, strategy, arch, tmp_path):
    model = make_model(preset, strategy)
    result = save_hf(model, tmp_path)
    assert result.architecture == arch
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == [arch]
    hf = assert_same_model(model, tmp_path, f"{preset}{'-head' if strategy else ''}")
    assert type(hf).__name__ == arch
    from safetensors.torch import load_file

    tensors = load_file(tmp_path / "model.safetensors")
    norms = [k for k in tensors if k.endswith("layernorm.weight") or k == "model.norm.weight"]
    assert norms and all(torch.equal(tensors[k], torch.ones_like(tensors[k])) for k in norms)  # all folded away
    if preset != "no_scale":  # folding changed the maps: the scales were not the identity
        assert not torch.equal(tensors["model.layers.0.self_attn.q_proj.weight"], model.blocks[0].attn.input.weight("q"))
    if arch == "Qwen3ForCausalLM":
        assert tensors["model.layers.0.self_attn.q_norm.weight"].shape == (model.config.head_dim,)
        assert not torch.equal(tensors["model.layers.0.self_attn.k_norm.weight"], torch.ones(model.config.head_dim))


def test_channel_output_scale_equal_across_heads_exports_as_qwen3(tmp_path):
    """A full-width ('channel') u on q/k whose heads agree fits Qwen3's per-head-dim weight."""
    model = make_model("dnp", heads_equal=True)
    assert model.blocks[0].attn.input.proj["q"].out_scale.scale.numel() == model.config.n_head * model.config.head_dim
    assert save_hf(model, tmp_path).architecture == "Qwen3ForCausalLM"
    assert_same_model(model, tmp_path, "dnp-channel-equal-heads")


@pytest.mark.parametrize(
    "preset,strategy,config,tied",
    [
        ("qk_norm", {"eps": 1e-2}, dict(n_kv_head=1, head_dim=24, rope_theta=500.0, n_layer=3), False),
        ("baseline", {"eps": 1e-3, "final_norm": False}, dict(tie_embeddings=True, rope_theta=1e6), True),
        ("hg", {}, dict(tie_embeddings=True, intermediate_size=96), False),  # folding the final γ unties
    ],
    ids=["qwen3-gqa1-headdim24-eps1e-2-theta500", "llama-tied-nofinal-eps1e-3", "llama-tied-untied-by-fold"],
)
def test_shapes_eps_theta_and_tying_reach_the_config(preset, strategy, config, tied, tmp_path):
    model = make_model(preset, strategy, **config)
    save_hf(model, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    c, s = model.config, model.strategy
    assert cfg["rms_norm_eps"] == s.eps and cfg["rope_theta"] == c.rope_theta
    assert cfg["rope_parameters"] == {"rope_type": "default", "rope_theta": c.rope_theta}
    assert (cfg["head_dim"], cfg["num_key_value_heads"], cfg["num_attention_heads"]) == (c.head_dim, c.n_kv_head, c.n_head)
    assert (cfg["intermediate_size"], cfg["vocab_size"], cfg["max_position_embeddings"]) == (
        c.intermediate_size, c.vocab_size, c.seq_len)
    assert cfg["tie_word_embeddings"] is tied
    from safetensors.torch import load_file

    assert ("lm_head.weight" in load_file(tmp_path / "model.safetensors")) is not tied
    assert_same_model(model, tmp_path, f"{preset}-{'tied' if tied else 'untied'}-eps{s.eps:g}")


# -- MoE ---------------------------------------------------------------------------------------------------
EXPERT_PLACEMENTS = {"q": "dual", "k": "dual", "v": "dual", "gate": "dual", "up": "dual", "router": "dual"}
MOE_EXPORTABLE = [  # (id, preset, strategy, moe, config, architecture)
    ("qk_norm-softmax", "qk_norm", {}, {}, {}, "Qwen3MoeForCausalLM"),
    ("unified-head-expert-scales-dense-first", "unified", {"output_shape": "head", "branch_specific": False},
     {"scales": "expert", "first_dense_layers": 1, "route_norm": False}, {"n_layer": 3}, "Qwen3MoeForCausalLM"),
    ("baseline-softmax", "baseline", {}, {}, {}, "MixtralForCausalLM"),
    ("dp-router-dual-shared-scale", "dp", {"placement": EXPERT_PLACEMENTS}, {"scales": "shared"}, {},
     "MixtralForCausalLM"),
    ("hg-sigmoid-bias-shared-dense-first", "hg", {},
     {"router": "sigmoid", "bias_balancing": True, "num_shared_experts": 1, "first_dense_layers": 1,
      "route_norm": False}, {"n_layer": 3}, "Glm4MoeForCausalLM"),
    ("unified-head-sigmoid-bias-2shared", "unified", {"output_shape": "head"},
     {"router": "sigmoid", "bias_balancing": True, "num_shared_experts": 2}, {}, "Glm4MoeForCausalLM"),
    ("baseline-sigmoid-no-shared", "baseline", {}, {"router": "sigmoid"}, {}, "Glm4MoeForCausalLM"),
]


@pytest.mark.parametrize("name,preset,strategy,moe,config,arch", MOE_EXPORTABLE, ids=[e[0] for e in MOE_EXPORTABLE])
def test_moe_export_matches_transformers(name, preset, strategy, moe, config, arch, tmp_path):
    model = make_model(preset, strategy, moe=moe, **config)
    assert save_hf(model, tmp_path).architecture == arch
    hf = assert_same_model(model, tmp_path, f"moe-{name}")
    assert type(hf).__name__ == arch
    cfg = json.loads((tmp_path / "config.json").read_text())
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts")
    assert (experts, cfg["num_experts_per_tok"]) == (model.config.moe.num_experts, model.config.moe.top_k)


MOE_REFUSED = [
    ("softmax-shared-bias-dense-route_norm", "baseline", {},
     {"num_shared_experts": 1, "bias_balancing": True, "first_dense_layers": 1, "route_norm": False},
     ["shared experts (model.config.moe.num_shared_experts > 0)", "bias_balancing: true", "router: sigmoid",
      "first_dense_layers: 0", "route_norm: false", "Qwen3-MoE holds it", "--format native"]),
    ("router-dnp", "baseline", {"placement": {"router": "dual_norm"}}, {},
     ["mlp_proj.router", "placement.router: 'dual_norm'"]),
    ("expert-gate-dnp", "baseline", {"placement": {"gate": "dual_norm"}}, {},
     ["mlp_proj.expert*_gate", "placement.gate: 'dual_norm'"]),
]


@pytest.mark.parametrize("name,preset,strategy,moe,words", MOE_REFUSED, ids=[e[0] for e in MOE_REFUSED])
def test_moe_without_a_standard_equivalent_is_refused_by_site(name, preset, strategy, moe, words, tmp_path):
    model = make_model(preset, strategy, moe=moe, n_layer=3)
    with pytest.raises(HFExportError) as info:
        save_hf(model, tmp_path / "out")
    for word in words:
        assert word in str(info.value), f"{word!r} not in: {info.value}"


# -- refusals ---------------------------------------------------------------------------------------------
REFUSED = [
    ("dnp", {}, ["attn_proj.q", "attn_proj.k", "output_shape: 'channel'", "differs between heads",
                 "output_shape: head", "--format native"]),
    ("unified", {}, ["attn_proj.q", "output_shape: head", "--format native"]),
    ("sandwich", {}, ["attn_output", "mlp_output", "sublayer_output_norm: true", "--format native"]),
    ("baseline", {"placement": {"v": "dual_norm"}}, ["attn_proj.v", "placement.v: 'dual_norm'", "--format native"]),
    ("baseline", {"placement": {"gate": "dual_norm"}}, ["mlp_proj.gate", "placement.gate: 'dual_norm'"]),
    ("baseline", {"placement": {"up": "dual_norm"}}, ["mlp_proj.up", "placement.up: 'dual_norm'"]),
    ("baseline", {"placement": {"q": "dual_norm"}}, ["attn_proj.k", "placement.k: 'input'", "both to dual_norm"]),
]


@pytest.mark.parametrize("preset,strategy,words", REFUSED, ids=lambda v: v if isinstance(v, str) else None)
def test_strategies_without_a_standard_equivalent_are_refused_by_site(preset, strategy, words, tmp_path):
    model = make_model(preset, strategy)
    out = tmp_path / "out"
    with pytest.raises(HFExportError) as info:
        save_hf(model, out)
    message = str(info.value)
    for word in words:
        assert word in message, f"{word!r} not in: {message}"
    assert "every layer" in message
    assert not out.exists()  # refused before writing anything


def test_custom_block_is_refused_by_name(tmp_path):
    spec = preset_spec("baseline")
    spec["block"] = {"class_path": "scalevec_lit.model.block.ParallelBlock"}
    with pytest.raises(HFExportError, match=r"ParallelBlock is not the Pre-Norm Block.*--format native"):
        save_hf(build_from_spec(spec), tmp_path / "out")


# -- formats, sharding, checkpoints ------------------------------------------------------------------------
def test_native_format_round_trips_exactly_and_reexports(tmp_path):
    """Native = our unfolded state dict + spec: rebuilt bit-exactly; an exportable one exports later to HF."""
    model = make_model("sandwich", tie_embeddings=True)
    save_native(model, tmp_path / "sandwich")
    spec = json.loads((tmp_path / "sandwich" / "scalevec_spec.json").read_text())
    assert spec == json.loads(json.dumps(model_spec(model.config, model.strategy, type(model.blocks[0]))))
    back = load_native(tmp_path / "sandwich")
    assert back.head_weight is back.embed.weight and back.tied
    idx = torch.randint(0, model.config.vocab_size, (2, 16))
    with torch.no_grad():
        assert torch.equal(back(idx), model(idx))

    unified = make_model("unified", {"output_shape": "head"})
    save_native(unified, tmp_path / "unified")
    assert export(tmp_path / "unified", tmp_path / "hf").architecture == "Qwen3ForCausalLM"
    assert_same_model(unified, tmp_path / "hf", "unified-head-from-native")


def test_sharded_safetensors_with_index(tmp_path):
    model = make_model("qk_norm")
    files = save_hf(model, tmp_path, max_shard_size="300KB").files
    shards = sorted(tmp_path.glob("model-*-of-*.safetensors"))
    assert len(shards) > 2 and not (tmp_path / "model.safetensors").exists()
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {p.name for p in shards} <= set(files)
    from safetensors.torch import load_file

    loaded = [load_file(p) for p in shards]
    total = {k: v for shard in loaded for k, v in shard.items()}
    assert set(total) == set(index["weight_map"])
    assert index["metadata"]["total_size"] == sum(v.numel() * v.element_size() for v in total.values())
    for shard in loaded:  # within the limit, or one tensor larger than the limit (a tensor is never split)
        assert len(shard) == 1 or sum(v.numel() * v.element_size() for v in shard.values()) <= 300_000
    assert_same_model(model, tmp_path, "qk_norm-sharded")


def test_parse_size_and_cli_errors_name_the_option(tmp_path):
    assert parse_size("5GB") == 5_000_000_000 and parse_size("2MiB") == 2 * 1024**2 and parse_size("123") == 123
    with pytest.raises(ExportError, match="--max-shard-size: 'lots'"):
        parse_size("lots")
    with pytest.raises(SystemExit, match=r"error: --ckpt: '.*missing\.ckpt' does not exist"):
        main(["--ckpt", str(tmp_path / "missing.ckpt"), "--out", str(tmp_path / "o")])
    (tmp_path / "folder").mkdir()
    with pytest.raises(SystemExit, match=r"--ckpt: .*folder' is a folder without \.metadata"):
        main(["--ckpt", str(tmp_path / "folder"), "--out", str(tmp_path / "o")])
    torch.save({"state_dict": {"model.embed.weight": torch.zeros(2)}}, tmp_path / "foreign.ckpt")
    with pytest.raises(SystemExit, match=r"no checkpoint\['scalevec'\]\['spec'\]"):
        main(["--ckpt", str(tmp_path / "foreign.ckpt"), "--out", str(tmp_path / "o")])


def test_tokenizer_is_found_through_the_run_config(tmp_path):
    """Both checkpoint layouts of a CLI run, a native folder, a conflict, and the embedded fallback."""
    from scalevec_lit.data.tokenizer import DEFAULT_TOKENIZER
    from scalevec_lit.export import find_tokenizer

    data = tmp_path / "data"
    data.mkdir()
    (data / "meta.json").write_text(json.dumps({"tokenizer": str(DEFAULT_TOKENIZER)}))
    other = tmp_path / "other.json"
    other.write_text(DEFAULT_TOKENIZER.read_text().replace("<|endoftext|>", "<|end_of_text|>"))

    def run(root: str, config: str, text: str) -> Path:
        (tmp_path / root / config).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / root / config).write_text(text)
        return tmp_path / root

    a = run("a", "smoke/version_0/config.yaml", f"data:\n  data_dir: {data}\n")  # <log_dir>/checkpoints/x.ckpt
    path, note = find_tokenizer(a / "smoke/version_0/checkpoints/last.ckpt")
    assert path == DEFAULT_TOKENIZER and note.startswith(f"the tokenizer {data / 'meta.json'} was prepared with")
    b = run("b", "smoke/version_0/config.yaml", f"data:\n  data_dir: {data}\n")  # <root>/checkpoints/x.ckpt
    (b / "checkpoints" / "last.ckpt").mkdir(parents=True)  # a distributed checkpoint folder
    assert find_tokenizer(b / "checkpoints" / "last.ckpt")[0] == DEFAULT_TOKENIZER
    run("b", "smoke/version_1/config.yaml", f"data:\n  tokenizer: {other}\n")  # a resumed run, another tokenizer
    with pytest.raises(ExportError, match=r"name different tokenizers .*other\.json.*pass --tokenizer"):
        find_tokenizer(b / "checkpoints" / "last.ckpt")
    assert find_tokenizer(b / "checkpoints" / "last.ckpt", other) == (other, "given with --tokenizer")
    c = run("c", "config.yaml", "data:\n  data_dir: nowhere/prepared\n")
    path, note = find_tokenizer(c / "checkpoints" / "x.ckpt")
    assert path == DEFAULT_TOKENIZER and "'nowhere/prepared') has no meta.json" in note and "embedded" in note
    (data / "meta.json").write_text(json.dumps({"tokenizer": str(tmp_path / "gone.json")}))
    with pytest.raises(ExportError, match=r"gone\.json'?, which is not there any more; pass --tokenizer"):
        find_tokenizer(a / "smoke/version_0/checkpoints/last.ckpt")


def test_single_file_checkpoint_without_run_config_ships_the_embedded_tokenizer_and_says_so(tmp_path, capsys):
    """A Lightning-style .ckpt (keys ``model.*``, activation-checkpoint wrapper names) and no config.yaml."""
    from scalevec_lit.data.tokenizer import DEFAULT_TOKENIZER

    model = make_model("hg")
    state = {}
    for k, v in model.state_dict().items():
        key = k.replace("blocks.0.", "blocks.0._checkpoint_wrapped_module.")
        state[f"model.{key}"] = v
    spec = preset_spec("hg")
    ckpt = tmp_path / "run" / "checkpoints" / "run.ckpt"
    ckpt.parent.mkdir(parents=True)
    torch.save({"state_dict": state, "scalevec": {"spec": spec}, "epoch": 0}, ckpt)
    main(["--ckpt", str(ckpt), "--out", str(tmp_path / "hf")])
    err = capsys.readouterr().err
    assert "no run config.yaml near the checkpoint: shipping the embedded tokenizer" in err and "--tokenizer" in err
    assert (tmp_path / "hf" / "tokenizer.json").read_bytes() == DEFAULT_TOKENIZER.read_bytes()
    assert_same_model(model, tmp_path / "hf", "hg-from-ckpt-file")


def test_bfloat16_weights(tmp_path):
    model = make_model("qk_norm")
    save_hf(model, tmp_path, dtype="bfloat16")
    from safetensors.torch import load_file

    assert {t.dtype for t in load_file(tmp_path / "model.safetensors").values()} == {torch.bfloat16}
    assert json.loads((tmp_path / "config.json").read_text())["dtype"] == "bfloat16"
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    idx = torch.randint(0, model.config.vocab_size, (1, 16))
    with torch.no_grad():
        a, b = model(idx), hf(input_ids=idx).logits
    assert float((a - b).abs().max() / a.abs().max()) < 2e-2  # bf16 rounding of the weights only


def _dcp_worker(rank: int, world: int, folder: str, spec: dict) -> None:
    """One rank of an FSDP2 model on CPU/gloo, writing a DCP checkpoint as ModelParallelStrategy does."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    module = torch.nn.Module()  # stands for the LightningModule: keys "model.*"
    module.model = build_from_spec(spec)
    perturb_scales_(module.model)
    mesh = init_device_mesh("cpu", (world,))
    for block in module.model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(module.model, mesh=mesh)  # the root, as parallelize() does
    opt = torch.optim.AdamW(module.parameters(), lr=1e-2)
    module.model(torch.randint(0, spec["config"]["vocab_size"], (2, 8))).square().mean().backward()
    opt.step()
    state = {"state_dict": get_model_state_dict(module), "optimizer_0": get_optimizer_state_dict(module, opt)}
    dcp.save(state, checkpoint_id=folder)
    full = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        torch.save({"scalevec": {"spec": spec}, "global_step": 1}, Path(folder) / "meta.pt")
        torch.save(full, Path(folder).parent / "reference.pt")


@pytest.mark.slow
def test_distributed_checkpoint_folder_is_consolidated_and_exported(tmp_path):
    """A DCP folder from 2 gloo processes with FSDP2-sharded weights (as ModelParallelStrategy writes)."""
    folder = tmp_path / "step1.ckpt"
    spec = preset_spec("unified", {"output_shape": "head"})
    spawn_gloo(_dcp_worker, 2, str(folder), spec)
    assert len(list(folder.glob("*.distcp"))) == 2
    reference = torch.load(tmp_path / "reference.pt")
    spec_back, state = read_checkpoint(folder)
    assert spec_back == spec
    assert set(state) == {k[len("model."):] for k in reference}
    assert all(torch.equal(state[k[len("model."):]], v) for k, v in reference.items())

    result = export(folder, tmp_path / "hf", tokenizer=ROOT / "scalevec_lit/data/corpus/tokenizer.json")
    assert result.architecture == "Qwen3ForCausalLM" and result.tokenizer_note == "given with --tokenizer"
    model, _ = load_model(folder)
    assert_same_model(model, tmp_path / "hf", "unified-head-from-dcp")


@pytest.mark.slow
def test_cli_export_of_a_smoke_run_checkpoint(prepared_data, tmp_path):
    """fit (10 steps, qk_norm) → ``python -m scalevec_lit export`` → transformers; the run's tokenizer ships."""
    extra = ("--config", str(ROOT / "recipes/strategy/qk_norm.yaml"), "--data.batch_size=4", "--trainer.limit_val_batches=1",
             "--trainer.num_sanity_val_steps=0")
    fit = run_cli(smoke_args(prepared_data, tmp_path, 10, *extra), cwd=tmp_path)
    assert fit.returncode == 0, fit.stderr[-3000:]
    (ckpt,) = tmp_path.glob("**/checkpoints/last.ckpt")
    out = tmp_path / "hf"
    res = run_cli(["export", "--ckpt", str(ckpt), "--out", str(out)], cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "Qwen3ForCausalLM" in res.stdout
    meta = json.loads((prepared_data / "meta.json").read_text())
    assert f"the tokenizer {prepared_data / 'meta.json'} was prepared with" in res.stderr
    assert (out / "tokenizer.json").read_bytes() == Path(meta["tokenizer"]).read_bytes()

    model, spec = load_model(ckpt)
    assert spec["strategy"]["placement"]["q"] == "dual_norm"
    hf = assert_same_model(model, out, "cli-smoke-qk_norm")
    assert hf.config.eos_token_id == meta["eos_id"]
    from transformers import AutoTokenizer

    from scalevec_lit.data.tokenizer import Tokenizer

    text = "To be, or not to be, that is the question."
    assert AutoTokenizer.from_pretrained(out)(text).input_ids == Tokenizer(meta["tokenizer"]).encode(text, eos=False)

    with pytest.raises(SystemExit, match=r"--out: '.*hf' exists and is not an empty folder.*--overwrite"):
        main(["--ckpt", str(ckpt), "--out", str(out)])
    native = export(ckpt, tmp_path / "native", format="native")
    back = load_native(native.out)
    assert all(torch.equal(a, b) for a, b in zip(back.state_dict().values(), model.state_dict().values()))
