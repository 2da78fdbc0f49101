"""Downstream evaluation with the lm-eval harness (the ``eval`` extra: ``pip install -e '.[eval]'``).

- ``python -m scalevec_lit evaluate --ckpt_path PATH --tasks a,b [--limit N] [--out FILE]``: ``cli.py``.
- ``ScaleVecLM`` (``lm.py``): a native model and its tokenizer as an lm-eval ``LM``.
- ``load_for_evaluation`` (``load.py``): the model and tokenizer of a checkpoint or a Hugging Face folder.
- ``harness.py``: the optional import, the task index (close names for a typo), one run, its JSON and metrics;
  the in-loop callback ``scalevec_lit.callbacks.DownstreamEval`` uses the same pieces.

Importing this package does not import lm-eval; ``ScaleVecLM`` does (on first use of the name).
"""
from __future__ import annotations

__all__ = ["ScaleVecLM", "load_for_evaluation", "main"]


def __getattr__(name: str):
    if name == "ScaleVecLM":
        from .harness import require_lm_eval

        require_lm_eval("scalevec_lit.evaluate.ScaleVecLM")
        from .lm import ScaleVecLM

        return ScaleVecLM
    if name == "load_for_evaluation":
        from .load import load_for_evaluation

        return load_for_evaluation
    if name == "main":
        from .cli import main

        return main
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
