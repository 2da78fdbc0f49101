"""The tokenizer an export ships: the one recorded in the checkpoint (path, file hash and content hash, as in
``meta.json``; an export ships exactly that tokenizer or refuses with the fix), ``--tokenizer`` (checked
by content against the recorded one, or the one inside a native folder), a native export folder, or, for checkpoints written before the
identity was recorded, the run's ``config.yaml`` near the checkpoint (``find_tokenizer``; the ``meta.json`` of its
``data.data_dir`` is read where it lies, a local folder or an ``s3://`` one), written with the ``tokenizer_config.json`` and
``special_tokens_map.json`` transformers' AutoTokenizer reads (``write_tokenizer``).

Plain Python (+ tokenizers, yaml): must not import torch, Lightning or transformers, nor the other export
modules except ``errors``.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional

from ..data.prepared_meta import meta_location, read_meta, tokenizer_copy
from ..data.remote import is_remote, join
from ..data.tokenizer import DEFAULT_TOKENIZER, Tokenizer, data_tokenizer, describe_tokenizer, same_tokenizer
from ..errors import UserError
from .errors import ExportError


def _run_configs(ckpt: Path) -> list[Path]:
    """The ``config.yaml`` files LightningCLI saved for the run of ``ckpt``: beside its folder
    (``<log_dir>/checkpoints/x.ckpt``), else in the logger's version folders under an ancestor
    (``<root>/checkpoints/x.ckpt`` with ``<root>/<name>/version_N/config.yaml``)."""
    for folder in list(ckpt.resolve().parents)[:2]:
        if (folder / "config.yaml").is_file():
            return [folder / "config.yaml"]
        found = sorted(folder.glob("version_*/config.yaml")) + sorted(folder.glob("*/version_*/config.yaml"))
        if found:
            return found
    return []


def _tokenizer_of_config(cfg: Path) -> tuple[Optional[Path], str]:
    """``(tokenizer, where from)`` from a run's config.yaml; ``(None, why not)`` when it does not say. The
    ``meta.json`` of ``data.data_dir`` is read where it lies (a local folder, or an ``s3://`` one with the
    run's ``data.storage_options``); the tokenizer it names is a path on the machine that prepared the data:
    used only when that file is here (and, when recorded, the same by content)."""
    import yaml

    data = (yaml.safe_load(cfg.read_text()) or {}).get("data") or {}
    data = data.get("init_args", data)
    if data.get("tokenizer"):
        return Tokenizer(data["tokenizer"], key=f"data.tokenizer in {cfg}").path, f"data.tokenizer of {cfg}"
    data_dir = data.get("data_dir")
    first = data_dir[0] if isinstance(data_dir, list) and data_dir else data_dir
    key = f"data.data_dir of {cfg}"
    try:
        meta = read_meta(first, data.get("storage_options"), key=key) if first else None
    except UserError as err:  # a remote meta.json that cannot be read: no guess at the tokenizer
        raise type(err)(err.key, err.value, err.problem, f"pass --tokenizer <the tokenizer.json the data was "
                        f"prepared with>, or {err.fix}") from None
    where = meta_location(first) if first else None
    if meta is None:
        return None, f"data.data_dir of {cfg} ({data_dir!r}) has no meta.json seen from here"
    path, copy_url = meta.get("tokenizer"), None
    if (not path or not Path(path).is_file()) and is_remote(first):  # prepared elsewhere: the copy it uploaded
        copy = tokenizer_copy(first, data.get("storage_options"), data.get("cache_dir"), key=key)
        if copy is not None:
            path, copy_url = str(copy), join(first, "tokenizer.json")
    if not path or not Path(path).is_file():
        gone = ("a path on the machine that prepared it, which is not on this one" if is_remote(first)
                else "which is not there any more")
        raise ExportError(f"the run's data ({where}) was prepared with the tokenizer {path!r}, {gone}; pass "
                          "--tokenizer <tokenizer.json>")
    recorded = data_tokenizer(meta, where)
    if recorded and same_tokenizer(recorded, Tokenizer(path).identity()) is False:
        raise ExportError(
            f"the run's data ({where}) was prepared with the tokenizer {describe_tokenizer(recorded)}, but "
            f"{f'its copy {copy_url}' if copy_url else repr(path) + ' here'} is another one ({describe_tokenizer(Tokenizer(path).identity())}); "
            "pass --tokenizer <a copy of the tokenizer.json the data was prepared with>"
        )
    if copy_url:
        return Path(path), (f"the tokenizer {where} was prepared with, from the copy prepare uploaded ({copy_url}; "
                            f"data.data_dir of {cfg})")
    return Path(path), f"the tokenizer {where} was prepared with (data.data_dir of {cfg})"


def find_tokenizer(ckpt: Optional[str | Path], explicit: Optional[str | Path] = None,
                   recorded: Optional[dict] = None) -> tuple[Path, str]:
    """The tokenizer.json to ship and a note saying where it came from.

    With ``recorded`` (``{"path", "sha256"}`` from ``checkpoint['scalevec']['tokenizer']``): ``--tokenizer``
    if its fingerprint matches, else the recorded file if it is still there unchanged, else an
    ``ExportError`` with the fix. Without (older checkpoints): ``--tokenizer``; the one inside a native
    export folder; the run's ``config.yaml`` near the checkpoint (``data.tokenizer``, else the tokenizer
    that ``data.data_dir`` was prepared with, from its ``meta.json``); else the embedded one, and the note
    says so.
    """
    if recorded and recorded.get("sha256"):
        return _recorded_tokenizer(recorded, explicit)
    inside = Path(ckpt) / "tokenizer.json" if ckpt is not None else None
    if inside is not None and inside.is_file():  # a native folder ships its own: --tokenizer must be the same
        return _recorded_tokenizer({**Tokenizer(inside, key=str(inside)).identity(), "source": None}, explicit) \
            if explicit is not None else (inside, f"the one in {ckpt}")
    if explicit is not None:
        return Tokenizer(explicit, key="--tokenizer").path, "given with --tokenizer"
    why = "no --tokenizer and no run config.yaml near the checkpoint"
    found = {}
    for cfg in _run_configs(Path(ckpt)) if ckpt is not None else []:
        path, note = _tokenizer_of_config(cfg)
        if path is None:
            why = f"no --tokenizer, and {note}"
        else:
            found.setdefault(Tokenizer(path).fingerprint(), (path, note))
    if len(found) > 1:
        names = ", ".join(str(path) for path, _ in found.values())
        raise ExportError(
            f"the run folders near {str(ckpt)!r} name different tokenizers ({names}); pass --tokenizer <tokenizer.json>"
        )
    if found:
        return next(iter(found.values()))
    return DEFAULT_TOKENIZER, (
        f"{why}: shipping the embedded tokenizer {DEFAULT_TOKENIZER}; pass --tokenizer if the model was trained "
        "with another"
    )


def _recorded_tokenizer(recorded: dict, explicit: Optional[str | Path]) -> tuple[Path, str]:
    """The recorded tokenizer, or ``--tokenizer`` when it is the same by content (a copy, or the file re-saved
    by another version of ``tokenizers``); anything else is refused with both names."""
    want, path = recorded.get("content") or recorded["sha256"], recorded.get("path")
    if explicit is not None:
        tok = Tokenizer(explicit, key="--tokenizer")
        if not same_tokenizer(recorded, tok.identity()):
            raise ExportError(
                f"--tokenizer: {str(explicit)!r}: is not the tokenizer the model was trained with: given "
                f"{describe_tokenizer(tok.identity())}, trained with {describe_tokenizer(recorded)}; pass that "
                "tokenizer.json (a copy is fine) or leave --tokenizer out"
            )
        return tok.path, "given with --tokenizer (the same, by content, as the one recorded in the checkpoint)"
    if path and Path(path).is_file():
        tok = Tokenizer(path, key="the checkpoint's tokenizer")
        if same_tokenizer(recorded, tok.identity()):
            source = f"the tokenizer {recorded['source']} was prepared with" if recorded.get("source") else "the tokenizer"
            return tok.path, f"{source} ({path}, {want}, recorded in the checkpoint)"
        state = f"has changed since training (now {describe_tokenizer(tok.identity())})"
    else:
        state = "is not there any more"
    raise ExportError(
        f"--tokenizer: (not given): the model was trained with the tokenizer {describe_tokenizer(recorded)}, which "
        f"{state}; pass --tokenizer <a copy of that tokenizer.json>"
    )


def write_tokenizer(path: Path, out: Path, vocab_size: int, max_length: int) -> Tokenizer:
    """Copy ``tokenizer.json`` and write the ``tokenizer_config.json`` transformers' AutoTokenizer reads."""
    from tokenizers import Tokenizer as RawTokenizer

    tok = Tokenizer(path, key="--tokenizer")
    if tok.vocab_size > vocab_size:
        raise ExportError(
            f"--tokenizer: {str(path)!r} has {tok.vocab_size} tokens but the model's vocab_size is {vocab_size}; "
            "pass the tokenizer.json the model was trained with"
        )
    shutil.copyfile(tok.path, out / "tokenizer.json")
    eos = RawTokenizer.from_file(str(tok.path)).id_to_token(tok.eos_id)
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "bos_token": None, "pad_token": None,
        "unk_token": None, "model_max_length": max_length, "clean_up_tokenization_spaces": False,
    }, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps({"eos_token": eos}, indent=2))
    return tok
