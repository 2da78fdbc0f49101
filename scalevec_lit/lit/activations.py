"""Bytes that autograd saves for the backward, per token, for one block and for the head: a count of the
tensors our block saves (``lit/plan.py`` prints it before a launch; ``tests/test_plan.py`` checks it against
``torch.autograd.graph.saved_tensors_hooks`` on CPU).

Per token, with ``s`` the bytes of an activation element (2 in bf16, 4 in fp32), ``n`` those of a saved
norm input (``s`` on CUDA, whose fused RMSNorm keeps its input as it is; 4 on CPU, whose RMSNorm keeps an
fp32 copy), d the width, H / H_kv the query / key-value heads of ``hd`` channels, f the MLP width:

- attention sublayer: ``n·d + 4`` (norm input, fp32 reciprocal RMS) ``+ s·(d + (H + H_kv)·hd + H_kv·hd +
  H·hd)`` (normalized input that the fused q/k/v matmul keeps, q and k after RoPE, v, the attention output)
  ``+ 4·H`` (fp32 log-sum-exp of flash attention, per head);
- dense MLP: ``n·d + 4 + s·(d + 4f)`` (normalized input, gate|up, silu(gate), the product that W_down reads);
- MoE MLP (E routed experts of width fe, top-k, shared experts of total width fs):
  ``n·d + 4 + s·(d + 2k·d + 4k·fe + k + E + 4·fs)`` (normalized input, the k gathered inputs and k outputs
  per token, the experts' SwiGLU, combine weights, router logits in the site's fused output, shared experts)
  ``+ 4·(E·r + k + 5) + 24k`` (fp32 router scores, r = 2 when they are a cast of bf16 logits; fp32 top-k
  weights and per-token sums; int64 top-k and sort indices);
- per normalized output branch (``dual_norm``): ``4 × groups`` (its fp32 reciprocal RMS per head / row);
  on an accelerator, with an output scale u, also ``s × width``: the normalized input, which
  ``group_norm_rope`` keeps there because telling whether some ``u_j`` is exactly 0 would be a host read
  (on CPU it checks, and recovers it from the output it returns; ``scale/norm_rope.py``);
- ``sublayer_output_norm``: ``2n·d + 4`` per output norm (two per block);
- MoE: the experts' gate and up read one gathered x̂ whatever their scales (γ and an un-normalized u are on
  the weights, recomputed in the backward: ``model/experts.py``); a normalized (``dual_norm``) expert gate
  or up: ``2·n·k·fe + 4k`` (+4 with shared experts) more each.
- head: ``8`` (int64 token ids of the embedding) ``+ n·d + 4 + s·d`` (final norm) ``+ 4·V`` (fp32
  log-softmax of the cross-entropy).

Per block, a few scale-sized tensors (O(d), independent of the tokens) are not counted. The count is that
of the eager block; under ``torch.compile`` the partitioner decides what to keep (``COMPILED_NOTE``). With activation
checkpointing a block keeps only its input (``s·d``) and one block's saved tensors exist at a time, in its
recomputation.

Plain torch only: must not import Lightning.
"""
from __future__ import annotations

from typing import Optional

from ..model.config import TransformerConfig
from ..scale.keeps import branch_keeps, normalized_branches
from ..scale.strategy import ScaleStrategy

FP32, INT64 = 4, 8


def _groups(config: TransformerConfig, branch: str) -> int:
    """Rows of one token whose RMS a normalized output side takes (per head for q/k/v, whole for the MLP)."""
    return {"q": config.n_head, "k": config.n_kv_head, "v": config.n_kv_head}.get(branch, 1)


#: what the partitioner of ``torch.compile`` keeps instead, measured (``benchmarks/compiled.py``)
COMPILED_NOTE = ("torch.compile keeps 7–11% less than this eager count on CPU (smoke shapes, inductor: pointwise "
                 "results recomputed; benchmarks/compiled.py)")


def _keeps_normalized_input(strategy: ScaleStrategy, branch: str, accelerator: bool) -> bool:
    """The branch keeps its input for the backward (the site's answer: ``scale/keeps.py``)."""
    return branch_keeps(strategy, branch, accelerator).normalized_input


