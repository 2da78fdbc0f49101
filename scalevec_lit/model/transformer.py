"""Transformer: embedding, blocks, final norm, LM head; initialization; parameter counts.

Decoding with the key/value cache (``model/cache.py`` holds the storage): ``forward_cached``, and which models
can decode with it (``cache_unsupported``, ``check_cache_support``, ``cache_problem``): every block must run its
attention through a ``CausalSelfAttention``, and a model class that overrides ``forward`` must also override
``forward_cached``; ``forward_cached`` refuses such a model instead of returning logits that ignore the earlier
positions, and ``cache_problem`` also runs one token to find an attention layer that does not read its cache
(``generate()`` runs without the cache when it finds a problem).

Plain torch only: must not import Lightning.

Initialization (``reset_parameters``), documented because results depend on it. Each module initializes
its own parameters (``init_weights``); ``reset_parameters`` calls them all:
- embedding and every consumer map of a scale site (q, k, v, gate, up, router, experts, head):
  N(0, init_std²) (0.02, as GPT-2/Llama pre-training);
- the maps that write into the residual stream (W_o, W_down, expert down maps): N(0, init_std²/(2 L)),
  GPT-2's depth scaling, so the residual stream's variance does not grow with depth;
- scale vectors: their parameterization's own init (γ = 1 for every shipped one);
- a tied head shares the embedding's tensor (initialized once, as the embedding).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import nn

from ..scale.sites import Branch, NormSite
from ..scale.strategy import ScaleStrategy
from ..scale.zero_check import check_zero_u_, clear_zero_u_
from .attention import CausalSelfAttention
from .block import Block
from .cache import CacheNotRead, KVCache
from .config import TransformerConfig
from .rope import rope_tables

BlockFactory = Callable[[TransformerConfig, int, ScaleStrategy], Block]


class Transformer(nn.Module):
    """A decoder-only language model whose every norm is built through a ``ScaleStrategy``.

    Args:
        config: the shape.
        strategy: the scale-vector strategy (default: the standard one γ per norm).
        block: the block class (in Python, any callable ``(config, layer, strategy) -> nn.Module``; a recipe's
            ``model.block`` must name a ``Block`` subclass, with its ``init_args``). Recorded in checkpoints.

    A subclass (built by a ``CausalLM.build_model`` override) whose constructor takes arguments beyond
    ``(config, strategy, block)`` stores them in ``self.init_args`` (a dict): the checkpoint spec (``spec_of``)
    records the class with them and rebuilds it as ``cls(config, strategy, block, **init_args)``, and fit refuses
    a model that its spec would not rebuild. A subclass that overrides ``forward`` also overrides
    ``forward_cached`` (else it decodes without the key/value cache).
    """

    def __init__(
        self,
        config: TransformerConfig,
        strategy: Optional[ScaleStrategy] = None,
        block: BlockFactory = Block,
    ) -> None:
        super().__init__()
        self.config = config
        self.strategy = strategy = strategy or ScaleStrategy()
        self.block_factory = block  # recorded in checkpoint specs with its init_args (model/spec.py spec_of)
        self.embed = nn.Embedding(config.vocab_size, config.n_embd)
        self.blocks = nn.ModuleList(block(config, i, strategy) for i in range(config.n_layer))
        #: the final norm and the LM head: one site whose consumer is the head
        self.final = NormSite(
            config.n_embd, (Branch("head", config.vocab_size),), strategy, layer=-1, site="final",
            proj_site="final", init_std=config.init_std, enabled=strategy.final_norm,
        )
        if config.tie_embeddings:
            self.tie_()
        cos, sin = rope_tables(config.seq_len, config.head_dim, config.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        if self.embed.weight.device.type != "meta":
            self.reset_parameters()

    #: the LM head's weight in the state dict
    HEAD_KEY = "final.proj.head.weight"

    def tie_(self) -> None:
        """Make the LM head share the embedding's tensor."""
        self.final.proj["head"].weight = self.embed.weight

    @property
    def head_weight(self) -> torch.Tensor:
        """The LM head's weight (the embedding's tensor when tied)."""
        return self.final.weight("head")

    @property
    def tied(self) -> bool:
        """True while the head shares the embedding's tensor (folding unties it)."""
        return self.final.weight("head") is self.embed.weight

    @torch.no_grad()
    def init_weights(self) -> None:
        """The embedding: N(0, ``init_std``²); every other module initializes its own (``reset_parameters``)."""
        nn.init.normal_(self.embed.weight, 0.0, self.config.init_std)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """(Re-)initialize every parameter and buffer; also what runs after meta-device construction.
        Every module that owns parameters initializes them itself (``init_weights``)."""
        for module in self.modules():
            if hasattr(module, "init_weights"):
                module.init_weights()
        if self.tied:  # the head's init above overwrote the shared tensor: the embedding's init wins
            nn.init.normal_(self.embed.weight, 0.0, self.config.init_std)
        cos, sin = rope_tables(self.config.seq_len, self.config.head_dim, self.config.rope_theta, self.rope_cos.device)
        self.rope_cos.copy_(cos)
        self.rope_sin.copy_(sin)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """Token ids ``[B, T]`` → logits ``[B, T, vocab]``."""
        if idx.shape[1] > self.config.seq_len:
            raise ValueError(
                f"input length {idx.shape[1]} exceeds model.config.seq_len={self.config.seq_len}"
            )
        compiled = [] if torch.compiler.is_compiling() else [
            b for b in self.blocks if getattr(b, "_compiled_call_impl", None) is not None]
        for block in compiled:  # a constant for group_norm_rope inside the compiled graph (scale/zero_check.py)
            check_zero_u_(block)
        try:
            x = self.embed(idx)
            for block in self.blocks:
                x = block(x, self.rope_cos, self.rope_sin)
            (logits,) = self.final(x)
        finally:
            for block in compiled:
                clear_zero_u_(block)
        return logits

    # -- decoding with a key/value cache (model/cache.py); the training path above never reads it ------------
    def attention_layers(self) -> list[nn.Module]:
        """The attention modules that can run with a key/value cache, in order."""
        return [m for m in self.modules() if isinstance(m, CausalSelfAttention)]

    def new_cache(self, max_len: Optional[int] = None) -> KVCache:
        """An empty cache for up to ``max_len`` positions (default and at most: ``config.seq_len``)."""
        max_len = self.config.seq_len if max_len is None else max_len
        if not 0 < max_len <= self.config.seq_len:
            raise ValueError(f"a cache of {max_len} positions: the model's context is 1 .. {self.config.seq_len} "
                             "(model.config.seq_len)")
        return KVCache(len(self.attention_layers()), max_len)

    def forward_cached(self, idx: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Token ids ``[B, T]`` at positions ``cache.length .. cache.length + T - 1`` → their logits
        ``[B, T, vocab]``, the same as the matching rows of ``forward`` on the whole sequence; their keys and
        values are added to ``cache``."""
        start, T = cache.length, idx.shape[1]
        if start == 0:  # a block with its own attention would ignore the cache: refused (checked once per cache)
            check_cache_support(self)
        layers = self.attention_layers()
        if len(layers) != len(cache.layers):
            raise ValueError(f"the cache was made for {len(cache.layers)} attention layers, the model has {len(layers)}")
        cache.begin(T, idx.device)
        for attn, layer in zip(layers, cache.layers):
            attn.kv_cache = layer
        try:
            x = self.embed(idx)
            cos, sin = self.rope_cos[start : start + T], self.rope_sin[start : start + T]
            for block in self.blocks:
                x = block(x, cos, sin)
            (logits,) = self.final(x)
        finally:
            for attn in layers:
                attn.kv_cache = None
        cache.advance(T, layers)  # refuses a layer that did not read its cache (its logits ignore the earlier tokens)
        return logits

    def aux_losses(self) -> dict[str, torch.Tensor]:
        """Auxiliary losses collected during the last forward (MoE balancing); empty for dense models."""
        total: dict[str, torch.Tensor] = {}
        for module in self.modules():
            losses = getattr(module, "last_aux_losses", None)
            if losses:
                for k, v in losses.items():
                    total[k] = total[k] + v if k in total else v
        return total


@dataclass(frozen=True)
class ParameterCount:
    """A model's parameters (``count_parameters``): ``total`` (a tied head once), ``embedding``, ``scale`` (in scale
    vectors) and ``active`` (used per token: an MoE layer's top-k routed experts only)."""

    total: int
    embedding: int
    scale: int  # scale-vector parameters
    active: int  # parameters used per token (MoE: top-k of the routed experts)

    @property
    def active_non_embedding(self) -> int:
        """``active − embedding``: the ``N_active`` of ``TransformerConfig.flops_per_token`` (LM head included)."""
        return self.active - self.embedding

    @property
    def scale_share(self) -> float:
        """The scale vectors' fraction of ``total`` (0 to 1)."""
        return self.scale / max(1, self.total)

    def summary(self) -> str:
        """One line for logs: the total, the active count per token when it differs (MoE), and the scale vectors'
        count and share in percent."""
        line = f"parameters: {self.total:,} total"
        if self.active != self.total:
            line += f", {self.active:,} active per token"
        return line + f", {self.scale:,} in scale vectors ({100 * self.scale_share:.4f}%)"


def count_parameters(
    config_or_model, strategy: Optional[ScaleStrategy] = None, block: BlockFactory = Block
) -> ParameterCount:
    """Count parameters of a built model (also on the meta device, or sharded by FSDP2: a DTensor counts its
    global size), or of a stock ``Transformer`` of a config, built on the meta device (nothing allocated)."""
    from ..scale.registry import scale_parameters

    if isinstance(config_or_model, nn.Module):
        model = config_or_model
    else:
        with torch.device("meta"):
            model = Transformer(config_or_model, strategy, block)
    seen: set[int] = set()
    total = 0
    for p in model.parameters():  # parameters() already skips a tied head's second reference
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel()
    embedding = model.embed.weight.numel()
    scale = sum(sp.param.numel() for sp in scale_parameters(model))
    inactive = 0
    for module in model.modules():
        inactive += getattr(module, "inactive_parameters_per_token", lambda: 0)()
    return ParameterCount(total=total, embedding=embedding, scale=scale, active=total - inactive)


def cache_unsupported(model) -> Optional[str]:
    """Why ``model.forward_cached`` would not give ``forward``'s logits, or ``None`` when it does: every block must
    run its attention through a ``CausalSelfAttention`` (the module that reads the cache), and a model class that
    overrides ``forward`` must also override ``forward_cached``."""
    for i, block in enumerate(model.blocks):
        if not any(isinstance(m, CausalSelfAttention) for m in block.modules()):
            return (f"block {i} ({type(block).__module__}.{type(block).__qualname__}) has no CausalSelfAttention, "
                    "the module that reads the key/value cache")
    cls = type(model)
    if isinstance(model, Transformer) and cls.forward is not Transformer.forward and \
            cls.forward_cached is Transformer.forward_cached:
        return (f"{cls.__module__}.{cls.__qualname__} overrides forward but not forward_cached, so decoding with "
                "the cache would skip its own computation")
    return None


def check_cache_support(model) -> None:
    """``ValueError`` (naming the block or model class) when ``cache_unsupported(model)``."""
    why = cache_unsupported(model)
    if why is not None:
        raise ValueError(f"this model cannot decode with a key/value cache: {why}; use generate(..., use_cache=False) "
                         "(generate() without use_cache falls back to it by itself), or give the module the cache "
                         "path (a CausalSelfAttention, or a forward_cached override)")


@torch.no_grad()
def cache_problem(model) -> Optional[str]:
    """Why decoding ``model`` with the cache would not give ``forward``'s logits, or ``None``: ``cache_unsupported``
    (from the classes), then one token run through ``forward_cached`` (an attention layer that does not read its
    cache, whatever its class)."""
    why = cache_unsupported(model)
    if why is not None:
        return why
    try:
        model.forward_cached(torch.zeros(1, 1, dtype=torch.long, device=model.embed.weight.device), model.new_cache(1))
    except CacheNotRead as err:
        return str(err).partition(": its forward")[0]
    return None
