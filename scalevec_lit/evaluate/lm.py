"""``ScaleVecLM``: a native model (any strategy, dense or MoE) and its tokenizer as an lm-eval ``LM``.

- ``loglikelihood``: lm-eval's ``TemplateLM`` splits each ``(context, continuation)`` into tokens (an empty
  context is the end-of-text token, the document separator the model was trained with); the pairs run in
  batches, longest first, padded on the right, through the KV-cache-free forward (``Transformer.forward``).
  A pair longer than the model's context (``model.config.seq_len``) loses tokens from the left, as lm-eval's
  Hugging Face model does: the last ``seq_len + 1`` tokens are kept.
- ``loglikelihood_rolling``: lm-eval's rolling windows of ``seq_len`` tokens, each token predicted once.
- ``generate_until``: greedy decoding with the key/value cache (``model/cache.py``) until a stop sequence,
  the end-of-text token or ``max_gen_toks``; the context keeps its last ``seq_len - max_gen_toks`` tokens.
  Requests whose contexts have the same length decode together (the model has no padding mask).

Several processes (``rank``/``world_size``, the default ``torch.distributed`` group): lm-eval sees one process
on every rank (``self.rank == 0``, ``self.world_size == 1``), so every rank builds every request of every task
and calls the same methods with the same lists; each method cuts its work into units (a forward batch of
log-likelihoods, a batch of greedy decodes), in the order one process would run them, runs units ``r, r + W,
...`` on rank ``r`` and gathers the results (``all_gather_object``) on every rank. A rank with few or no units
(``limit`` below the number of ranks) calls the same collectives as the others, so nothing waits forever; the
metrics equal one process's (the same batches). The ranks first agree on the count of units (one all-reduce;
ranks that disagree stop together with an error). A model sharded with FSDP2 runs its forward collectively:
before each forward the ranks agree (one all-reduce) whether any still has work, and a rank with none runs a
one-token forward until none has (``generate_until`` too: decodes stop after different numbers of tokens). A
sharded model decodes without the cache (the cache path skips the root module's all-gather).

Imports lm-eval (the ``eval`` extra): import it through ``scalevec_lit.evaluate``, which says how to install it.
"""
from __future__ import annotations

import contextlib
import json
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

DEFAULT_MAX_GEN_TOKS = 256


