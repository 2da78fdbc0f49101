"""``generate``: the key/value cache gives a full forward's logits (float64, every strategy preset, dense and
MoE), greedy decoding equals transformers' on the exported model, seeded sampling repeats, top-k 1 is
greedy, the filters keep what they promise, text streams whole characters, bad input names its flag.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import json
from pathlib import Path

import pytest
import torch
import yaml

from helpers import ROOT, run_cli, tiny_config
from scalevec_lit.data.tokenizer import DEFAULT_TOKENIZER, Tokenizer
from scalevec_lit.generate import Sampling, TextStream, generate, load_for_generation, next_token
from scalevec_lit.model.spec import build_from_spec
from scalevec_lit.scale.registry import scale_parameters

PRESETS = sorted(p.stem for p in (ROOT / "recipes" / "strategy").glob("*.yaml"))
MOE = {"num_experts": 4, "top_k": 2, "expert_intermediate_size": 32}

# The cached path computes the same function as the full forward; in float64 the two differ only by the
# order of floating-point sums (attention over a longer key axis, matmuls over fewer rows: other BLAS
# blocking). One reordered sum of n terms moves its result by at most n·u relative to the sum of |terms|
# (u = 2^-53); the longest reduction here has n = 128 (the MLP width; 32 keys, 64 channels), each layer
# chains ~10 such reductions, and the norms and softmax (Lipschitz ~1 at these scales) pass errors on
# without growing them by more than ~10 over 2 layers: 128 · 10 · 2 · 10 · u ≈ 3e-12 relative to the
# largest logit. TOL takes that bound; a real fault (wrong RoPE position, a missing or wrong mask, a stale
# key) moves logits by > 1e-3 relative, which the negative control below checks.
U = 2.0 ** -53
TOL = 128 * 10 * 2 * 10 * U


def spec_for(preset: str, moe: bool = False, block: str = "scalevec_lit.model.block.Block", **config) -> dict:
    strat = yaml.safe_load((ROOT / "recipes" / "strategy" / f"{preset}.yaml").read_text())["model"]["strategy"]
    cfg = dataclasses.asdict(tiny_config(**config))
    if moe:
        cfg["moe"] = dict(MOE)
    return {"config": cfg, "strategy": strat, "block": {"class_path": block}}


@torch.no_grad()
def perturbed(spec: dict, seed: int = 1):
    """The model of ``spec`` with every scale moved away from its init (so that no branch reads γ = 1)."""
    torch.manual_seed(0)
    model = build_from_spec(spec).eval()
    gen = torch.Generator().manual_seed(seed)
    for sp in scale_parameters(model):
        sp.param.add_(0.3 * torch.randn(sp.param.shape, generator=gen))
    for module in model.modules():
        if getattr(module, "expert_bias", None) is not None:
            module.expert_bias.add_(0.05 * torch.randn(module.expert_bias.shape, generator=gen))
    return model


@torch.no_grad()
def cached_logits(model, idx: torch.Tensor, chunks: tuple[int, ...]) -> torch.Tensor:
    """Logits of ``idx`` run through the cache in pieces of the given lengths, then one token at a time."""
    cache = model.new_cache()
    out, at = [], 0
    for n in chunks:
        out.append(model.forward_cached(idx[:, at : at + n], cache))
        at += n
    while at < idx.shape[1]:
        out.append(model.forward_cached(idx[:, at : at + 1], cache))
        at += 1
    return torch.cat(out, dim=1)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


CASES = [(p, False) for p in PRESETS] + [(p, True) for p in PRESETS]


@pytest.mark.parametrize("preset, moe", CASES, ids=[f"{p}-{'moe' if m else 'dense'}" for p, m in CASES])
def test_cache_gives_the_full_forward_logits_in_float64(preset, moe):
    model = perturbed(spec_for(preset, moe)).double()
    idx = torch.randint(0, model.config.vocab_size, (2, model.config.seq_len), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(idx)
    got = cached_logits(model, idx, (7, 3))  # a prompt, a 3-token piece (masked, after cached keys), then singles
    assert got.shape == full.shape
    assert rel(got, full) <= TOL, f"{preset}: {rel(got, full):.3g}"
    # negative control: the same decode with the cache one position short (a stale key) is far off
    with torch.no_grad():
        cache = model.new_cache()
        model.forward_cached(idx[:, :10], cache)
        cache.length -= 1
        wrong = model.forward_cached(idx[:, 10:11], cache)
    assert rel(wrong, full[:, 10:11]) > 1e-3


def test_cache_on_a_parallel_block_and_the_training_path_never_sees_it():
    spec = spec_for("unified", block="scalevec_lit.model.ParallelBlock")
    model = perturbed(spec).double()
    idx = torch.randint(0, model.config.vocab_size, (1, model.config.seq_len))
    with torch.no_grad():
        full = model(idx)
    assert rel(cached_logits(model, idx, (5,)), full) <= TOL
    assert all(m.kv_cache is None for m in model.attention_layers())  # released after every cached call
    with pytest.raises(ValueError, match="the cache holds 32 positions; 30 are filled and 3 more"):
        cache = model.new_cache()
        model.forward_cached(idx[:, :30], cache)
        model.forward_cached(idx[:, :3], cache)


# -- checkpoints as fit writes them: a single file and a distributed (DCP) folder ------------------------------
def tokenizer_record() -> dict:
    return {"path": str(DEFAULT_TOKENIZER), "sha256": Tokenizer(DEFAULT_TOKENIZER).fingerprint(), "vocab_size": 4096}


def write_ckpt(model, spec: dict, path: Path) -> Path:
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save({"state_dict": state, "scalevec": {"spec": spec, "tokenizer": tokenizer_record()}}, path)
    return path


def write_dcp(model, spec: dict, folder: Path) -> Path:
    """The layout ModelParallelStrategy writes: ``*.distcp`` + ``.metadata`` (tensors) and ``meta.pt`` (the rest)."""
    import torch.distributed.checkpoint as dcp

    state = {f"model.{k}": v.clone() for k, v in model.state_dict().items()}
    dcp.save({"state_dict": state}, checkpoint_id=str(folder))
    torch.save({"scalevec": {"spec": spec, "tokenizer": tokenizer_record()}}, folder / "meta.pt")
    return folder


needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="transformers is in the test extra")


@needs_transformers
@pytest.mark.parametrize("preset, moe, arch", [("hg", False, "LlamaForCausalLM"), ("qk_norm", False, "Qwen3ForCausalLM"),
                                               ("baseline", True, "MixtralForCausalLM")])
def test_greedy_equals_transformers_on_the_exported_model(preset, moe, arch, tmp_path):
    from transformers import AutoModelForCausalLM

    from scalevec_lit.export import export

    spec = spec_for(preset, moe, seq_len=64)
    ckpt = write_ckpt(perturbed(spec), spec, tmp_path / "run.ckpt")
    assert export(ckpt, tmp_path / "hf").architecture == arch
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    model, tok, note = load_for_generation(str(ckpt))
    assert "recorded in the checkpoint" in note
    prompt = torch.tensor([tok.encode("ROMEO: What light through yonder window", eos=False)])
    n = 64 - prompt.shape[1]  # to the end of the context
    theirs = hf.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n, do_sample=False,
                         eos_token_id=None, pad_token_id=0)[:, prompt.shape[1]:]
    ours = generate(model, prompt, n)
    assert theirs.shape == ours.shape == (1, n)
    assert torch.equal(ours, theirs)
    assert torch.equal(generate(model, prompt, n, use_cache=False), ours)

    dcp_model, _, _ = load_for_generation(str(write_dcp(model, spec, tmp_path / "dcp")))
    assert torch.equal(generate(dcp_model, prompt, n), ours)


@pytest.mark.slow
@needs_transformers
def test_cli_greedy_text_equals_transformers_and_streams(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from scalevec_lit.export import export

    spec = spec_for("unified", moe=True, seq_len=48)
    spec["strategy"]["output_shape"] = "head"  # exportable as Qwen3-MoE
    spec["config"]["moe"]["first_dense_layers"] = 1
    dcp = write_dcp(perturbed(spec), spec, tmp_path / "step.ckpt")
    export(dcp, tmp_path / "hf")
    hf = AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32).eval()
    hf_tok = AutoTokenizer.from_pretrained(tmp_path / "hf")
    prompt = "ROMEO:"
    ids = hf_tok(prompt, return_tensors="pt").input_ids
    out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=20, do_sample=False,
                      eos_token_id=None, pad_token_id=0)
    expected = prompt + hf_tok.decode(out[0, ids.shape[1]:])
    res = run_cli(["generate", "--ckpt", str(dcp), "--prompt", prompt, "--temperature", "0", "--max-new-tokens", "20",
                   "--ignore-eos"], cwd=tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout == expected + "\n"
    assert "generated 20 tokens" in res.stderr and "key/value cache on" in res.stderr and "greedy" in res.stderr


# -- sampling ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def small():
    spec = spec_for("unified", seq_len=64)
    return perturbed(spec), spec


def test_seeded_sampling_repeats_and_top_k_one_is_greedy(small):
    model, _ = small
    prompt = torch.randint(0, 4096, (1, 6), generator=torch.Generator().manual_seed(5))
    s = Sampling(temperature=1.2, top_k=200, top_p=0.95)

    def sample(seed, sampling=s):
        return generate(model, prompt, 40, sampling, generator=torch.Generator().manual_seed(seed))

    assert torch.equal(sample(7), sample(7))
    assert not torch.equal(sample(7), sample(8))
    assert torch.equal(generate(model, prompt, 40, s, generator=torch.Generator().manual_seed(7), use_cache=False),
                       sample(7))
    greedy = generate(model, prompt, 40)
    assert torch.equal(sample(7, Sampling(temperature=1.5, top_k=1)), greedy)
    assert torch.equal(sample(9, Sampling(temperature=1.5, top_p=1e-9)), greedy)  # only the top token is left


def test_top_k_and_top_p_keep_what_they_promise():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs.log().repeat(20000, 1)
    gen = torch.Generator().manual_seed(0)
    draws = next_token(logits, Sampling(temperature=1.0, top_p=0.8), gen)
    assert set(draws.tolist()) == {0, 1}  # 0.5 + 0.3 reaches 0.8: tokens 2 and 3 are cut
    share = float((draws == 0).double().mean())  # renormalized: 0.5 / 0.8
    assert abs(share - 0.625) < 4 * (0.625 * 0.375 / 20000) ** 0.5
    draws = next_token(logits, Sampling(temperature=1.0, top_k=3), gen)
    assert set(draws.tolist()) == {0, 1, 2}
    share = float((draws == 2).double().mean())  # 0.15 / 0.95
    p = 0.15 / 0.95
    assert abs(share - p) < 4 * (p * (1 - p) / 20000) ** 0.5
    cold = next_token(logits[:2000], Sampling(temperature=0.05), gen)  # p ∝ probs^20: token 0 all but surely
    assert set(cold.tolist()) == {0}


def test_eos_stops_a_row_and_pads_it(small):
    model, _ = small
    prompt = torch.randint(0, 4096, (2, 5), generator=torch.Generator().manual_seed(1))
    free = generate(model, prompt, 12)
    eos = int(free[0, 3])  # pretend row 0's fourth greedy token is the end of text
    out = generate(model, prompt, 12, eos_id=eos)
    first = [int((row == eos).nonzero()[0]) if (row == eos).any() else None for row in free]
    for row, stop in zip(range(2), first):
        if stop is not None:
            assert torch.equal(out[row, : stop + 1], free[row, : stop + 1]) and (out[row, stop:] == eos).all()


def test_text_stream_writes_whole_characters():
    tok = Tokenizer(DEFAULT_TOKENIZER)
    text = " naïve café — 😀 ok"
    ids = tok.encode(text, eos=False)
    pieces: list[str] = []

    class Sink(io.StringIO):
        def write(self, s):
            pieces.append(s)
            return len(s)

    stream = TextStream(tok, Sink())
    for i in ids:
        stream.push(i)
    assert stream.close() == text
    assert "".join(pieces) == text and not any("\ufffd" in p for p in pieces)
    assert len(ids) > len(pieces) > 1  # the emoji's bytes span several tokens and wait for the last


# -- bad input: one paragraph naming the flag and the fix, exit 2, no traceback --------------------------------
def run_main(argv: list[str]) -> tuple[int, str, str]:
    from scalevec_lit.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as info:
        main(["generate", *argv])
    return info.value.code, out.getvalue(), err.getvalue()


def test_bad_input_names_the_flag_and_the_fix(small, tmp_path):
    model, spec = small
    ckpt = str(write_ckpt(model, spec, tmp_path / "m.ckpt"))
    cases = [
        ([str(tmp_path / "missing.ckpt"), "hi"], ["--ckpt:", "missing.ckpt", "does not exist", "give a Lightning .ckpt"]),
        ([ckpt, ""], ["--prompt:", "is empty", "give some text, e.g. --prompt"]),
        ([ckpt, "   "], ["--prompt:", "is empty"]),
        ([ckpt, "hi", "--top-p", "0"], ["--top-p: 0.0:", "must be in (0, 1]", "use e.g. --top-p 0.9"]),
        ([ckpt, "hi", "--top-p", "1.5"], ["--top-p: 1.5:", "must be in (0, 1]"]),
        ([ckpt, "hi", "--top-k", "0"], ["--top-k: 0:", "must be at least 1", "leave --top-k out"]),
        ([ckpt, "hi", "--temperature", "-1"], ["--temperature: -1.0:", "≥ 0", "--temperature 0 for greedy"]),
        ([ckpt, "hi", "--num-samples", "0"], ["--num-samples: 0:", "at least 1"]),
        ([ckpt, "hi", "--max-new-tokens", "500"], ["--max-new-tokens: 500:", "context of 64 tokens",
                                                   "use --max-new-tokens 63 or less"]),
        ([ckpt, "hi " * 80], ["--prompt:", "leaves no room in the model's context of 64", "shorten the prompt"]),
    ]
    for (path, prompt, *rest), words in cases:
        code, out, err = run_main(["--ckpt", path, "--prompt", prompt, *rest])
        assert code == 2, (rest, err)
        assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err, err
        for w in words:
            assert w in err, (w, err)


def test_cli_samples_are_reproducible_by_seed(small, tmp_path):
    model, spec = small
    ckpt = str(write_ckpt(model, spec, tmp_path / "m.ckpt"))
    args = ["--ckpt", ckpt, "--prompt", "To be", "--max-new-tokens", "15", "--ignore-eos", "--top-k", "50"]

    def run(*extra):
        from scalevec_lit.cli import main

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            main(["generate", *args, *extra])
        return out.getvalue()

    two = run("--seed", "3", "--num-samples", "2")
    assert two == run("--seed", "3", "--num-samples", "2")
    assert two.count("--- sample ") == 2 and two.count("To be") == 2
    second = two.split("--- sample 2 of 2 (seed 4) ---\n")[1]
    assert run("--seed", "4") == second  # sample i uses seed + i
    assert run("--seed", "3") != run("--seed", "4")
