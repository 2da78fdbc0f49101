"""A key/value cache for decoding: each attention layer keeps the keys and values of the positions seen so far.

``Transformer.forward_cached(idx, cache)`` runs the tokens ``idx`` at positions ``cache.length ...`` and
appends their keys and values; the training path (``Transformer.forward``) never sees a cache. Keys are
stored after the per-head norm, ``u`` and RoPE (what attention reads), values after their output side.

Only ``CausalSelfAttention`` reads the cache (in ``attend``). An attention layer that did not read its cache in a
call (e.g. a subclass whose ``forward`` bypasses ``attend``'s cache path) is refused after the call
(``KVCache.advance`` raises ``CacheNotRead``), never returned silently. Which models can decode with the cache at
all is the model's own question (``model/transformer.py``: ``cache_unsupported``, ``check_cache_support``,
``cache_problem``); this file is the storage only and imports nothing from the model.

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
