"""Reading what ``inspect`` looks at into a native model (fp32, CPU, eval mode), nothing written, through
``scalevec_lit.checkpoint``'s ``open_model``, which tells the forms apart and opens any of them:

- a single-file Lightning checkpoint (``*.ckpt`` of ``fit``, any strategy, dense or MoE), a distributed
  checkpoint folder (``*.distcp`` + ``.metadata`` + ``meta.pt``) or a native export folder
  (``scalevec_spec.json``): the model of the checkpoint's own spec, as ``generate`` and ``export`` read them;
- a local Hugging Face folder (``config.json`` + safetensors) of an architecture ``import`` reads (Llama,
  Qwen3, Qwen3-MoE, Mixtral), or one that ``export --format hf`` wrote: the native model holding it exactly
  (one plain γ per norm; QK-norm as DNP on q/k with a per-head u), so the roles are the library's own.

The spec read there is carried (``Loaded.spec``): the strategy line describes the spec's strategy, not the live
model's. Errors name the argument (``PATH`` or ``--compare``), the value and the fix.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import nn

from scalevec_lit.checkpoint import open_model
from scalevec_lit.checkpoint.hf import importable
from scalevec_lit.errors import UserError, exit_code_for, one_paragraph
from scalevec_lit.model.spec import strategy_from_dict
from scalevec_lit.scale.keeps import moved_branches

PATH_HINT = ("give a .ckpt file of fit, a distributed checkpoint folder, a native export folder "
             "(scalevec_spec.json) or a local Hugging Face model folder (config.json + safetensors)")


@dataclass
class Loaded:
    """A model to inspect and where it came from."""

    model: nn.Module
    path: str
    kind: str  # checkpoint, distributed checkpoint, native folder, Hugging Face folder (<architecture>)
    spec: dict[str, Any]  # the spec read with the model (model/spec.py's plain data), carried

    @property
    def strategy(self) -> str:
        """One line: parameterization, placement, HG; of the spec's strategy."""
        return describe_strategy(self.spec)

    @property
    def n_layer(self) -> int:
        """The model's number of blocks (``config.n_layer``); ``--compare`` needs the same on both sides."""
        return int(self.model.config.n_layer)

    @property
    def label(self) -> str:
        """The last component of ``path`` (``path`` itself when it has none): the model's name in figures."""
        return Path(self.path).name or self.path


def describe_strategy(spec: dict[str, Any]) -> str:
    """The strategy of ``spec`` (as read from the checkpoint or folder) in one line."""
    if not isinstance(spec.get("strategy"), dict):
        return "unknown strategy"
    s = strategy_from_dict(spec["strategy"])
    vector = getattr(getattr(s.vector, "func", s.vector), "__name__", type(s.vector).__name__)  # a class or a partial
    moved = ", ".join(f"{b}: {p}" for b, p in moved_branches(s).items()) or "all input"
    return f"{vector}, placement {moved}{', branch-specific (HG)' if s.branch_specific else ''}"


def _reworded(err: BaseException, key: str, path: Path) -> UserError:
    """A loader's error (``--ckpt: 'x': problem; fix``) with ``key`` in place of the loader's own flag, and a fix
    that fits inspect where the loader's speaks of training (a damaged checkpoint: resume from another one)."""
    message = one_paragraph(str(err))
    for prefix in ("--ckpt_path: ", "--ckpt: ", "--hf: "):
        if message.startswith(prefix):
            message = message[len(prefix):]
            break
    shown = repr(str(path))
    for lead in (f"{shown}: ", f"{shown} ", f"checkpoint {shown} "):
        if message.startswith(lead):
            message = message[len(lead):]
            break
    problem, sep, fix = message.rpartition("; ")
    if not sep:
        problem, fix = message, PATH_HINT
    if "CheckpointError" in {cls.__name__ for cls in type(err).__mro__}:
        fix = f"the file is damaged: give another checkpoint of the run, or {PATH_HINT[len('give '):]}"
    elif fix == "give a .ckpt file or a checkpoint folder":
        fix = PATH_HINT
    return UserError(key, shown, problem, fix, exit_code=exit_code_for(err) or 1)


def load(path: str | Path, key: str = "PATH") -> Loaded:
    """The native model of ``path`` (see the module docstring); ``key`` names the argument in errors."""
    p = Path(path)
    if not p.exists():
        raise UserError(key, repr(str(path)), "does not exist", PATH_HINT)
    if p.is_file():
        _refuse_other_files(p, key)
    try:
        opened = open_model(p)
    except UserError as err:  # a Hugging Face folder's: import's words made inspect's
        if err.key == "--hf":
            raise UserError(key, err.value, err.problem, err.fix, exit_code=err.exit_code) from None
        if err.key.endswith("architectures"):  # import's fix speaks of importing
            raise UserError(err.key, err.value, "is not an architecture inspect reads",
                            f"give a model of {', '.join(importable())}, or a native checkpoint",
                            exit_code=err.exit_code) from None
        raise
    except Exception as err:  # noqa: BLE001 - the loaders' user errors (ExportError, CheckpointError) get our key
        if exit_code_for(err) is None:
            raise
        raise _reworded(err, key, p) from None
    return Loaded(opened.model, str(p), opened.kind, opened.spec)


ZIP_MAGIC = b"PK\x03\x04"


def _head(path: Path) -> bytes:
    with open(path, "rb") as f:
        return f.read(4)


def _refuse_other_files(p: Path, key: str) -> None:
    """A file that is not a torch checkpoint, named before it is read."""
    if p.suffix in (".json", ".safetensors", ".yaml", ".txt"):
        raise UserError(key, repr(str(p)), f"is a {p.suffix} file, not a checkpoint",
                        f"give the folder that holds it (for an exported or Hugging Face model), or {PATH_HINT}")
    if _head(p) != ZIP_MAGIC:
        raise UserError(key, repr(str(p)), "is not a checkpoint (a torch checkpoint is a zip archive, this file is not "
                        "one)", PATH_HINT)


def summary_line(loaded: Loaded) -> str:
    m = loaded.model
    moe = getattr(m.config, "moe", None)
    shape = f"{loaded.n_layer} layers, width {m.config.n_embd}"
    if moe is not None:
        shape += f", MoE {moe.num_experts} experts (top {moe.top_k})"
    return f"{loaded.path}: {loaded.kind}; {shape}; {loaded.strategy}"
