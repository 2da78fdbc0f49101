"""The command line: ``python -m scalevec_lit {fit,validate,test,prepare,export,generate,study,import,convert,evaluate,
inspect,recipes} ...`` (``--help``: every command, ``top_help``).

``fit``/``validate``/``test`` are LightningCLI subcommands over ``CausalLM`` and ``TokenDataModule``
(``train_cli.py``, imported only for them: the other commands start without Lightning's import, about
5 CPU-seconds). ``prepare`` tokenizes text into chunks; each other command is the ``main`` of its module
(``EXTRA_COMMANDS``).

Every command runs under ``errors.run_guarded``: a user error is one paragraph and exit code 2 (command
line, recipe) or 1 (run time), no traceback unless ``--debug`` or ``SCALEVEC_DEBUG=1``. The recipe is
checked before anything is built (``checks.py``); a run stopped by a signal saved a checkpoint and exits
with 128 + the signal number (``callbacks/checkpoint.py``).
"""
from __future__ import annotations

import sys
from typing import Any, Optional

from .checks import check_command
from .errors import run_guarded

EXTRA_COMMANDS = {
    "prepare": "scalevec_lit.data.prepare",
    "export": "scalevec_lit.export",
    "generate": "scalevec_lit.generate",  # continue a prompt with a checkpoint (KV cache, streaming)
    "study": "scalevec_lit.study",
    "import": "scalevec_lit.hub.hf_import",  # a transformers checkpoint -> native (scalevec_lit/hub/)
    "convert": "scalevec_lit.hub.convert",  # a native checkpoint -> another scale strategy
    "evaluate": "scalevec_lit.evaluate.cli",  # lm-eval tasks on a checkpoint or HF folder (the eval extra)
    "inspect": "scalevec_lit.inspect",  # scale vectors of a checkpoint or HF model: statistics, fold, figures
    "recipes": "scalevec_lit.recipe_lookup",  # the shipped recipes: list, show, copy (issue 35)
}


#: one line per command for ``python -m scalevec_lit --help`` (every command ``_dispatch`` runs)
COMMAND_HELP = {
    "fit": "train a model from a YAML recipe (--config recipes/smoke.yaml); resume with --ckpt_path last",
    "validate": "the validation loss of a checkpoint (--ckpt_path) on a recipe's data",
    "test": "that loss as test/loss, on the val split of --data.data_dir (a test set prepared into its own folder)",
    "predict": "Lightning's predict loop (no use for a language model here)",
    "prepare": "tokenize text, JSON Lines, parquet or a saved dataset into train/val chunks",
    "export": "fold the scale vectors and write a Hugging Face or native model folder",
    "generate": "continue a prompt with a checkpoint",
    "study": "ablation studies: plan, run and report a grid of runs",
    "import": "a Hugging Face checkpoint as a native model folder",
    "convert": "a checkpoint to another scale strategy, exactly where the math allows",
    "evaluate": "lm-eval tasks on a checkpoint or a Hugging Face folder",
    "inspect": "the scale vectors of a checkpoint: statistics, fold, figures",
    "recipes": "list, show and copy the recipes shipped with the package",
}


def top_help() -> str:
    """What ``python -m scalevec_lit --help`` prints: every command, not only LightningCLI's."""
    from .checks import LIGHTNING_COMMANDS

    names = [*LIGHTNING_COMMANDS, *EXTRA_COMMANDS]
    width = max(map(len, names))
    lines = ["usage: python -m scalevec_lit COMMAND [options]", "",
             "Pre-train dense and MoE language models with pluggable scale vectors.", "", "commands:"]
    lines += [f"  {n:<{width}}  {COMMAND_HELP.get(n, '')}".rstrip() for n in names]
    lines += ["", "python -m scalevec_lit COMMAND --help shows a command's options. Any command: --debug (or "
              "SCALEVEC_DEBUG=1) shows the traceback of an error."]
    return "\n".join(lines)


def main(args: Optional[list[str]] = None):
    """Run a command; returns the ``ScaleVecCLI`` (for in-process use: ``main([...]).model``)."""
    return run_guarded(_dispatch, list(sys.argv[1:] if args is None else args))


def _dispatch(argv: list[str]):
    if argv and argv[0] in ("-h", "--help"):
        print(top_help())
        return None
    check_command(argv, EXTRA_COMMANDS)
    from . import stopsignal

    if argv[0] in EXTRA_COMMANDS:
        import importlib

        with stopsignal.importing():  # a stop signal mid-import: its line, then exit at once (nothing written)
            command = importlib.import_module(EXTRA_COMMANDS[argv[0]])
        return command.main(argv[1:])
    with stopsignal.importing():
        from .train_cli import run_training  # Lightning is imported here, for fit/validate/test only

    return run_training(argv)


def __getattr__(name: str) -> Any:
    """``ScaleVecCLI`` and ``ScaleVecArgumentParser`` (``train_cli.py``) under their former names, imported when
    asked for (a subclass in a user's script: ``from scalevec_lit.cli import ScaleVecCLI``)."""
    if name in ("ScaleVecCLI", "ScaleVecArgumentParser"):
        from . import train_cli

        return getattr(train_cli, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if __name__ == "__main__":
    main()
