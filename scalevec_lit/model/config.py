"""TransformerConfig: the shape of a dense or MoE decoder, and the named sizes.

A dataclass that jsonargparse reads from YAML (``model.config``). The same config builds on the meta
device for parameter counts and FLOPs without allocating (``count_parameters`` in ``transformer.py``).

Plain torch only: must not import Lightning.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import Literal, Optional


@dataclass
class MoEConfig:
    """Mixture-of-experts MLP (token-choice top-k, dropless). See ``scalevec_lit/model/moe.py``."""

    num_experts: int = 8
    top_k: int = 2
    expert_intermediate_size: Optional[int] = None  # default: the dense intermediate size / top_k
    num_shared_experts: int = 0
    router: Literal["softmax", "sigmoid"] = "softmax"
    #: Scales of the MLP-input norm: ``shared``: one γ read by router and experts (as Mixtral and Qwen3-MoE),
    #: or one each for router, gate and up when ``model.strategy.branch_specific`` (HG); ``expert``: one γ
    #: for the router and one per routed expert (not combinable with branch_specific).
    scales: Literal["shared", "expert"] = "shared"
    aux_loss_coef: float = 0.01
    z_loss_coef: float = 0.001
    bias_balancing: bool = False  # auxiliary-loss-free balancing (DeepSeek-V3 style)
    bias_update_rate: float = 0.001
    first_dense_layers: int = 0  # the first N blocks keep a dense MLP
    #: Divide the top-k combine weights by their sum (so they sum to 1), as Mixtral and DeepSeek-V3.
    route_norm: bool = True
    #: Expert matmuls: ``grouped_mm`` (one ``torch._grouped_mm`` per projection), ``loop`` (one matmul per
    #: expert), or ``auto`` (grouped_mm where it runs: fp32/bf16/fp16 with 16-byte aligned rows; bf16 only
    #: under torch.compile).
    expert_matmul: Literal["auto", "grouped_mm", "loop"] = "auto"

    def __post_init__(self) -> None:
        choices = {"router": ("softmax", "sigmoid"), "scales": ("shared", "expert"),
                   "expert_matmul": ("auto", "grouped_mm", "loop")}
        for key, allowed in choices.items():
            if getattr(self, key) not in allowed:
                raise ValueError(
                    f"model.config.moe.{key}: {getattr(self, key)!r} is not one of {', '.join(allowed)}"
                )
        if self.num_experts < 1:
            raise ValueError(f"model.config.moe.num_experts: {self.num_experts} must be at least 1")
        for key in ("num_shared_experts", "first_dense_layers", "aux_loss_coef", "z_loss_coef", "bias_update_rate"):
            if getattr(self, key) < 0:
                raise ValueError(f"model.config.moe.{key}: {getattr(self, key)} must not be negative")


@dataclass
class TransformerConfig:
    """A Llama-style decoder: RoPE, grouped-query attention, SwiGLU, Pre-Norm RMSNorm.

    ``vocab_size`` and ``seq_len`` are linked from the data module by the CLI, so a recipe cannot
    disagree with its tokenizer.
    """

    vocab_size: int = 4096
    seq_len: int = 256
    n_layer: int = 4
    n_embd: int = 128
    n_head: int = 4
    n_kv_head: Optional[int] = None  # None: n_head (multi-head); fewer: grouped-query attention
    head_dim: Optional[int] = None  # None: n_embd // n_head
    intermediate_size: Optional[int] = None  # None: 8/3 n_embd rounded up to multiple_of
    multiple_of: int = 64
    rope_theta: float = 10000.0
    tie_embeddings: bool = False
    init_std: float = 0.02
    moe: Optional[MoEConfig] = None

    def __post_init__(self) -> None:
        if isinstance(self.moe, dict):
            self.moe = MoEConfig(**self.moe)
        if self.n_kv_head is None:
            self.n_kv_head = self.n_head
        if self.head_dim is None:
            if self.n_embd % self.n_head:
                raise ValueError(
                    f"model.config.n_head: {self.n_head} does not divide n_embd={self.n_embd}; "
                    "choose n_head dividing n_embd or set head_dim"
                )
            self.head_dim = self.n_embd // self.n_head
        if self.n_head % self.n_kv_head:
            raise ValueError(
                f"model.config.n_kv_head: {self.n_kv_head} does not divide n_head={self.n_head}; "
                "grouped-query attention needs n_head to be a multiple of n_kv_head"
            )
        if self.head_dim % 2:
            raise ValueError(f"model.config.head_dim: {self.head_dim} is odd; RoPE needs an even head_dim")
        if self.intermediate_size is None:
            hidden = int(8 * self.n_embd / 3)
            self.intermediate_size = self.multiple_of * -(-hidden // self.multiple_of)
        if self.moe is not None and self.moe.expert_intermediate_size is None:
            self.moe.expert_intermediate_size = max(self.multiple_of, self.intermediate_size // self.moe.top_k)
        if self.moe is not None and not 1 <= self.moe.top_k <= self.moe.num_experts:
            raise ValueError(
                f"model.config.moe.top_k: {self.moe.top_k} must be between 1 and num_experts={self.moe.num_experts}"
            )

    @property
    def residual_init_std(self) -> float:
        """The initial std of a matrix that writes into the residual stream (W_o, W_down, the experts' down
        maps, a user sublayer's output map): ``init_std / √(2 n_layer)``, GPT-2's depth scaling."""
        return self.init_std / math.sqrt(2 * self.n_layer)

    @classmethod
    def unresolved(cls, **values) -> "TransformerConfig":
        """An instance whose derived fields (n_kv_head, head_dim, intermediate_size) stay ``None``.

        Used as the default in signatures that jsonargparse reads: it takes defaults from the instance's
        fields, and resolved values there would leak into every recipe (e.g. head_dim of the defaults).
        Any ``dataclasses.replace`` of it resolves them.
        """
        obj = cls.__new__(cls)
        for f in fields(cls):
            value = values.get(f.name, f.default)
            object.__setattr__(obj, f.name, value)
        return obj

    @classmethod
    def from_name(cls, name: str, **overrides) -> "TransformerConfig":
        """A copy of the named size ``SIZES[name]`` with ``overrides`` (field=value) replaced and checked again; the
        size's derived fields (``n_kv_head``, ``head_dim``, ``intermediate_size``) stay unless overridden.
        ``ValueError`` naming the known sizes for another name."""
        if name not in SIZES:
            raise ValueError(f"unknown model size {name!r}; known: {', '.join(SIZES)}")
        return replace(SIZES[name], **overrides)

    def flops_per_token(self, seq_len: Optional[int], n_active_params: int) -> float:
        """Training FLOPs per token (forward + backward): ``6 N_active + 12 L H d_head T`` (PaLM appendix B).

        ``N_active`` excludes the embedding table but includes the LM head: pass
        ``count_parameters(config).active_non_embedding`` (``transformer.py``; the count builds the model on
        the meta device, which this module, below the model, does not do itself).
        """
        t = seq_len or self.seq_len
        return 6.0 * n_active_params + 12.0 * self.n_layer * self.n_head * self.head_dim * t


_LLAMA_VOCAB = 32000

#: Named sizes. Totals are counted (embedding + untied head, baseline scales) by
#: ``tests/test_model.py`` and stay within 3% of the name.
SIZES: dict[str, TransformerConfig] = {
    "dense_0.12b": TransformerConfig(
        vocab_size=_LLAMA_VOCAB, seq_len=2048, n_layer=12, n_embd=768, n_head=12, n_kv_head=4, intermediate_size=1920
    ),
    "dense_0.5b": TransformerConfig(
        vocab_size=_LLAMA_VOCAB, seq_len=2048, n_layer=24, n_embd=1280, n_head=20, n_kv_head=4, intermediate_size=3456
    ),
    "dense_1b": TransformerConfig(
        vocab_size=_LLAMA_VOCAB, seq_len=2048, n_layer=18, n_embd=2048, n_head=16, n_kv_head=8, intermediate_size=5632
    ),
    "dense_2b": TransformerConfig(
        vocab_size=_LLAMA_VOCAB, seq_len=2048, n_layer=26, n_embd=2560, n_head=20, n_kv_head=4, intermediate_size=7168
    ),
}
