"""The models the export tests share (``tests/test_export.py``, ``tests/test_export_files.py``,
``tests/test_adapters.py``): a strategy preset built tiny with its scales moved off their init, and the
comparison with what transformers loads from an exported folder (logits within ``REL_TOL`` relative, the same
``GEN_TOKENS`` greedy tokens). Test files import it as ``from export_models import ...``.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

import torch
import yaml

from helpers import ROOT, tiny_config
from scalevec_lit.model.spec import build_from_spec
from scalevec_lit.scale.registry import scale_parameters

REL_TOL = 1e-4
GEN_TOKENS = 20
MAX_REL_DIFF: dict[str, float] = {}  # printed at the end of each test module (pytest -s)


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


def print_max_rel_diff() -> None:
    """The largest relative logit difference of each model compared so far (then forgotten)."""
    if MAX_REL_DIFF:
        print("\nmax relative logit difference, ours vs transformers:")
        for name, rel in MAX_REL_DIFF.items():
            print(f"  {name:40s} {rel:.2e}")
        MAX_REL_DIFF.clear()
