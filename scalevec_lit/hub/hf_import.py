"""``python -m scalevec_lit import --hf DIR --out PATH [--strategy recipes/strategy/X.yaml]``: a local
transformers checkpoint (``config.json`` + ``model.safetensors`` or shards with
``model.safetensors.index.json``; nothing is downloaded) of an architecture whose adapter imports
(``scalevec_lit/arch/``: ``LlamaForCausalLM``, ``Qwen3ForCausalLM``, ``Qwen3MoeForCausalLM``,
``MixtralForCausalLM``) becomes a native checkpoint with its spec, the tokenizer beside it and
``model.yaml`` (see ``convert.write_native``).

The folder is read by ``scalevec_lit.checkpoint`` (``checkpoint/hf.py``: ``load_hf``, the native model that
holds the checkpoint as it is); this file is the command: ``import_hf`` and ``main``. With ``--strategy`` the
model is converted as ``convert`` does.

Plain torch (+ safetensors): must not import Lightning or transformers.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

from ..checkpoint.hf import load_hf
from ..errors import CommandLineParser, UserError
from ..outdir import OutputFolder
from ..scale.keeps import branch_normalizes
from ._args import add_output_options
from .convert import convert_model, read_strategy, report_lines, write_native


def _tokenizer(folder: Path, given: Optional[str | Path]) -> Path:
    path = Path(given) if given is not None else folder / "tokenizer.json"
    if not path.is_file():
        raise UserError("--tokenizer" if given is not None else "--hf", str(path.parent if given is None else path),
                        "has no tokenizer.json" if given is None else "no such file",
                        "pass --tokenizer <a Hugging Face tokenizer.json> (sentencepiece-only folders: save the "
                        "tokenizer with transformers' AutoTokenizer.save_pretrained first)")
    return path


def import_hf(hf: str | Path, out: str | Path, *, strategy: Optional[str | Path] = None, allow_function_change: bool = False,
              tokenizer: Optional[str | Path] = None, overwrite: bool = False) -> tuple[list[str], list[str]]:
    """Import ``hf`` into ``out``; returns ``(files written, lines to print)``."""
    folder = Path(hf)
    sources = [("--hf", folder), ("--tokenizer", tokenizer)]
    OutputFolder(out, command="import", inputs=sources, overwrite=overwrite).check()  # before the long read
    if not (folder / "config.json").is_file():
        raise UserError("--hf", str(folder), "has no config.json", "give a local transformers checkpoint folder")
    tok = _tokenizer(folder, tokenizer)
    model, arch = load_hf(folder)
    qk_norm = branch_normalizes(model.strategy, "q")
    lines = [f"imported {arch} from {folder}: {sum(p.numel() for p in model.parameters()):,} parameters, "
             f"eps {model.strategy.eps:g}, {'QK-norm as DNP on q/k (output_shape: head)' if qk_norm else 'one γ per norm'}"]
    if strategy is not None:
        model, report, moved = convert_model(model, read_strategy(strategy, model.strategy.eps),
                                             allow_function_change=allow_function_change, value=str(strategy))
        lines += report_lines(report, moved, f"converted to {strategy}")
    files = write_native(model, out, tokenizer=tok, overwrite=overwrite, command="import", sources=sources)
    return files, lines


def main(argv: Optional[list[str]] = None) -> None:
    parser = CommandLineParser(prog="python -m scalevec_lit import",
                               description="Import a local transformers checkpoint as a native checkpoint.")
    parser.add_argument("--hf", required=True, help="local folder: config.json + safetensors (+ tokenizer.json)")
    parser.add_argument("--out", required=True, help="output folder (native format + tokenizer + model.yaml)")
    parser.add_argument("--strategy", default=None, help="convert to this strategy preset (recipes/strategy/X.yaml)")
    add_output_options(parser, function_change="with --strategy: convert even where the function changes",
                       tokenizer="tokenizer.json (default: the one in --hf)")
    args = parser.parse_args(argv)
    files, lines = import_hf(args.hf, args.out, strategy=args.strategy, allow_function_change=args.allow_function_change,
                             tokenizer=args.tokenizer, overwrite=args.overwrite)
    for line in lines:
        print(line)
    print(f"wrote {args.out}: {', '.join(files)}")
    print(f"train on: python -m scalevec_lit fit --config <recipe> --config {Path(args.out) / 'model.yaml'} "
          f"--model.init_from {args.out}")
