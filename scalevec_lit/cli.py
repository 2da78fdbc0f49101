"""The command line: ``python -m scalevec_lit {fit,validate,test,prepare} ...``.

``fit``/``validate``/``test`` are LightningCLI subcommands over ``CausalLM`` and ``TokenDataModule``
(YAML recipes, ``--print_config``); the data module's vocabulary and the model's sequence length are
linked so that a recipe cannot disagree with its tokenizer. ``prepare`` tokenizes text into chunks.
"""
from __future__ import annotations

import sys
from typing import Optional

from lightning.pytorch.cli import LightningCLI

from .data.datamodule import TokenDataModule
from .lit.module import CausalLM

EXTRA_COMMANDS = {
    "prepare": "scalevec_lit.data.prepare",
    "export": "scalevec_lit.export",
    "study": "scalevec_lit.study",
}


class ScaleVecCLI(LightningCLI):
    """LightningCLI with the links between data and model."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("model.config.seq_len", "data.seq_len")
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")


def main(args: Optional[list[str]] = None) -> None:
    argv = list(sys.argv[1:] if args is None else args)
    if argv and argv[0] in EXTRA_COMMANDS:
        import importlib

        importlib.import_module(EXTRA_COMMANDS[argv[0]]).main(argv[1:])
        return
    ScaleVecCLI(
        CausalLM,
        TokenDataModule,
        auto_configure_optimizers=False,
        save_config_kwargs={"overwrite": True},
        seed_everything_default=42,
        args=argv,
    )


if __name__ == "__main__":
    main()
