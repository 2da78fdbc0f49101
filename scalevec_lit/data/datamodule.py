"""TokenDataModule: streams prepared token chunks with litdata (StreamingDataset + TokensLoader).

Blocks are ``seq_len + 1`` tokens (inputs and shifted targets). Before litdata reads anything (``setup``,
or the first loader) every prepared folder is checked against the chunk record of its ``meta.json``
(``integrity.py``; ``data.verify``): a missing, truncated or corrupt chunk stops the run at once, naming
the file and the prepare command to run again.

Resume: Lightning saves the training loader's position (litdata's ``StreamingDataLoader.state_dict``) with
its fit loop in every checkpoint and restores it into the new loader before the first batch
(``_FitLoop._load_combined_loader_states``; ``tests/test_data_integrity.py`` resumes at several positions
and fails when that restore is off). The data module adds only the fingerprint of each folder's training
split (``state_dict``): litdata refuses a saved position whose folder path differs ("input_dir path state
doesn't match"), so when the prepared folder moved and the fingerprints agree, the position is moved to
the folder given now (``_relocate``); when they differ, or an older checkpoint has none and its folder is
gone, the run stops naming both folders.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Optional, Union

import lightning as L

from ..errors import UserError
from .integrity import VERIFY_MODES, check_prepared, fingerprint, relocate_state
from .loaders import release, relocating_loader, same_batch_count_on_every_rank, stream, tokens_loader
from .cache import TOKENIZER, cache_bytes, mirror, register
from .prepare import META
from .remote import Remote, check_options, is_remote, join
from .loader_workers import worker_args
from .tokenizer import TEXT_SUFFIXES, Tokenizer, data_tokenizer, same_tokenizer
from .first_run import prepare_default_if_missing


class TokenDataModule(L.LightningDataModule):
    """Prepared token data (``python -m scalevec_lit prepare``) for causal language modelling.

    Args:
        data_dir: a prepared folder (``meta.json``, ``train/``, ``val/``); local path or ``s3://`` URL; or a
            list of them, local and remote mixed, by ``weights`` (litdata ``CombinedStreamingDataset``; all
            must share a tokenizer). A remote folder is read through one client (``remote.py``) and cached
            on this node (``cache.py``).
            The default location of the embedded corpus (``data/prepared/shakespeare``) is prepared here
            when it is missing; any other missing folder stops with the prepare command to run.
        weights: sampling weights of the folders in ``data_dir`` (default: proportional to their tokens).
        names: one name per folder of ``data_dir`` for the per-source validation metrics
            (``val/<name>/loss``, ``val/<name>/ppl``; default: the folder names). With several folders the
            validation split of each is its own validation loader.
        seq_len: tokens per training example (linked from ``model.config.seq_len`` by the CLI).
        batch_size: examples per device per step.
        num_workers: loader worker processes.
        tokenizer: optional ``tokenizer.json`` to check against the one the data was prepared with.
        shuffle: shuffle the training chunks and blocks (seeded).
        seed: shuffle seed.
        val_batches: cap on validation batches per validation run (None: the whole split).
        verify: how the prepared chunks are checked at start (``integrity.py``): ``auto`` (sizes always, and
            the SHA-256 of every chunk when a folder holds at most 1 GiB of them), ``sizes`` or ``checksums``.
            A remote chunk's SHA-256 is checked as it is downloaded (``auto``, ``checksums``).
        storage_options: endpoint, credentials and retries of the remote folders (``remote.STORAGE_KEYS``:
            ``endpoint_url``, ``aws_access_key_id``, ``aws_secret_access_key``, ``aws_session_token``,
            ``region_name``, ``profile``, ``retries``, ``retry_wait``, ``timeout``); default: the standard AWS
            configuration (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``, ...).
        cache_dir: this node's cache of remote folders (default ``~/.cache/scalevec_lit/data``, or
            ``$SCALEVEC_CACHE_DIR``).
        cache_size: the most its chunks may take per folder: bytes, or e.g. ``"20GB"``, ``"500MB"``, ``"2GiB"``
            (litdata's ``max_cache_size``; chunks already read are deleted above it); default: no cap.
    """

    def __init__(
        self,
        data_dir: Union[str, list[str]] = "data/prepared/shakespeare",
        weights: Optional[list[float]] = None,
        names: Optional[list[str]] = None,
        seq_len: int = 256,
        batch_size: int = 8,
        num_workers: int = 0,
        tokenizer: Optional[str] = None,
        shuffle: bool = True,
        seed: int = 42,
        val_batches: Optional[int] = None,
        verify: str = "auto",
        storage_options: Optional[dict] = None,
        cache_dir: Optional[str] = None,
        cache_size: Optional[str] = None,
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
        if verify not in VERIFY_MODES:
            raise UserError("data.verify", verify, f"not one of {', '.join(VERIFY_MODES)}", "use auto (the default), "
                            "sizes or checksums")
        self.verify = verify
        self.storage_options, self.cache_dir = check_options(storage_options), cache_dir
        self.cache_size = cache_bytes(cache_size)
        self.source_names = self._source_names(self.data_dirs, names)
        for d in self.data_dirs:
            prepare_default_if_missing(d)
        self._local: list = []  # the folder litdata reads: the prepared folder, or a remote folder's cache
        self._listing: list = []  # a remote folder's objects and sizes (None: local)
        self.metas = metas = []
        for d in self.data_dirs:
            local, meta, listing = mirror(Remote(d, storage_options), cache_dir) if is_remote(d) else \
                (Path(d), self._read_meta(d), None)
            self._local.append(local)
            metas.append(meta)
            self._listing.append(listing)
        self.meta = metas[0]
        first = data_tokenizer(self.meta, str(self.data_dirs[0])) or {}
        for d, m in zip(self.data_dirs[1:], metas[1:]):
            other = data_tokenizer(m, str(d)) or {}
            if (other or first) and not same_tokenizer(other, first):  # by content: a copy is the same
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
        cached = self._local[0] / TOKENIZER
        if not tokenizer and is_remote(self.data_dir) and cached.is_file():
            self.tokenizer_path = str(cached)  # the copy prepare uploaded beside the data, not a path of its machine
        if tokenizer is not None:
            tok = Tokenizer(tokenizer, key="data.tokenizer")
            if first and not same_tokenizer(tok.identity(), first):
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
        self._checked = False
        self._fingerprints = [fingerprint(d, m, local=loc) for d, m, loc in zip(self.data_dirs, metas, self._local)]
        self._saved: Optional[list] = None  # the fingerprints of the checkpoint being resumed
        self._streams: list = []  # the litdata datasets made here, until ``teardown`` stops their threads

    @staticmethod
    def _source_names(data_dirs: list[str], names: Optional[list[str]]) -> list[str]:
        """A metric-safe name per folder: ``names`` as given, else the folder names (made unique)."""
        if names is not None:
            names = [str(n) for n in names]
            if len(names) != len(data_dirs):
                raise ValueError(f"data.names: {len(names)} names for {len(data_dirs)} folders in data.data_dir; give one "
                                 "each, e.g. --data.names '[web, code]'")
            bad = [n for n in names if not n or not re.fullmatch(r"[\w.-]+", n)]
            if bad or len(set(names)) != len(names):
                raise ValueError(f"data.names: {names}: each name must be distinct and made of letters, digits, '_', "
                                 "'.' or '-' (it becomes part of the metric val/<name>/loss); e.g. [web, code]")
            return names
        out: list[str] = []
        for d in data_dirs:
            base = re.sub(r"[^\w.-]", "_", d.rstrip("/").rsplit("/", 1)[-1]) or "data"
            name, k = base, 2
            while name in out:
                name, k = f"{base}_{k}", k + 1
            out.append(name)
        return out

    @staticmethod
    def _read_meta(data_dir: str) -> dict:
        root = Path(data_dir)
        meta = root / META
        if root.is_file():
            raise NotADirectoryError(
                f"data.data_dir: {data_dir!r}: is a file, not a prepared folder; give the folder that "
                "`python -m scalevec_lit prepare --output <folder>` wrote (it holds meta.json, train/ and val/)"
            )
        if not meta.is_file():
            hint = (
                f"run `python -m scalevec_lit prepare --output {data_dir}` (the embedded corpus)"
                if "shakespeare" in data_dir
                else f"run `python -m scalevec_lit prepare --input <text folder> --output {data_dir}`"
            )
            what = "does not exist" if not root.exists() else f"has no {META} (not prepared)"
            if root.is_dir() and any(p.suffix.lower() in TEXT_SUFFIXES for p in root.rglob("*")):  # text: beside it
                out = f"{data_dir.rstrip('/')}-prepared"
                what = f"has no {META}: a folder of text files, not prepared data"
                hint = (f"prepare it into a folder of its own: `python -m scalevec_lit prepare --input {data_dir} "
                        f"--output {out}`, then use --data.data_dir={out}")
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

    def _source(self, data_dir: str, split: str, shuffle: bool):
        from litdata.streaming.resolver import Dir

        remote = {}
        if is_remote(data_dir):  # litdata downloads the chunks into the cache folder, through remote.py
            register()
            local = self._local[self.data_dirs.index(data_dir)]
            remote = dict(input_dir=Dir(path=str(local / split), url=join(data_dir, split)),
                          storage_options={**self.storage_options, "verify": self.verify}, max_cache_size=self.cache_size)
        dataset = stream(
            input_dir=remote.pop("input_dir", f"{data_dir.rstrip('/')}/{split}"),
            item_loader=tokens_loader(self.seq_len + 1, is_remote(data_dir)),
            shuffle=shuffle,
            drop_last=True,
            seed=self.seed,
            **remote,
        )
        self._streams.append(dataset)
        return dataset

    def _dataset(self, split: str, shuffle: bool):
        from litdata import CombinedStreamingDataset

        datasets = [self._source(d, split, shuffle) for d in self.data_dirs]
        if len(datasets) == 1:
            return datasets[0]
        return CombinedStreamingDataset(
            datasets, seed=self.seed, weights=self.weights, iterate_over_all=(split == "val" or self.weights is None)
        )

    def setup(self, stage: Optional[str] = None) -> None:
        from ..known_warnings import filter_litdata_length

        filter_litdata_length()  # litdata streams have an exact length per rank and worker (known_warnings.py)
        self.check_data()

    def teardown(self, stage: Optional[str] = None) -> None:
        """Stop litdata's chunk threads of every dataset made here (Lightning calls this after each fit,
        validate or test; ``on_exception`` after one stopped by an error): litdata would otherwise keep them,
        still polling or downloading, for the rest of the process (``loaders.release``). The chunks in the
        cache stay; the loaders made next (a second fit) start new threads."""
        streams, self._streams = self._streams, []
        release(streams)

    def on_exception(self, exception: BaseException) -> None:
        """A fit stopped by an error: Lightning calls no ``teardown`` then, so the threads are stopped here. A
        stop signal (Ctrl-C, SIGTERM) ends the process at once instead; its daemon threads end with it."""
        if isinstance(exception, Exception):
            self.teardown()

    def check_data(self) -> None:
        """Check every prepared folder's chunks against its record (once; ``integrity.check_prepared``)."""
        if not self._checked:
            for d, m, local, listing in zip(self.data_dirs, self.metas, self._local, self._listing):
                check_prepared(d, m, self.verify, local, listing)
            self._checked = True

    def train_dataloader(self):
        self.check_data()
        loader = relocating_loader()(self._dataset("train", self.shuffle), batch_size=self.batch_size,
                                     drop_last=True, **self._workers())
        loader.relocate = self._relocate
        return loader

    def _workers(self) -> dict[str, Any]:
        """A loader's worker arguments: workers start from a fork server, never forked from the rank
        (``loader_workers.py``)."""
        return worker_args(self.num_workers, remote=any(is_remote(d) for d in self.data_dirs))

    def val_dataloader(self):
        """One loader; with several folders, one per folder, in the order of ``source_names`` (the module logs
        ``val/<name>/loss`` for each, and ``val/loss`` over all of them)."""
        import torch.distributed as dist

        self.check_data()
        distributed = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1

        def loader(dataset):
            return relocating_loader()(dataset, batch_size=self.batch_size, drop_last=distributed, **self._workers())

        loaders = [loader(self._source(d, "val", False)) for d in self.data_dirs]
        if distributed:
            loaders = same_batch_count_on_every_rank(loaders)
        return loaders[0] if len(loaders) == 1 else loaders

    def test_dataloader(self):
        """The loaders of ``val_dataloader``: a prepared folder holds a train and a val split only, so ``test``
        reads the val split (a test set is prepared into a folder of its own and given as ``data.data_dir``)."""
        return self.val_dataloader()

    # -- resume: Lightning restores the loader position; a moved folder is followed when its data are the same --
    def state_dict(self) -> dict[str, Any]:
        return {"sources": [{"dir": d, "fingerprint": fp} for d, fp in zip(self.data_dirs, self._fingerprints)]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._saved = state_dict.get("sources")  # None: a checkpoint written before the fingerprints

    def _relocate(self, state: dict) -> dict:
        return relocate_state(state, self.data_dirs, self._fingerprints, self._saved, self._local)
