"""A key/value cache for decoding: each attention layer keeps the keys and values of the positions seen so far.

``Transformer.forward_cached(idx, cache)`` runs the tokens ``idx`` at positions ``cache.length ...`` and
appends their keys and values; the training path (``Transformer.forward``) never sees a cache. Keys are
stored after the per-head norm, ``u`` and RoPE (what attention reads), values after their output side.

Only ``CausalSelfAttention`` reads the cache (in ``attend``). ``cache_unsupported(model)`` says why a model cannot
decode with it, from its classes (a block without that module, or a model class that overrides ``forward`` but not
``forward_cached``), and ``forward_cached`` refuses such a model (``check_cache_support``) instead of returning
logits that ignore the earlier positions. Whatever the classes, an attention layer that did not read its cache in a
call (e.g. a subclass whose ``forward`` bypasses ``attend``'s cache path) is refused after the call
(``KVCache.advance`` raises ``CacheNotRead``), never returned silently. ``cache_problem(model)`` checks both, the
second on one token; ``generate()`` runs without the cache when it finds a problem.

Plain torch only: must not import Lightning.
"""
from __future__ import annotations

from typing import Optional

import torch


class CacheNotRead(ValueError):
    """An attention layer did not read its key/value cache during ``forward_cached``: its logits would ignore the
    earlier positions."""


class LayerCache:
    """Keys and values ``[B, n_kv_head, max_len, head_dim]`` of one attention layer (allocated on first use)."""

    def __init__(self, owner: "KVCache") -> None:
        self.owner = owner
        self.k: Optional[torch.Tensor] = None
        self.v: Optional[torch.Tensor] = None
        self.read = False  # set by ``update`` in each call of the model (``KVCache.begin`` clears it)

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
        """Store ``k``, ``v`` ``[B, H_kv, T, D]`` at the cache's current positions; return every key and value
        so far and the masking arguments of ``scaled_dot_product_attention`` for the new queries."""
        start, T = self.owner.length, k.shape[2]
        self.read = True
        if self.k is None:
            shape = (k.shape[0], k.shape[1], self.owner.max_len, k.shape[3])
            self.k = k.new_empty(shape)
            self.v = v.new_empty(shape[:3] + (v.shape[3],))
        end = start + T
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        return self.k[:, :, :end], self.v[:, :, :end], self.owner.masking


class KVCache:
    """The cache of a whole model for a batch of sequences decoded together, up to ``max_len`` positions."""

    def __init__(self, n_layers: int, max_len: int) -> None:
        self.max_len = max_len
        self.length = 0  # positions filled (the position of the next token)
        self.layers = [LayerCache(self) for _ in range(n_layers)]
        #: ``attn_mask`` / ``is_causal`` for the queries of the current call (set by ``begin``)
        self.masking: dict = {}

    def begin(self, T: int, device: torch.device) -> None:
        """Called by the model before it runs ``T`` new positions: checks the room, sets the masking."""
        if self.length + T > self.max_len:
            raise ValueError(f"the cache holds {self.max_len} positions; {self.length} are filled and {T} more were given")
        for layer in self.layers:
            layer.read = False
        if T == 1:  # one query sees every key so far
            self.masking = {"attn_mask": None, "is_causal": False}
        elif self.length == 0:  # the prompt: the square causal mask, as in training
            self.masking = {"attn_mask": None, "is_causal": True}
        else:  # query i (position length + i) sees keys 0 .. length + i
            keys = torch.arange(self.length + T, device=device)
            mask = keys[None, :] <= (self.length + torch.arange(T, device=device))[:, None]
            self.masking = {"attn_mask": mask, "is_causal": False}

    def advance(self, T: int, modules: Optional[list] = None) -> None:
        """Called by the model after the ``T`` positions ran; ``modules`` (the attention module of each layer, in
        order) are named in the ``ValueError`` raised when one of them did not read its layer's cache in this call:
        its logits would ignore the earlier positions (nothing is advanced then)."""
        skipped = [i for i, layer in enumerate(self.layers) if not layer.read]
        if skipped:
            i = skipped[0]
            what = f" ({type(modules[i]).__module__}.{type(modules[i]).__qualname__})" if modules else ""
            raise CacheNotRead(f"attention layer {i}{what} did not read the key/value cache ({len(skipped)} of "
                             f"{len(self.layers)} layers did not): its forward does not take the cache path, so the "
                             "logits would ignore the earlier positions; use generate(..., use_cache=False)")
        self.length += T
        self.masking = {}


def cache_unsupported(model) -> Optional[str]:
    """Why ``model.forward_cached`` would not give ``forward``'s logits, or ``None`` when it does: every block must
    run its attention through a ``CausalSelfAttention`` (the module that reads the cache), and a model class that
    overrides ``forward`` must also override ``forward_cached``."""
    from .attention import CausalSelfAttention
    from .transformer import Transformer

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
