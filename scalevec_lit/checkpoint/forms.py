"""Opening any of the four forms a model comes in, told apart here and nowhere else: a single-file Lightning
checkpoint (``*.ckpt``), a distributed checkpoint folder (``.metadata`` + ``*.distcp`` + ``meta.pt``), a native
export folder (``scalevec_spec.json`` + safetensors) and a Hugging Face folder (``config.json`` + safetensors,
read through the architecture adapters: ``hf.py``). ``open_model`` returns the rebuilt model (fp32, CPU, eval
mode) with what was read: the spec (read once, for the command to carry), the form (``kind``) and what the
checkpoint records about its run (``extra``: the tokenizer identity among others; empty for a native or
Hugging Face folder).

Plain torch (+ safetensors): must not import Lightning or transformers, nor ``export/`` or ``hub/``.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from ..model.transformer import Transformer
from .hf import open_hf
from .read import NATIVE_SPEC, read_contents
from .rebuild import model_from_state

HF_CONFIG = "config.json"


def is_hf_folder(path: str | Path) -> bool:
    """A folder with ``config.json`` that is neither a native export nor a distributed checkpoint."""
    p = Path(path)
    return p.is_dir() and (p / HF_CONFIG).is_file() and not (p / NATIVE_SPEC).is_file() \
        and not (p / ".metadata").is_file()


@dataclass(frozen=True)
class OpenedModel:
    """A model opened from ``path``: the ``model``, the ``spec`` it was built from (``model/spec.py``'s plain
    data), its form (``kind``: ``checkpoint``, ``distributed checkpoint``, ``native folder`` or ``Hugging Face
    folder (<architecture>)``), ``extra`` (``checkpoint['scalevec']``) and, for a Hugging Face folder, its
    transformers ``architecture``."""

    path: Path
    model: Transformer = field(repr=False)
    spec: dict[str, Any]
    kind: str
    extra: dict[str, Any] = field(default_factory=dict)
    architecture: Optional[str] = None

    @property
    def tokenizer(self) -> Any:
        """The tokenizer the checkpoint records (``None`` when it records none, as a folder does)."""
        return self.extra.get("tokenizer")


def open_model(path: str | Path) -> OpenedModel:
    """The model of ``path``, any of the four forms (see the module docstring). The errors are the readers':
    ``ExportError`` and ``CheckpointError`` (``--ckpt: …``) for a checkpoint or native folder, ``UserError``
    (``--hf: …`` or ``config.json``'s key) for a Hugging Face folder."""
    p = Path(path)
    if is_hf_folder(p):
        model, arch, spec = open_hf(p)
        return OpenedModel(p, model, spec, f"Hugging Face folder ({arch})", {}, arch)
    read = read_contents(p)
    return OpenedModel(p, model_from_state(read.spec, read.state), read.spec, read.kind, read.extra)