class ScaleVecLM(TemplateLM):
    """``model`` (a ``Transformer``, or an FSDP2-sharded one) with ``tokenizer`` (``data.tokenizer.Tokenizer``).

    ``forward_context``: a context manager factory around every forward (e.g. Lightning's autocast);
    ``use_cache``: decode with the key/value cache (default: when the model supports it and is not sharded);
    ``rank``/``world_size``: this process in the default ``torch.distributed`` group (``process_rank``,
    ``process_count``); lm-eval is shown one process (see the module's docstring).
    """

    def __init__(self, model, tokenizer, batch_size: int = 8, device: Optional[torch.device | str] = None,
                 max_gen_toks: int = DEFAULT_MAX_GEN_TOKS, use_cache: Optional[bool] = None,
                 forward_context: Optional[Callable[[], contextlib.AbstractContextManager]] = None,
                 rank: int = 0, world_size: int = 1, name: str = "scalevec_lit") -> None:
        super().__init__()
        if batch_size < 1:
            raise ValueError(f"batch_size: {batch_size}: must be at least 1")
        self.model, self.tok, self.name = model, tokenizer, name
        self.batch_size = int(batch_size)
        self._device = torch.device(device) if device is not None else next(model.parameters()).device
        self._max_gen_toks = int(max_gen_toks)
        if not 0 <= int(rank) < int(world_size):
            raise ValueError(f"rank {rank}, world_size {world_size}: the rank must be in [0, world_size)")
        self.process_rank, self.process_count = int(rank), int(world_size)
        self._rank, self._world_size = 0, 1  # what lm-eval sees: every rank runs every request list
        self.forward_context = forward_context or contextlib.nullcontext
        self.sharded = self._is_sharded()
        self.use_cache = (not self.sharded and self._cache_usable()) if use_cache is None else bool(use_cache)
        if self.use_cache and self.sharded:
            raise ValueError("use_cache: True: a sharded (FSDP2) model decodes without the key/value cache (its "
                             "cached path skips the all-gather of the root's weights); leave use_cache unset")

    # -- what lm-eval asks of a model -------------------------------------------------------------------
    @property
    def eot_token_id(self) -> int:
        """The tokenizer's end-of-text id: the context of an empty one, and a stop of ``generate_until``."""
        return self.tok.eos_id

    @property
    def max_length(self) -> int:
        """The model's context, ``config.seq_len``: a longer request loses tokens from the left."""
        return int(self.model.config.seq_len)

    @property
    def max_gen_toks(self) -> int:
        """The most tokens ``generate_until`` adds to a context, unless the task's ``generation_kwargs`` set
        their own."""
        return self._max_gen_toks

    @property
    def tokenizer_name(self) -> str:
        return str(self.tok.path)

    def tok_encode(self, string: str, add_special_tokens: Optional[bool] = None, **kwargs) -> list[int]:
        return self.tok.encode(string, eos=False)

    def tok_decode(self, tokens: list[int]) -> str:
        """The text of ``tokens`` (``Tokenizer.decode``)."""
        return self.tok.decode(tokens)

    def get_model_info(self) -> dict:
        """What lm-eval records of the model in its results: parameter count, dtype and ``name``."""
        return {"model_num_parameters": sum(p.numel() for p in self.model.parameters()),
                "model_dtype": str(next(self.model.parameters()).dtype), "model_name": self.name}

    # -- several processes ------------------------------------------------------------------------------
    def _share(self, units: list, run: Callable[[object], object], what: str) -> list:
        """``[run(u) for u in units]``, unit ``i`` run on rank ``i % process_count``, gathered on every rank.

        Every rank calls it with the same ``units`` (lm-eval gave every rank every request); a rank whose share
        is done (or empty) keeps a sharded model's forwards in step until every rank is done."""
        if self.process_count == 1:
            return [run(u) for u in units]
        import torch.distributed as dist

        counts = torch.tensor([len(units), -len(units)], device=self.device)
        dist.all_reduce(counts, op=dist.ReduceOp.MAX)
        if int(counts[0]) != -int(counts[1]):  # every rank sees the same counts: all stop here together
            raise RuntimeError(f"the {self.process_count} ranks were given different {what} work: from "
                               f"{-int(counts[1])} to {int(counts[0])} units (lm-eval must build the same "
                               "requests on every rank: the same tasks, limit and seeds)")
        mine = {i: run(units[i]) for i in range(self.process_rank, len(units), self.process_count)}
        self._keep_step()
        parts: list = [None] * self.process_count
        dist.all_gather_object(parts, mine)
        merged = {i: r for part in parts for i, r in part.items()}
        return [merged[i] for i in range(len(units))]

    def _any_rank(self, flag: bool) -> bool:
        """Whether ``flag`` holds on any rank (every rank calls it the same number of times)."""
        import torch.distributed as dist

        t = torch.tensor([1 if flag else 0], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def _keep_step(self) -> None:
        """A sharded model: a rank with no work left runs one-token forwards while any other still runs its own."""
        if self.sharded and self.process_count > 1:
            while self._any_rank(False):
                self._run(torch.full((1, 1), self.eot_token_id, dtype=torch.long, device=self.device))

    # -- the model --------------------------------------------------------------------------------------
    def _is_sharded(self) -> bool:
        """Whether the forward is collective: FSDP2 (``fully_shard``) anywhere in the model, or DTensor weights."""
        try:
            from torch.distributed.fsdp import FSDPModule
            from torch.distributed.tensor import DTensor
        except ImportError:  # pragma: no cover - torch without FSDP2
            return False
        return any(isinstance(m, FSDPModule) for m in self.model.modules()) or \
            any(isinstance(p, DTensor) for p in self.model.parameters())

    def _cache_usable(self) -> bool:
        from ..model.transformer import cache_unsupported

        return cache_unsupported(self.model) is None

    @torch.no_grad()
    def _run(self, idx: torch.Tensor, cache=None) -> torch.Tensor:
        with self.forward_context():
            logits = self.model(idx) if cache is None else self.model.forward_cached(idx, cache)
        return logits if logits.dtype == torch.float64 else logits.float()

    def _forward(self, idx: torch.Tensor, cache=None) -> torch.Tensor:
        """Logits of ``idx`` (the only place real work runs: a sharded model's ranks agree on it first)."""
        if self.sharded and self.process_count > 1:
            self._any_rank(True)
        return self._run(idx, cache)

    # -- log-likelihoods --------------------------------------------------------------------------------
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        """``(sum of log p(continuation | context), whether greedy decoding gives the continuation)`` per
        ``(key, context tokens, continuation tokens)``."""
        L = self.max_length
        rows = []
        for _, context, continuation in requests:
            if not continuation:
                raise ValueError("lm-eval gave an empty continuation to score")
            if len(continuation) > L:
                raise ValueError(f"a continuation of {len(continuation)} tokens is longer than the model's context "
                                 f"({L} tokens, model.config.seq_len): it cannot be scored")
            whole = (list(context) + list(continuation))[-(L + 1):]  # truncated from the left, as lm-eval's HF model
            rows.append((whole[:-1], list(continuation)))
        order = sorted(range(len(rows)), key=lambda i: (-len(rows[i][0]), i))
        batches = [order[start:start + self.batch_size] for start in range(0, len(order), self.batch_size)]
        out: list[Optional[tuple[float, bool]]] = [None] * len(rows)
        for chunk, scores in zip(batches, self._share(batches, lambda chunk: self._score(rows, chunk),
                                                      "log-likelihood")):
            for i, score in zip(chunk, scores):
                out[i] = score
        return out  # type: ignore[return-value]

    def _score(self, rows: list[tuple[list[int], list[int]]], chunk: list[int]) -> list[tuple[float, bool]]:
        """One forward: ``(log p, greedy)`` of the rows ``chunk`` (padded on the right to the longest)."""
        width = len(rows[chunk[0]][0])
        idx = torch.full((len(chunk), width), self.eot_token_id, dtype=torch.long)
        for r, i in enumerate(chunk):
            idx[r, :len(rows[i][0])] = torch.tensor(rows[i][0])
        logp = F.log_softmax(self._forward(idx.to(self.device)), dim=-1)
        scores = []
        for r, i in enumerate(chunk):
            inp, cont = rows[i]
            n, k = len(inp), len(cont)
            lp = logp[r, n - k:n]  # position j predicts token j + 1: the last k positions predict the continuation
            target = torch.tensor(cont, device=lp.device)
            scores.append((float(lp.gather(-1, target[:, None]).sum()), bool((lp.argmax(-1) == target).all())))
        return scores

    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        out = super().loglikelihood(requests, disable_tqdm=True)
        for req, res in zip(requests, out):
            self.cache_hook.add_partial("loglikelihood", req.args, res)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        windows, owner = [], []
        for i, req in enumerate(requests):
            (string,) = req.args
            for context, pred in map(make_disjoint_window, get_rolling_token_windows(
                    token_list=self.tok_encode(string), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)):
                windows.append((None, context, pred))
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, (logprob, _) in zip(owner, self._loglikelihood_tokens(windows)):
            totals[i] += logprob
        for req, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    # -- greedy generation ------------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        eos = self.tok_decode([self.eot_token_id])
        groups: dict[str, list[int]] = {}
        for i, req in enumerate(requests):
            groups.setdefault(json.dumps(req.args[1], sort_keys=True, default=str), []).append(i)
        units = []  # (request indices, their contexts, stop sequences, max tokens): one batch of decodes each
        for members in groups.values():  # every group checked before any forward: all ranks stop together
            kwargs = normalize_gen_kwargs(requests[members[0]].args[1], self.max_gen_toks)
            until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
            max_gen = int(kwargs.pop("max_gen_toks"))
            room = self.max_length - max_gen
            if room < 1:
                raise ValueError(f"max_gen_toks: {max_gen}: leaves no room for a context in the model's "
                                 f"{self.max_length} tokens (model.config.seq_len); lower the task's "
                                 "generation_kwargs.max_gen_toks")
            contexts = {i: self.tok_encode(requests[i].args[0])[-room:] or [self.eot_token_id] for i in members}
            order = sorted(members, key=lambda i: (-len(contexts[i]), i))
            start = 0
            while start < len(order):  # a batch: consecutive requests whose contexts have the same length
                end = start + 1
                while (end < len(order) and end - start < self.batch_size
                       and len(contexts[order[end]]) == len(contexts[order[start]])):
                    end += 1
                batch = order[start:end]
                units.append((batch, [contexts[i] for i in batch], until, max_gen))
                start = end
        out: list[str] = [""] * len(requests)
        for (batch, *_), texts in zip(units, self._share(units, lambda u: self._greedy(*u[1:]), "generate_until")):
            for i, text in zip(batch, texts):
                out[i] = text
                self.cache_hook.add_partial("generate_until", requests[i].args, text)
        return out

    def _greedy(self, contexts: list[list[int]], until: list[str], max_gen: int) -> list[str]:
        """Greedy continuations of equal-length ``contexts``, cut at the first stop sequence."""
        idx = torch.tensor(contexts, dtype=torch.long, device=self.device)
        cache = self.model.new_cache(idx.shape[1] + max_gen) if self.use_cache else None
        logits = self._forward(idx, cache)[:, -1]
        seq = idx
        new: list[list[int]] = [[] for _ in contexts]
        done = [False] * len(contexts)
        for step in range(max_gen):
            token = logits.argmax(-1)
            for r, t in enumerate(token.tolist()):
                if done[r]:
                    continue
                if t == self.eot_token_id:
                    done[r] = True
                    continue
                new[r].append(t)
                done[r] = any(s and s in self.tok_decode(new[r]) for s in until)
            if all(done) or step == max_gen - 1:
                break
            seq = torch.cat([seq, token[:, None]], dim=1)  # a finished row's tokens are run but not kept
            logits = (self._forward(token[:, None], cache) if cache is not None else self._forward(seq))[:, -1]
        texts = []
        for ids in new:
            text = self.tok_decode(ids)
            for s in until:
                if s:
                    text = text.split(s)[0]
            texts.append(text)
        return texts
