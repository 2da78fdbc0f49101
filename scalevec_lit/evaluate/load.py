"""The model ``evaluate`` scores and its own tokenizer, from any checkpoint or Hugging Face folder.

- A native checkpoint of any strategy, dense or MoE (a ``.ckpt`` of ``fit``, a distributed checkpoint folder,
  a native export folder): rebuilt from its spec as ``generate`` and ``export`` do, with the tokenizer recorded
  in it (``--tokenizer`` must be the same tokenizer by content: ``export/tokenizer.py``).
- A Hugging Face folder (``config.json`` + safetensors) of an architecture ``import`` reads (one ``export``
  wrote, or Llama/Qwen3/Qwen3-MoE/Mixtral from elsewhere): the native model is built in memory through the
  import path (``hub/hf_import.py``; no file written), with the folder's ``tokenizer.json``.

Plain torch (+ tokenizers, safetensors): must not import Lightning or lm-eval.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..checkpoint import NATIVE_SPEC, ExportError
from ..errors import UserError

KEY = "--ckpt_path"
WHAT = ("give a .ckpt of fit, a distributed checkpoint folder, a native export folder, or a Hugging Face folder "
        "(config.json + safetensors)")


def is_hf_folder(path: Path) -> bool:
    return path.is_dir() and (path / "config.json").is_file() and not (path / NATIVE_SPEC).is_file() \
        and not (path / ".metadata").is_file()


def load_for_evaluation(path: str | Path, tokenizer: Optional[str | Path] = None):
    """``(model in eval mode (fp32, CPU), Tokenizer, a line saying what was loaded)``."""
    p = Path(path)
    if not p.exists():
        raise UserError(KEY, str(path), "does not exist", WHAT)
    if is_hf_folder(p):
        return _load_hf(p, tokenizer)
    from ..generate import load_for_generation

    try:
        model, tok, note = load_for_generation(str(p), None if tokenizer is None else str(tokenizer))
    except ExportError as err:  # export's messages name its own flag
        raise ExportError(str(err).replace("--ckpt:", f"{KEY}:", 1)) from None
    params = sum(t.numel() for t in model.parameters())
    return model, tok, f"{p}: native checkpoint, {params:,} parameters; tokenizer: {note}"


def _load_hf(folder: Path, tokenizer: Optional[str | Path]):
    from ..data.tokenizer import Tokenizer, describe_tokenizer, same_tokenizer
    from ..hub.hf_import import load_hf

    inside = folder / "tokenizer.json"
    if tokenizer is None and not inside.is_file():
        raise UserError(KEY, str(folder), "is a Hugging Face folder without tokenizer.json",
                        "pass --tokenizer <the model's tokenizer.json> (sentencepiece-only folders: save the tokenizer "
                        "with transformers' AutoTokenizer.save_pretrained first)")
    tok = Tokenizer(tokenizer if tokenizer is not None else inside, key="--tokenizer" if tokenizer else KEY)
    if tokenizer is not None and inside.is_file():
        own = Tokenizer(inside, key=str(inside)).identity()
        if not same_tokenizer(own, tok.identity()):
            raise UserError("--tokenizer", str(tokenizer), f"is not the tokenizer of {folder}: given "
                            f"{describe_tokenizer(tok.identity())}, the folder has {describe_tokenizer(own)}",
                            "leave --tokenizer out (the folder's tokenizer.json is used) or pass a copy of it")
    model, arch = load_hf(folder)
    if tok.vocab_size > model.config.vocab_size:
        raise UserError("--tokenizer", str(tok.path), f"has {tok.vocab_size} tokens, more than the model's vocabulary "
                        f"({model.config.vocab_size})", "pass the tokenizer.json the model was trained with")
    params = sum(t.numel() for t in model.parameters())
    return model, tok, f"{folder}: Hugging Face {arch}, {params:,} parameters (imported in memory); tokenizer: {tok.path}"
