"""The Hugging Face layout of a folded model (``hf_layout``): the adapter that holds it is chosen, or the
model refused, by ``hf_plan.plan``; the weight names, the tensors and ``config.json`` are that adapter's
(``scalevec_lit/arch/``: Llama, Qwen3, Qwen3-MoE, Mixtral, Glm4-MoE, and any registered one). Reading a
Hugging Face folder uses the same name table (``scalevec_lit/checkpoint/hf.py``).

Plain torch: must not import Lightning or transformers, nor the write / cli modules of this package.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from collections.abc import Iterator, Mapping
from typing import Any, Optional

import torch

from ..model.transformer import Transformer
from ..scale.fold import fold_scales
from ..arch import HFArchitecture, architectures, facts_of
from .errors import HFExportError
from .hf_plan import plan

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class _Architectures(Mapping):
    """The registered adapters by transformers class name, read when used (one registered later is there)."""

    def __getitem__(self, name: str) -> HFArchitecture:
        return {a.architecture: a for a in architectures()}[name]

    def __iter__(self) -> Iterator[str]:
        return iter([a.architecture for a in architectures()])

    def __len__(self) -> int:
        return len(architectures())


ARCHITECTURES = _Architectures()


@dataclass
class HFLayout:
    """A folded model in a transformers architecture's terms (``hf_layout``): the architecture's name, its
    ``config.json`` and every tensor by its checkpoint name."""

    architecture: str
    config: dict[str, Any]
    tensors: dict[str, torch.Tensor] = field(repr=False)


def _own(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A contiguous tensor with its own storage (safetensors refuses views sharing memory)."""
    t = t.detach().to(dtype)
    return t.clone() if t.untyped_storage().nbytes() != t.numel() * t.element_size() else t.contiguous()


def hf_layout(model: Transformer, eos_id: Optional[int] = None, dtype: torch.dtype = torch.float32) -> HFLayout:
    """Fold ``model`` (a copy) and map it to the weight names and config of a transformers architecture."""
    folded = fold_scales(model).eval()
    adapter, problems = plan(folded)
    if adapter is None:
        raise HFExportError("cannot export to a standard transformers architecture:\n  - " + "\n  - ".join(problems))
    qk_norm = facts_of(folded).qk_norm
    tensors = {name: adapter.export_tensor(folded, ref) for name, ref in adapter.names(folded, qk_norm)}
    config = adapter.hf_config(folded, qk_norm, eos_id, next(k for k, v in DTYPES.items() if v == dtype))
    return HFLayout(adapter.architecture, config, {k: _own(v, dtype) for k, v in tensors.items()})
