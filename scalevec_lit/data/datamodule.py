"""TokenDataModule: streams prepared token chunks with litdata (StreamingDataset + TokensLoader).

Blocks are ``seq_len + 1`` tokens (inputs and shifted targets). The training loader's position is part
of the module's ``state_dict`` (saved in every checkpoint and restored on resume, see
``scalevec_lit/lit/module.py``), because Lightning does not always restore a ``StreamingDataLoader``
by itself (litdata issue 775).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Union

import lightning as L
import torch

from .prepare import META
from .tokenizer import Tokenizer


class TokenDataModule(L.LightningDataModule):
    """Prepared token data (``python -m scalevec_lit prepare``) for causal language modelling.

    Args:
        data_dir: a prepared folder (``meta.json``, ``train/``, ``val/``); local path or ``s3://`` URL; or a
            list of them, mixed by ``weights`` (litdata ``CombinedStreamingDataset``; all must share a tokenizer).
        weights: sampling weights of the folders in ``data_dir`` (default: proportional to their tokens).
        seq_len: tokens per training example (linked from ``model.config.seq_len`` by the CLI).
        batch_size: examples per device per step.
        num_workers: loader worker processes.
        tokenizer: optional ``tokenizer.json`` to check against the one the data was prepared with.
        shuffle: shuffle the training chunks and blocks (seeded).
        seed: shuffle seed.
        val_batches: cap on validation batches per validation run (None: the whole split).
    """

    def __init__(
        self,
        data_dir: Union[str, list[str]] = "data/prepared/shakespeare",
        weights: Optional[list[float]] = None,
        seq_len: int = 256,
        batch_size: int = 8,
        num_workers: int = 0,
        tokenizer: Optional[str] = None,
        shuffle: bool = True,
        seed: int = 42,
        val_batches: Optional[int] = None,
    ) -> None:
        super().__init__()
        self.data_dirs = [data_dir] if isinstance(data_dir, str) else list(data_dir)
        if not self.data_dirs:
            raise ValueError("data.data_dir: an empty list; give at least one prepared folder")
        self.data_dir = self.data_dirs[0]
        if int(seq_len) < 1:
            raise ValueError(f"model.config.seq_len: {seq_len}: must be at least 1 token per example; set a "
                             "positive length, e.g. --model.config.seq_len=128")
        if int(batch_size) < 1:
            raise ValueError(f"data.batch_size: {batch_size}: must be at least 1; set e.g. --data.batch_size=8")
        self.seq_len = int(seq_len)
        self.batch_size = int(batch_size)
        self.num_workers = int(num_workers)
        self.shuffle = shuffle
        self.seed = seed
        self.val_batches = val_batches
        metas = [self._read_meta(d) for d in self.data_dirs]
        self.meta = metas[0]
        for d, m in zip(self.data_dirs[1:], metas[1:]):
            if m.get("tokenizer_sha256") != self.meta.get("tokenizer_sha256"):
                raise ValueError(
                    f"data.data_dir: {d!r} was prepared with tokenizer {m.get('tokenizer')!r}, but {self.data_dir!r} with "
                    f"{self.meta.get('tokenizer')!r}; mixed datasets must share one tokenizer (re-run prepare)"
                )
        if weights is not None and len(weights) != len(self.data_dirs):
            raise ValueError(
                f"data.weights: {len(weights)} weights for {len(self.data_dirs)} folders in data.data_dir; give one each"
            )
        if weights is not None and (any(w < 0 for w in weights) or sum(weights) <= 0):
            raise ValueError(f"data.weights: {weights} must be non-negative with a positive sum")
        self.weights = weights
        self.tokens = {s: sum(m["tokens"][s] for m in metas) for s in ("train", "val")}
        self.tokenizer_path = tokenizer or self.meta.get("tokenizer")
        if tokenizer is not None:
            tok = Tokenizer(tokenizer, key="data.tokenizer")
            if tok.fingerprint() != self.meta.get("tokenizer_sha256"):
                raise ValueError(
                    f"data.tokenizer: {tokenizer!r} (vocab {tok.vocab_size}) is not the tokenizer "
                    f"{self.meta.get('tokenizer')!r} (vocab {self.meta.get('vocab_size')}) that {data_dir!r} was "
                    "prepared with; re-run `python -m scalevec_lit prepare --tokenizer ...` or drop data.tokenizer"
                )
        block = self.seq_len + 1
        for split in ("train", "val"):
            have = self.tokens[split]
            if have < block * (self.batch_size if split == "train" else 1):
                raise ValueError(
                    f"model.config.seq_len: {self.seq_len} needs blocks of {block} tokens, but the {split} split of "
                    f"{data_dir!r} holds {have} tokens (fewer than one {'batch' if split == 'train' else 'block'}); "
                    "lower seq_len or batch_size, or prepare more text"
                )
        if block > self.meta.get("chunk_tokens", block):
            raise ValueError(
                f"model.config.seq_len: {self.seq_len} + 1 exceeds the prepared chunk size "
                f"{self.meta['chunk_tokens']} of {data_dir!r}; re-run prepare with --chunk-tokens >= {block}"
            )
        self._train_loader = None
        self._pending_state: Optional[dict] = None

    @staticmethod
    def _read_meta(data_dir: str) -> dict:
        if "://" in data_dir:  # remote: litdata reads index.json itself; meta.json next to it
            import fsspec

            with fsspec.open(f"{data_dir.rstrip('/')}/{META}", "r") as fh:
                return json.load(fh)
        root = Path(data_dir)
        meta = root / META
        if root.is_file():
            raise NotADirectoryError(
                f"data.data_dir: {data_dir!r}: is a file, not a prepared folder; give the folder that "
                "`python -m scalevec_lit prepare --output <folder>` wrote (it holds meta.json, train/ and val/)"
            )
        if not meta.is_file():
            hint = (
                "run `make prepare` (the embedded corpus)"
                if "shakespeare" in data_dir
                else f"run `python -m scalevec_lit prepare --input <text folder> --output {data_dir}`"
            )
            what = "does not exist" if not root.exists() else f"has no {META} (not prepared)"
            raise FileNotFoundError(f"data.data_dir: {data_dir!r} {what}; {hint}")
        for split in ("train", "val"):
            if not (root / split / "index.json").is_file():
                raise FileNotFoundError(
                    f"data.data_dir: {data_dir!r} has no {split}/index.json (an interrupted prepare?); "
                    "re-run prepare with --overwrite"
                )
        return json.loads(meta.read_text())

    @property
    def vocab_size(self) -> int:
        """Vocabulary of the tokenizer the data was prepared with (linked to ``model.vocab_size``)."""
        return int(self.meta["vocab_size"])

    def _dataset(self, split: str, shuffle: bool):
        from litdata import CombinedStreamingDataset, StreamingDataset, TokensLoader

        datasets = [
            StreamingDataset(
                input_dir=f"{d.rstrip('/')}/{split}",
                item_loader=TokensLoader(block_size=self.seq_len + 1),
                shuffle=shuffle,
                drop_last=True,
                seed=self.seed,
            )
            for d in self.data_dirs
        ]
        if len(datasets) == 1:
            return datasets[0]
        return CombinedStreamingDataset(
            datasets, seed=self.seed, weights=self.weights, iterate_over_all=(split == "val" or self.weights is None)
        )

    def train_dataloader(self):
        from litdata import StreamingDataLoader

        loader = StreamingDataLoader(
            self._dataset("train", self.shuffle),
            batch_size=self.batch_size,
            num_workers=self.num_workers,
            drop_last=True,
        )
        if self._pending_state is not None:
            loader.load_state_dict(self._pending_state)
            self._pending_state = None
        self._train_loader = loader
        return loader

    def val_dataloader(self):
        from litdata import StreamingDataLoader

        return StreamingDataLoader(
            self._dataset("val", False), batch_size=self.batch_size, num_workers=self.num_workers, drop_last=False
        )

    # -- exact resume: the loader position travels in the checkpoint ---------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"train_loader": self._train_loader.state_dict() if self._train_loader is not None else None}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state = state_dict.get("train_loader")
        if state is None:
            return
        if self._train_loader is not None:
            self._train_loader.load_state_dict(state)
        else:
            self._pending_state = state
