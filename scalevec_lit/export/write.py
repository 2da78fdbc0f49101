"""Writing an export folder: safetensors (sharded with ``model.safetensors.index.json`` above
``max_shard_size``), the Hugging Face folder (``save_hf``: folded weights, ``config.json``,
``generation_config.json``, tokenizer files) and the native format (``save_native``: our unfolded state
dict + the spec as JSON, read back by ``load_native``). The output folder is written all or nothing, and
``--overwrite`` replaces exactly the files of an earlier export/import/convert there, whatever its format
(``scalevec_lit/outdir.py``): an hf export over a native one leaves no native file behind, and the reverse.

Plain torch (+ safetensors): must not import Lightning or transformers, nor the cli module of this package.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Optional

import torch

from ..data.tokenizer import DEFAULT_TOKENIZER, Tokenizer
from ..model.spec import spec_of
from ..model.transformer import Transformer
from ..outdir import output_folder
from ..checkpoint import NATIVE_SPEC, load_model
from .errors import ExportError
from .hf import DTYPES, hf_layout
from .tokenizer import write_tokenizer


def parse_size(text: str | int) -> int:
    """``'5GB'``, ``'500MB'``, ``'2MiB'`` or a byte count → bytes."""
    if isinstance(text, int):
        return text
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?I?B?)\s*", str(text).upper())
    if not m:
        raise ExportError(f"--max-shard-size: {text!r} is not a size; write e.g. 5GB, 500MB or 1000000")
    unit = m.group(2).rstrip("B") or ""
    base = 1024 if unit.endswith("I") else 1000
    power = " KMGT".index(unit.rstrip("I") or " ")
    return int(float(m.group(1)) * base**power)


def write_safetensors(tensors: dict[str, torch.Tensor], out: Path, max_shard_size: int | str = "5GB") -> list[str]:
    """``model.safetensors``, or shards + ``model.safetensors.index.json`` when above ``max_shard_size``."""
    from safetensors.torch import save_file

    limit = parse_size(max_shard_size)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, tensor in tensors.items():
        nbytes = tensor.numel() * tensor.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append({})
            size = 0
        shards[-1][name] = tensor
        size += nbytes
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata={"format": "pt"})
        return ["model.safetensors"]
    names = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map = {}
    for fname, shard in zip(names, shards):
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        weight_map.update({k: fname for k in shard})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return names + ["model.safetensors.index.json"]


def _default_note(tokenizer: Optional[Path]) -> str:
    return f"given: {tokenizer}" if tokenizer is not None else f"none given: the embedded {DEFAULT_TOKENIZER}"


@dataclass
class ExportResult:
    """What an export wrote: the folder, ``format`` (``hf`` or ``native``), the architecture written, the files
    (relative to ``out``) and where the tokenizer came from."""

    out: Path
    format: str
    architecture: str
    files: list[str]
    tokenizer_note: str


Sources = Iterable[tuple[str, "str | Path | None"]]


def save_hf(model: Transformer, out: str | Path, *, tokenizer: Optional[Path] = None, tokenizer_note: str = "",
            max_shard_size: int | str = "5GB", dtype: str = "float32", overwrite: bool = False,
            sources: Sources = ()) -> ExportResult:
    """Fold ``model`` and write it as a transformers checkpoint folder (see the module docstring).

    ``out`` is written all or nothing and must not overlap ``sources`` (``(option, path)`` of what the
    command read); ``overwrite`` replaces an earlier output of export/import/convert (``outdir.py``)."""
    if dtype not in DTYPES:
        raise ExportError(f"--dtype: {dtype!r} is not one of {', '.join(DTYPES)}")
    tok_path = Path(tokenizer) if tokenizer is not None else DEFAULT_TOKENIZER
    eos_id = Tokenizer(tok_path, key="--tokenizer").eos_id
    layout = hf_layout(model, eos_id=eos_id, dtype=DTYPES[dtype])  # refuses before touching --out
    with output_folder(out, command="export", inputs=sources, overwrite=overwrite) as dest:
        files = write_safetensors(layout.tensors, dest, max_shard_size)
        (dest / "config.json").write_text(json.dumps(layout.config, indent=2))
        (dest / "generation_config.json").write_text(json.dumps({"eos_token_id": eos_id}, indent=2))
        write_tokenizer(tok_path, dest, model.config.vocab_size, model.config.seq_len)
    files += ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]
    return ExportResult(Path(out), "hf", layout.architecture, files, tokenizer_note or _default_note(tokenizer))


def write_native_files(model: Transformer, dest: Path, *, spec: Optional[dict[str, Any]] = None,
                       tokenizer: Optional[Path] = None, max_shard_size: int | str = "5GB") -> list[str]:
    """The native files in the folder ``dest`` (no checks: ``save_native`` and ``hub.write_native`` give it
    the temporary folder of their output)."""
    spec = spec or spec_of(model)  # the model's class, block with init_args and strategy (model/spec.py)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    if model.tied:
        state.pop(Transformer.HEAD_KEY, None)  # tied: rebuilt from the spec's tie_embeddings
    files = write_safetensors(state, dest, max_shard_size)
    (dest / NATIVE_SPEC).write_text(json.dumps(spec, indent=2))
    tok_path = Path(tokenizer) if tokenizer is not None else DEFAULT_TOKENIZER
    write_tokenizer(tok_path, dest, model.config.vocab_size, model.config.seq_len)
    return files + [NATIVE_SPEC, "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"]


def save_native(model: Transformer, out: str | Path, *, spec: Optional[dict[str, Any]] = None,
                tokenizer: Optional[Path] = None, tokenizer_note: str = "", max_shard_size: int | str = "5GB",
                overwrite: bool = False, sources: Sources = ()) -> ExportResult:
    """Our own state dict (unfolded, fp32) as safetensors + the spec as JSON (``load_native`` reads it);
    ``out`` as in ``save_hf``."""
    with output_folder(out, command="export", inputs=sources, overwrite=overwrite) as dest:
        files = write_native_files(model, dest, spec=spec, tokenizer=tokenizer, max_shard_size=max_shard_size)
    return ExportResult(Path(out), "native", "scalevec_lit Transformer", files,
                        tokenizer_note or _default_note(tokenizer))


def load_native(folder: str | Path) -> Transformer:
    """Rebuild a model written by ``save_native`` (fp32, eval mode)."""
    return load_model(folder)[0]
