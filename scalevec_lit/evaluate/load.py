"""The model ``evaluate`` scores and its own tokenizer, from any checkpoint or Hugging Face folder, opened by
``scalevec_lit.checkpoint``'s ``open_model`` (which tells the forms apart):

- A native checkpoint of any strategy, dense or MoE (a ``.ckpt`` of ``fit``, a distributed checkpoint folder,
  a native export folder): rebuilt from its spec as ``generate`` and ``export`` do, with the tokenizer recorded
  in it (``--tokenizer`` must be the same tokenizer by content: ``export/tokenizer.py``).
- A Hugging Face folder (``config.json`` + safetensors) of an architecture ``import`` reads (one ``export``
  wrote, or Llama/Qwen3/Qwen3-MoE/Mixtral from elsewhere): the native model is built in memory through the
  architecture adapters (``checkpoint/hf.py``; no file written), with the folder's ``tokenizer.json``.

Plain torch (+ tokenizers, safetensors): must not import Lightning or lm-eval.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ..checkpoint import ExportError, open_model
from ..errors import UserError

KEY = "--ckpt_path"
WHAT = ("give a .ckpt of fit, a distributed checkpoint folder, a native export folder, or a Hugging Face folder "
        "(config.json + safetensors)")


def load_for_evaluation(path: str | Path, tokenizer: Optional[str | Path] = None):
    """``(model in eval mode (fp32, CPU), Tokenizer, a line saying what was loaded)``."""
    p = Path(path)
    if not p.exists():
        raise UserError(KEY, str(path), "does not exist", WHAT)
    try:
        opened = open_model(p)
        if opened.architecture is None:
            tok, note = _recorded_tokenizer(p, tokenizer, opened.tokenizer)
    except ExportError as err:  # the checkpoint reader's messages name export's flag
        raise ExportError(str(err).replace("--ckpt:", f"{KEY}:", 1)) from None
    if opened.architecture is not None:
        tok = _folder_tokenizer(p, tokenizer)
    model = opened.model
    if tok.vocab_size > model.config.vocab_size:
        raise UserError("--tokenizer", str(tok.path), f"has {tok.vocab_size} tokens, more than the model's vocabulary "
                        f"({model.config.vocab_size})", "pass the tokenizer.json the model was trained with")
    params = sum(t.numel() for t in model.parameters())
    if opened.architecture is not None:
        return model, tok, (f"{p}: Hugging Face {opened.architecture}, {params:,} parameters (imported in memory); "
                            f"tokenizer: {tok.path}")
    return model, tok, f"{p}: native checkpoint, {params:,} parameters; tokenizer: {note}"


def _recorded_tokenizer(ckpt: Path, tokenizer: Optional[str | Path], recorded: Any):
    """``(Tokenizer, where it came from)`` of a checkpoint: the one it records, or ``--tokenizer`` when the same."""
    from ..data.tokenizer import Tokenizer
    from ..export.tokenizer import find_tokenizer

    found, note = find_tokenizer(ckpt, None if tokenizer is None else str(tokenizer), recorded=recorded)
    return Tokenizer(found, key="--tokenizer"), note


def _folder_tokenizer(folder: Path, tokenizer: Optional[str | Path]):
    """The tokenizer of a Hugging Face folder: its ``tokenizer.json``, or ``--tokenizer`` when it is the same."""
    from ..data.tokenizer import Tokenizer, describe_tokenizer, same_tokenizer

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
    return tok
