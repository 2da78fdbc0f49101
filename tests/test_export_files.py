"""Export's formats and inputs: the native format's exact round trip, sharded safetensors, size and command
errors, the tokenizer found through the run's config or the embedded one, bf16 weights, a distributed
checkpoint folder consolidated, and the command on a smoke run's checkpoint. The folded models are compared
with what transformers loads (``tests/export_models.py``).
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from export_models import assert_same_model, make_model, perturb_scales_, preset_spec, print_max_rel_diff
from helpers import ROOT, run_cli, smoke_args, spawn_gloo
from scalevec_lit.export import (
    ExportError,
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

# checked without importing it: the DCP test's worker processes re-import this module
pytestmark = pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")


@pytest.fixture(scope="module", autouse=True)
def _report():
    yield
    print_max_rel_diff()


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
