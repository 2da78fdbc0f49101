"""Reading checkpoints into ``(spec, state dict)``: a single-file Lightning checkpoint
(``*.ckpt``), a distributed checkpoint folder written by ``ModelParallelStrategy`` (``*.distcp`` +
``.metadata`` + ``meta.pt``, consolidated on CPU without a process group), or a native export folder
(``scalevec_spec.json`` + safetensors). A single-file checkpoint is verified (zip structure, every
member's CRC32: ``verify.py``) before it is loaded, so a truncated or corrupt file is refused
with its name instead of exporting garbage weights. ``read_checkpoint_extra`` also returns what the
checkpoint records about its run (``checkpoint['scalevec']``: the tokenizer identity among others).

``read_contents`` returns all of it as one ``CheckpointContents``, read once per command and carried.

Plain torch (+ safetensors): must not import Lightning or transformers, nor ``export/`` or ``hub/``.
"""
from __future__ import annotations

import json
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .verify import checkpoint_files, verify_checkpoint
from .errors import ExportError

NATIVE_SPEC = "scalevec_spec.json"
_WRAPPER_PARTS = ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module.")


def _torch_load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # Lightning stores some plain Python objects; the file is the user's own training run
        pass
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as err:
        raise ExportError(f"--ckpt: {str(path)!r}: cannot be read ({type(err).__name__}: "
                          f"{str(err).split('. ')[0]}): it is truncated or corrupt; use another checkpoint of the "
                          "run, or write it again") from None


def _read_dcp(folder: Path) -> dict[str, torch.Tensor]:
    """Consolidate the ``state_dict`` entry of a distributed checkpoint on CPU (no process group)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    reader = FileSystemReader(str(folder))
    tops = {key.split(".", 1)[0] for key in reader.read_metadata().state_dict_metadata}
    if "state_dict" not in tops:
        raise ExportError(
            f"--ckpt: the distributed checkpoint {str(folder)!r} has no 'state_dict' entry (top-level keys: "
            f"{', '.join(sorted(tops))}); give a checkpoint written by Lightning's ModelParallelStrategy"
        )
    sd: dict[str, Any] = {}
    _load_state_dict(sd, storage_reader=reader, planner=_EmptyStateDictLoadPlanner(keys={"state_dict"}), no_dist=True)
    return sd["state_dict"]


def _clean_key(key: str) -> str:
    for part in _WRAPPER_PARTS:
        key = key.replace(part, "")
    return key


def read_checkpoint(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(spec, state dict of the Transformer)`` from a Lightning checkpoint, a DCP folder or a native export."""
    spec, state, _ = read_checkpoint_extra(path)
    return spec, state


def read_checkpoint_extra(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, Any]]:
    """``(spec, state dict, checkpoint['scalevec'])``; the file is verified before it is read."""
    p = Path(path)
    if not p.exists():
        raise ExportError(f"--ckpt: {str(path)!r} does not exist; give a Lightning .ckpt file or checkpoint folder")
    if p.is_dir() and (p / NATIVE_SPEC).is_file():
        from safetensors.torch import load_file

        spec = json.loads((p / NATIVE_SPEC).read_text())
        files = sorted(p.glob("model*.safetensors"))
        try:
            return spec, {k: v for f in files for k, v in load_file(f).items()}, {}
        except Exception as err:  # safetensors raises its own error types for a damaged file
            raise ExportError(f"--ckpt: {str(path)!r}: a weight file is damaged ({type(err).__name__}: {err}); "
                              "export it again from its checkpoint") from None
    if p.is_dir():
        if not (p / ".metadata").is_file():
            files = checkpoint_files(p)
            if files:
                raise ExportError(f"--ckpt: {str(path)!r}: is a folder of {len(files)} checkpoint(s), not a checkpoint; "
                                  f"give one of them (the newest is {str(files[-1])!r})")
            raise ExportError(
                f"--ckpt: {str(path)!r} is a folder without .metadata (not a distributed checkpoint) and without "
                f"{NATIVE_SPEC} (not a native export); give a .ckpt file or a checkpoint folder"
            )
        verify_checkpoint(p, full=True)  # every shard whole, its checksums (``folder.py``)
        extra = _torch_load(p / "meta.pt") if (p / "meta.pt").is_file() else {}
        state = _read_dcp(p)
    else:
        verify_checkpoint(p, full=True)
        extra = _torch_load(p)
        if not isinstance(extra, dict) or "state_dict" not in extra:
            raise ExportError(f"--ckpt: {str(path)!r} holds no 'state_dict'; give a checkpoint saved by Lightning")
        state = extra["state_dict"]
    spec = (extra.get("scalevec") or {}).get("spec")
    if spec is None:
        raise ExportError(
            f"--ckpt: {str(path)!r} has no checkpoint['scalevec']['spec'] (it was not written by scalevec_lit's "
            "CausalLM); export a checkpoint of `python -m scalevec_lit fit`"
        )
    model_state = {_clean_key(k[len("model."):]): v for k, v in state.items() if k.startswith("model.")}
    if not model_state:
        raise ExportError(f"--ckpt: {str(path)!r} has no 'model.*' weights in its state_dict")
    return spec, model_state, dict(extra.get("scalevec") or {})


@dataclass(frozen=True)
class CheckpointContents:
    """What one checkpoint holds, read once: its ``path``, its model ``spec`` (``model/spec.py``'s plain data),
    the Transformer's ``state`` (CPU tensors) and ``extra`` (``checkpoint['scalevec']``: the tokenizer identity
    among others; empty for a native export)."""

    path: Path
    spec: dict[str, Any]
    state: dict[str, torch.Tensor] = field(repr=False)
    extra: dict[str, Any]

    @property
    def tokenizer(self) -> Any:
        """The tokenizer the checkpoint records (``None`` when it records none)."""
        return self.extra.get("tokenizer")

    @property
    def kind(self) -> str:
        """``native folder``, ``distributed checkpoint`` or ``checkpoint`` (a single ``.ckpt`` file)."""
        if self.path.is_dir():
            return "native folder" if (self.path / NATIVE_SPEC).is_file() else "distributed checkpoint"
        return "checkpoint"


def read_contents(path: str | Path) -> CheckpointContents:
    """``read_checkpoint_extra`` as one object: the spec read here is the one the command carries."""
    spec, state, extra = read_checkpoint_extra(path)
    return CheckpointContents(Path(path), spec, state, extra)