def attention_saved_per_token(config: TransformerConfig, strategy: ScaleStrategy, s: int, n: int,
                              accelerator: bool = True) -> int:
    d, hd, h, hkv = config.n_embd, config.head_dim, config.n_head, config.n_kv_head
    out = n * d + FP32 + s * (d + (h + hkv) * hd + hkv * hd + h * hd) + FP32 * h
    out += sum(FP32 * _groups(config, b) for b in normalized_branches(strategy, ("q", "k", "v")))
    width = {"q": h * hd, "k": hkv * hd, "v": hkv * hd}
    out += sum(s * width[b] for b in width if _keeps_normalized_input(strategy, b, accelerator))
    return out


def mlp_saved_per_token(config: TransformerConfig, strategy: ScaleStrategy, layer: int, s: int, n: int,
                        accelerator: bool = True) -> int:
    d, moe = config.n_embd, config.moe
    norm = n * d + FP32
    if moe is None or layer < moe.first_dense_layers:
        normalized = FP32 * len(normalized_branches(strategy, ("gate", "up")))
        kept = sum(s * config.intermediate_size for b in ("gate", "up")
                   if _keeps_normalized_input(strategy, b, accelerator))
        return norm + s * (d + 4 * config.intermediate_size) + normalized + kept
    e, k, fe = moe.num_experts, moe.top_k, moe.expert_intermediate_size
    fs = moe.num_shared_experts * fe
    r = 1 if s == FP32 else 2
    out = norm + s * (d + 2 * k * d + 4 * k * fe + k + e + 4 * fs) + FP32 * (e * r + k + 5) + 3 * INT64 * k
    for b in ("gate", "up"):  # a normalized expert output keeps its k rows and their fp32 reciprocal RMS
        keeps = branch_keeps(strategy, b, accelerator)
        if keeps.reciprocal_rms:
            out += 2 * n * k * fe + FP32 * k + (FP32 if fs else 0)
            if keeps.normalized_input and fs:  # the shared experts' own
                out += s * fs
    return out


def block_saved_per_token(config: TransformerConfig, strategy: ScaleStrategy, layer: int, s: int,
                          n: Optional[int] = None, accelerator: bool = True) -> int:
    """Bytes saved for the backward per token by block ``layer`` (eager, no activation checkpointing);
    ``accelerator``: on a GPU (False: on CPU, where a few tensors are not kept; see the module doc)."""
    n = s if n is None else n
    out = (attention_saved_per_token(config, strategy, s, n, accelerator)
           + mlp_saved_per_token(config, strategy, layer, s, n, accelerator))
    if strategy.sublayer_output_norm:
        out += 2 * (2 * n * config.n_embd + FP32)
    return out


def head_saved_per_token(config: TransformerConfig, s: int, n: Optional[int] = None) -> int:
    """Embedding ids, final norm, LM head input and the fp32 log-softmax of the loss, per token."""
    n = s if n is None else n
    return INT64 + n * config.n_embd + FP32 + s * config.n_embd + FP32 * config.vocab_size


def loss_transient_per_token(config: TransformerConfig, s: int) -> int:
    """What the loss holds on top of the saved tensors at its peak, the start of the backward: the gradient
    of the fp32 log-softmax and that of the fp32 logits (4 V each); the forward's peak (the logits in ``s``
    and their fp32 copy, 6 V in bf16) is not above it."""
    return max(2 * FP32, s + FP32) * config.vocab_size


def saved_per_token(config: TransformerConfig, strategy: ScaleStrategy, s: int, checkpointing: bool,
                    n: Optional[int] = None, accelerator: bool = True) -> tuple[int, int]:
    """``(all blocks, head)`` saved bytes per token at the end of the forward; with activation checkpointing the
    blocks keep their inputs, and the largest block's saved tensors are added (its recomputation)."""
    per_block = [block_saved_per_token(config, strategy, i, s, n, accelerator) for i in range(config.n_layer)]
    blocks = config.n_layer * s * config.n_embd + max(per_block) if checkpointing else sum(per_block)
    return blocks, head_saved_per_token(config, s, n)
