"""``evaluate`` (lm-eval on a native checkpoint or a Hugging Face folder), offline, on the local tasks of
``tests/data/evaluate_tasks`` (a multiple-choice, a generate_until and a perplexity task read from JSON Lines):

- the log-likelihoods ``ScaleVecLM`` returns equal a direct float64 computation with the model, one request at
  a time (no batching, no padding; a context longer than the model's 32 tokens truncated from the left);
- the accuracies in the results JSON equal those recomputed from the returned log-likelihoods, and the
  generations equal greedy decoding without the key/value cache;
- a Hugging Face folder (a tiny transformers Llama) scores as transformers' own model does;
- bad input (an unknown task, a missing checkpoint, another tokenizer, lm-eval not installed) is one clear error.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import sys

import pytest
import torch
import torch.nn.functional as F
import yaml

from helpers import ROOT, main_in_process, tiny_config

pytest.importorskip("lm_eval", reason="lm-eval is in the test extra (pip install -e '.[test]')")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # the tasks read local files: nothing may reach the network
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from scalevec_lit.data.tokenizer import DEFAULT_TOKENIZER, Tokenizer  # noqa: E402
from scalevec_lit.model.spec import build_from_spec  # noqa: E402
from scalevec_lit.scale.registry import scale_parameters  # noqa: E402

TASKS = ROOT / "tests" / "data" / "evaluate_tasks"
pytestmark = [pytest.mark.usefixtures("one_thread")]

# float64, batched and padded (the wrapper) vs one request at a time (here): the two differ only by the order
# of floating-point sums (other BLAS blocking for other row counts). As in test_generate, one reordered sum
# of n terms moves its result by ≤ n·u relative to the sum of |terms| (u = 2^-53); the longest reduction is
# the log-sum-exp over the 4096-token vocabulary and a logit chains ~40 reductions (2 layers), so a token's
# log-probability moves by ≤ 4096·40·u relative to the largest |logit| (< 50 here): ≤ 1e-9 per token, and a
# request sums ≤ 32 tokens. A real fault (a position off by one, a wrong truncation, a padded token scored)
# moves it by > 0.1.
TOL64 = 32 * 50 * 4096 * 40 * 2.0 ** -53
# float32 (the command) vs float64, per scored token: the 64-channel matmuls of ~10 chained layers, each
# ≤ 64·u32 relative (u32 = 2^-24) of |logit| < 50: ≤ 2e-3 (in practice ~1e-5); a fault is > 0.1.
TOL32_PER_TOKEN = 50 * 64 * 10 * 2.0 ** -24


@pytest.fixture()
def at_root(monkeypatch):
    """The task YAML names its data files relative to the repository root (lm-eval's rule: the working folder)."""
    monkeypatch.chdir(ROOT)


def spec_for(preset: str, moe: bool) -> dict:
    strat = yaml.safe_load((ROOT / "recipes" / "strategy" / f"{preset}.yaml").read_text())["model"]["strategy"]
    cfg = dataclasses.asdict(tiny_config())
    if moe:
        cfg["moe"] = {"num_experts": 4, "top_k": 2, "expert_intermediate_size": 32}
    return {"config": cfg, "strategy": strat, "block": {"class_path": "scalevec_lit.model.block.Block"}}


@torch.no_grad()
def trained_like(spec: dict):
    """The model of ``spec`` with its scales moved away from their init (no branch reads γ = 1)."""
    torch.manual_seed(0)
    model = build_from_spec(spec).eval()
    gen = torch.Generator().manual_seed(1)
    for sp in scale_parameters(model):
        sp.param.add_(0.3 * torch.randn(sp.param.shape, generator=gen))
    return model


def write_ckpt(model, spec: dict, path):
    tok = Tokenizer(DEFAULT_TOKENIZER)
    state = {f"model.{k}": v for k, v in model.state_dict().items()}
    torch.save({"state_dict": state, "scalevec": {"spec": spec, "tokenizer": tok.identity()}}, path)
    return path


@torch.no_grad()
def direct_loglik(model, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """log p(continuation | context) in float64, one sequence, the last seq_len + 1 tokens kept."""
    L = model.config.seq_len
    seq = (context + continuation)[-(L + 1):]
    logp = F.log_softmax(model(torch.tensor([seq[:-1]])).double()[0], dim=-1)
    k = len(continuation)
    rows = logp[len(seq) - 1 - k:]
    target = torch.tensor(seq[-k:])
    return float(rows.gather(-1, target[:, None]).sum()), bool((rows.argmax(-1) == target).all())


def split_pair(tok: Tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's split: trailing spaces of the context move to the continuation; the continuation's tokens are
    those of the whole text after the context's (an empty context is the end-of-text token)."""
    if not context:
        return [tok.eos_id], tok.encode(continuation, eos=False)
    n = len(context) - len(context.rstrip())
    if n:
        context, continuation = context[:-n], context[-n:] + continuation
    whole, ctx = tok.encode(context + continuation, eos=False), tok.encode(context, eos=False)
    return ctx, whole[len(ctx):]


def run(lm, tasks, **kw):
    from scalevec_lit.evaluate.harness import run_tasks, task_manager

    return run_tasks(lm, tasks, task_manager(tasks, [str(TASKS)]), log_samples=True, bootstrap_iters=0, **kw)


def check_choice_accuracy(results: dict, samples: list[dict]) -> None:
    """acc and acc_norm of the JSON = recomputed from the returned log-likelihoods (lm-eval's definitions)."""
    acc = norm = 0
    for s in samples:
        lls = [r[0][0] for r in s["resps"]]
        lens = [len(c) for c in s["doc"]["choices"]]
        acc += max(range(len(lls)), key=lambda i: (lls[i], -i)) == s["doc"]["gold"]
        norm += max(range(len(lls)), key=lambda i: (lls[i] / lens[i], -i)) == s["doc"]["gold"]
    assert results["acc,none"] == acc / len(samples)
    assert results["acc_norm,none"] == norm / len(samples)


@pytest.mark.parametrize("preset, moe", [("unified", False), ("baseline", True)], ids=["unified-dense", "baseline-moe"])
def test_loglikelihoods_equal_a_direct_float64_computation(preset, moe, at_root):
    from scalevec_lit.evaluate import ScaleVecLM
    from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

    model = trained_like(spec_for(preset, moe)).double()
    tok = Tokenizer(DEFAULT_TOKENIZER)
    lm = ScaleVecLM(model, tok, batch_size=3)
    assert lm.use_cache and lm.max_length == 32  # generate_until decodes with the key/value cache
    out = run(lm, ["tiny_choice", "tiny_rolling"])
    samples = out["samples"]["tiny_choice"]
    assert len(samples) == 10
    truncated = 0
    for s in samples:
        for (context, continuation), ((got, greedy),) in zip(s["arguments"], s["resps"]):
            ctx, cont = split_pair(tok, context, continuation)
            truncated += len(ctx) + len(cont) > model.config.seq_len + 1
            want, want_greedy = direct_loglik(model, ctx, cont)
            assert abs(got - want) <= TOL64, (context, continuation, got, want)
            assert greedy == want_greedy
    assert truncated == 3  # the long context, once per choice: scored on its last 33 tokens
    check_choice_accuracy(out["results"]["tiny_choice"], samples)
    # perplexity: each document in lm-eval's rolling windows of 32 tokens, each token predicted once
    total_ll = total_bytes = 0
    for s in out["samples"]["tiny_rolling"]:
        text = s["doc"]["text"]
        windows = [make_disjoint_window(w) for w in get_rolling_token_windows(
            tok.encode(text, eos=False), prefix_token=tok.eos_id, max_seq_len=32, context_len=1)]
        want = sum(direct_loglik(model, c, p)[0] for c, p in windows)
        assert abs(s["resps"][0][0] - want) <= TOL64 * len(windows)
        total_ll, total_bytes = total_ll + want, total_bytes + len(text.encode())
    assert len(tok.encode(out["samples"]["tiny_rolling"][0]["doc"]["text"], eos=False)) > 32  # two windows
    bpb = out["results"]["tiny_rolling"]["bits_per_byte,none"]
    assert abs(bpb - (-total_ll / total_bytes / math.log(2))) <= 1e-9 * bpb


def test_command_on_a_checkpoint_writes_the_table_json_and_samples(tmp_path, capfd, at_root):
    """An MoE checkpoint of the unified strategy, float32, batch 4, --limit 4: the JSON's accuracies are those
    of the returned log-likelihoods, which match float64; generations are greedy decoding without the cache."""
    from scalevec_lit.generate import Sampling, generate

    spec = spec_for("unified", moe=True)
    model = trained_like(spec)
    ckpt = write_ckpt(model, spec, tmp_path / "m.ckpt")
    out = tmp_path / "eval" / "results.json"
    code, text = main_in_process(capfd, ["evaluate", "--ckpt_path", ckpt, "--tasks", "tiny_choice,tiny_gen",
                                         "--include_path", TASKS, "--limit", "4", "--batch_size", "4",
                                         "--out", out, "--log_samples"])  # docs/evaluate.md's options, on the test tasks
    assert code == 0, text[-3000:]
    assert "|tiny_choice|" in text and "|acc_norm" in text and "|tiny_gen   |" in text  # lm-eval's table
    data = json.loads(out.read_text())
    assert {"results", "configs", "versions", "n-shot", "n-samples", "config"} <= set(data)
    assert data["n-samples"]["tiny_choice"] == {"original": 10, "effective": 4}
    assert data["config"]["model"] == str(ckpt) and data["config"]["limit"] == 4
    choice = [json.loads(line) for line in (tmp_path / "eval" / "results_samples_tiny_choice.jsonl").open()]
    check_choice_accuracy(data["results"]["tiny_choice"], choice)
    tok = Tokenizer(DEFAULT_TOKENIZER)
    model64 = trained_like(spec).double()
    for s in choice:
        for (context, continuation), ((got, _),) in zip(s["arguments"], s["resps"]):
            ctx, cont = split_pair(tok, context, continuation)
            assert abs(got - direct_loglik(model64, ctx, cont)[0]) <= TOL32_PER_TOKEN * len(cont)
    gen = [json.loads(line) for line in (tmp_path / "eval" / "results_samples_tiny_gen.jsonl").open()]
    assert len(gen) == 4
    for s in gen:
        prompt = torch.tensor([tok.encode(s["arguments"][0][0], eos=False)])
        ids = generate(model, prompt, 6, Sampling(temperature=0.0), eos_id=tok.eos_id, use_cache=False)[0].tolist()
        want = tok.decode(ids[:ids.index(tok.eos_id)] if tok.eos_id in ids else ids).split("\n")[0]
        assert s["resps"][0][0] == want
        assert s["exact_match"] == float(want == s["target"])
    assert data["results"]["tiny_gen"]["exact_match,none"] == sum(s["exact_match"] for s in gen) / 4


def test_command_on_a_hugging_face_folder_scores_as_transformers(tmp_path, capfd, at_root):
    """A tiny transformers Llama with the embedded tokenizer: imported in memory, nothing written beside it;
    its log-likelihoods in float64 equal transformers' own model's."""
    transformers = pytest.importorskip("transformers")
    from scalevec_lit.evaluate import ScaleVecLM, load_for_evaluation

    config = transformers.LlamaConfig(vocab_size=4096, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, intermediate_size=48, max_position_embeddings=32)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(config).eval()
    folder = tmp_path / "tiny-llama"
    hf.save_pretrained(folder)
    shutil.copy(DEFAULT_TOKENIZER, folder / "tokenizer.json")
    before = sorted(p.name for p in folder.iterdir())
    out = tmp_path / "hf.json"
    code, text = main_in_process(capfd, ["evaluate", "--ckpt_path", folder, "--tasks", "tiny_choice",
                                         "--include_path", TASKS, "--out", out, "--bootstrap_iters", "0"])
    assert code == 0, text[-3000:]
    assert "Hugging Face LlamaForCausalLM" in text and "(imported in memory)" in text
    assert sorted(p.name for p in folder.iterdir()) == before
    acc = json.loads(out.read_text())["results"]["tiny_choice"]["acc,none"]
    code, text = main_in_process(capfd, ["evaluate", "--ckpt_path", folder, "--tasks", "tiny_choice", "--include_path",
                                         TASKS, "--tokenizer", other_tokenizer(tmp_path / "other.json")])
    assert code == 2 and "error: --tokenizer:" in text and f"is not the tokenizer of {folder}" in text

    model, tok, _ = load_for_evaluation(folder)
    result = run(ScaleVecLM(model.double(), tok, batch_size=5), ["tiny_choice"])
    assert result["results"]["tiny_choice"]["acc,none"] == acc
    hf64 = hf.double()
    for s in result["samples"]["tiny_choice"]:
        for (context, continuation), ((got, _),) in zip(s["arguments"], s["resps"]):
            ctx, cont = split_pair(tok, context, continuation)
            seq = (ctx + cont)[-33:]
            with torch.no_grad():
                logp = F.log_softmax(hf64(torch.tensor([seq[:-1]])).logits[0], dim=-1)
            want = float(logp[len(seq) - 1 - len(cont):].gather(-1, torch.tensor(seq[-len(cont):])[:, None]).sum())
            assert abs(got - want) <= TOL64, (context, continuation, got, want)


def other_tokenizer(path):
    """The embedded tokenizer with two tokens' ids swapped: the same size, another tokenizer."""
    data = json.loads(DEFAULT_TOKENIZER.read_text())
    vocab = data["model"]["vocab"]
    a, b = "the", "and"
    vocab[a], vocab[b] = vocab[b], vocab[a]
    path.write_text(json.dumps(data))
    return path


def test_bad_input_is_one_clear_error(tmp_path, capfd, at_root, monkeypatch):
    spec = spec_for("baseline", moe=False)
    ckpt = write_ckpt(trained_like(spec), spec, tmp_path / "m.ckpt")
    base = ["evaluate", "--include_path", TASKS, "--ckpt_path"]
    cases = [
        (base + [ckpt, "--tasks", "tiny_choise"], ["--tasks: tiny_choise: is not a task lm-eval knows",
                                                   "close names: tiny_choice", "--include_path"]),
        (base + [tmp_path / "missing.ckpt", "--tasks", "tiny_choice"],
         ["--ckpt_path:", "missing.ckpt: does not exist", "give a .ckpt of fit"]),
        (base + [ckpt, "--tasks", "tiny_choice", "--tokenizer", other_tokenizer(tmp_path / "other.json")],
         ["--tokenizer:", "other.json", "is not the tokenizer the model was trained with"]),
        (base + [ckpt, "--tasks", "tiny_choice", "--limit", "0"], ["--limit: 0.0: must be above 0"]),
        (base + [ckpt, "--tasks", "tiny_choice", "--log_samples"], ["--log_samples", "needs --out"]),
        (base + [ckpt, "--tasks", " , "], ["--tasks:", "names no task"]),
        (["evaluate", "--ckpt_path", ckpt, "--tasks", "tiny_choice", "--include_path", tmp_path / "nope"],
         ["--include_path:", "nope: is not a folder"]),
    ]
    for args, parts in cases:
        code, text = main_in_process(capfd, args)
        errors = [line for line in text.splitlines() if line.startswith("error: ")]
        assert code == 2 and len(errors) == 1 and "Traceback" not in text, text[-2000:]
        for part in parts:
            assert part in errors[0], (part, errors[0])
    monkeypatch.setitem(sys.modules, "lm_eval", None)  # as if lm-eval were not installed
    code, text = main_in_process(capfd, base + [ckpt, "--tasks", "tiny_choice"])
    assert code == 2 and "error: evaluate: lm-eval: is not installed" in text and "pip install -e '.[eval]'" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.ckpt", "other.json"]  # nothing written
