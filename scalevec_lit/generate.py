"""``python -m scalevec_lit generate --ckpt PATH --prompt TEXT``: continue a prompt with a trained model.

Reads any checkpoint ``export`` reads (a ``.ckpt`` of ``fit``, a distributed checkpoint folder, a native
folder) and the tokenizer recorded in it; decodes greedily (``--temperature 0``) or samples (temperature,
then top-k, then top-p), with a key/value cache (``Transformer.forward_cached``, ``model/cache.py``), and
prints each piece of text as soon as it is complete (a multi-byte character waits for its last token).

Library use: ``generate(model, prompt_ids, max_new_tokens, Sampling(...), generator=...)``; a model that cannot
decode with the cache (a block with its own attention, an attention layer that does not read it:
``model/transformer.py`` ``cache_problem``) runs without it, as the command does (``use_cache=True`` refuses it instead).

Plain torch (+ tokenizers): must not import Lightning.
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .checkpoint import model_from_state, read_contents
from .errors import CommandLineParser, UserError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class Sampling:
    """How the next token is chosen: ``temperature`` 0 is greedy (argmax); otherwise the logits are divided
    by it, cut to the ``top_k`` most likely tokens (None: all), then to the smallest set whose probability
    reaches ``top_p`` (1: all), and one token is drawn from what is left."""

    temperature: float = 0.8
    top_k: Optional[int] = None
    top_p: float = 1.0

    def check(self) -> None:
        """Refuse settings that choose no token (a ``UserError`` naming the option, the value and the fix):
        ``temperature`` finite and ≥ 0, ``top_k`` ≥ 1 or None, ``top_p`` in (0, 1]."""
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise UserError("--temperature", self.temperature, "must be a finite number ≥ 0 (0 is greedy decoding)",
                            "use e.g. --temperature 0.8, or --temperature 0 for greedy")
        if self.top_k is not None and self.top_k < 1:
            raise UserError("--top-k", self.top_k, "must be at least 1 (the number of most likely tokens to sample "
                            "from)", "use e.g. --top-k 50, or leave --top-k out to sample from the whole vocabulary")
        if not 0 < self.top_p <= 1:
            raise UserError("--top-p", self.top_p, "must be in (0, 1] (the probability mass to sample from)",
                            "use e.g. --top-p 0.9, or --top-p 1 to turn it off")

    @property
    def greedy(self) -> bool:
        """True for ``temperature`` 0: the most likely token every time, no randomness."""
        return self.temperature == 0


def next_token(logits: torch.Tensor, sampling: Sampling, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """One token per row of ``logits`` ``[B, vocab]`` (``[B]``, int64)."""
    if sampling.greedy:
        return logits.argmax(-1)
    logits = logits.float() / sampling.temperature
    if sampling.top_k is not None and sampling.top_k < logits.shape[-1]:
        kth = torch.topk(logits, sampling.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if sampling.top_p < 1:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        before = sorted_p.cumsum(-1) - sorted_p  # mass of the more likely tokens
        sorted_p = sorted_p.masked_fill(before >= sampling.top_p, 0.0)  # the most likely one always stays
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


def supports_cache(model) -> bool:
    """True when ``model.forward_cached`` gives ``forward``'s logits: every block's attention is a
    ``CausalSelfAttention`` (the module that reads the cache), the model class does not override ``forward``
    alone, and every attention layer reads its cache (checked on one token; ``model/transformer.py`` ``cache_problem``)."""
    from .model.transformer import cache_problem

    return cache_problem(model) is None


@torch.no_grad()
def generate(
    model,
    prompt: torch.Tensor,
    max_new_tokens: int,
    sampling: Sampling = Sampling(temperature=0.0),
    generator: Optional[torch.Generator] = None,
    eos_id: Optional[int] = None,
    use_cache: Optional[bool] = None,
    on_token: Optional[Callable[[torch.Tensor], None]] = None,
) -> torch.Tensor:
    """New tokens ``[B, n]`` after ``prompt`` ``[B, T]`` (n ≤ ``max_new_tokens``; fewer when every row has
    produced ``eos_id``, after which a row repeats ``eos_id``). ``on_token`` sees each step's ``[B]`` tokens.
    ``use_cache=False`` runs the whole sequence at every step (the reference the cache must agree with);
    ``None`` (default) uses the key/value cache when the model supports it (``supports_cache``) and runs without
    it otherwise; ``True`` requires it (``ValueError`` naming the block or model class that cannot use it)."""
    if use_cache is None:
        use_cache = supports_cache(model)
    elif use_cache:
        from .model.transformer import check_cache_support

        check_cache_support(model)
    T = prompt.shape[1]
    if T + max_new_tokens - 1 > model.config.seq_len:  # the last token is never run through the model
        raise ValueError(f"{T} prompt tokens + {max_new_tokens} new ones exceed the model's context "
                         f"(model.config.seq_len={model.config.seq_len})")
    cache = model.new_cache(min(model.config.seq_len, T + max_new_tokens)) if use_cache else None
    logits = (model.forward_cached(prompt, cache) if use_cache else model(prompt))[:, -1]
    out: list[torch.Tensor] = []
    done = torch.zeros(prompt.shape[0], dtype=torch.bool, device=prompt.device)
    for step in range(max_new_tokens):
        token = next_token(logits, sampling, generator)
        if eos_id is not None:
            token = token.masked_fill(done, eos_id)
            done |= token == eos_id
        out.append(token)
        if on_token is not None:
            on_token(token)
        if step == max_new_tokens - 1 or (eos_id is not None and bool(done.all())):
            break
        if use_cache:
            logits = model.forward_cached(token[:, None], cache)[:, -1]
        else:
            logits = model(torch.cat([prompt, torch.stack(out, 1)], dim=1))[:, -1]
    return torch.stack(out, 1) if out else prompt.new_zeros(prompt.shape[0], 0)


class TextStream:
    """Prints the decoded text of a growing list of token ids as soon as it is complete (byte-level BPE can
    split one character over several tokens: text ending in U+FFFD waits for the next token)."""

    def __init__(self, tokenizer, out=None) -> None:
        self.tokenizer, self.out = tokenizer, out or sys.stdout
        self.ids: list[int] = []
        self.printed = ""

    def push(self, token: int) -> None:
        self.ids.append(int(token))
        text = self.tokenizer.decode(self.ids)
        if not text.endswith("\ufffd") and text.startswith(self.printed):
            self._write(text[len(self.printed):])
            self.printed = text

    def close(self) -> str:
        text = self.tokenizer.decode(self.ids)
        self._write(text[len(self.printed):] if text.startswith(self.printed) else "")
        self.printed = text
        return text

    def _write(self, piece: str) -> None:
        if piece:
            self.out.write(piece)
            self.out.flush()


def load_for_generation(ckpt: str, tokenizer: Optional[str] = None):
    """``(model in eval mode, Tokenizer, where the tokenizer came from)`` from any checkpoint export reads."""
    from .data.tokenizer import Tokenizer
    from .export.tokenizer import find_tokenizer

    read = read_contents(ckpt)
    model = model_from_state(read.spec, read.state)
    path, note = find_tokenizer(ckpt, tokenizer, recorded=read.tokenizer)
    tok = Tokenizer(path, key="--tokenizer")
    if tok.vocab_size > model.config.vocab_size:
        raise UserError("--tokenizer", str(path), f"has {tok.vocab_size} tokens, more than the model's vocabulary "
                        f"({model.config.vocab_size})", "pass the tokenizer.json the model was trained with")
    return model, tok, note


def _cast_parameters_(model, dtype: torch.dtype) -> None:
    """Parameters to ``dtype`` in place (a tied head stays tied); buffers (RoPE tables, MoE bias) stay fp32."""
    for p in model.parameters():
        if p.is_floating_point():
            p.data = p.data.to(dtype)


def _parser() -> argparse.ArgumentParser:
    p = CommandLineParser(
        prog="python -m scalevec_lit generate",
        description="Continue a prompt with a trained model (greedy with --temperature 0, else sampled), "
                    "printing the text as it is produced.",
    )
    p.add_argument("--ckpt", required=True, help="a .ckpt of fit, a distributed checkpoint folder or a native folder")
    p.add_argument("--prompt", required=True, help="the text to continue")
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help="tokens to generate (default: 100, or what the model's context leaves after the prompt)")
    p.add_argument("--temperature", type=float, default=0.8, help="0: greedy (argmax); default 0.8")
    p.add_argument("--top-k", type=int, default=None, help="sample from the k most likely tokens (default: all)")
    p.add_argument("--top-p", type=float, default=1.0, help="sample from the smallest set with this probability (0, 1]")
    p.add_argument("--seed", type=int, default=0, help="sample i of --num-samples uses seed + i (default 0)")
    p.add_argument("--num-samples", type=int, default=1, help="continuations to generate, one after another")
    p.add_argument("--ignore-eos", action="store_true", help="do not stop at the end-of-text token")
    p.add_argument("--no-cache", action="store_true", help="run the whole sequence at every step (slow; for checks)")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the one recorded in the checkpoint)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (default: cuda when there is one)")
    p.add_argument("--dtype", choices=tuple(DTYPES), default="float32", help="weights and compute (default float32)")
    return p


DEFAULT_NEW_TOKENS = 100


def main(argv: Optional[list[str]] = None) -> None:
    args = _parser().parse_args(argv)
    sampling = Sampling(args.temperature, args.top_k, args.top_p)
    sampling.check()
    if not args.prompt.strip():
        raise UserError("--prompt", repr(args.prompt), "is empty: the model needs at least one token to continue",
                        "give some text, e.g. --prompt 'ROMEO:'")
    for key, value in (("--max-new-tokens", args.max_new_tokens), ("--num-samples", args.num_samples)):
        if value is not None and value < 1:
            raise UserError(key, value, "must be at least 1", f"use e.g. {key} {DEFAULT_NEW_TOKENS if 'tokens' in key else 3}")
    device = torch.device("cuda" if args.device == "auto" and torch.cuda.is_available() else
                          "cpu" if args.device == "auto" else args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("--device", args.device, "this machine has no CUDA GPU", "use --device cpu")

    model, tok, note = load_for_generation(args.ckpt, args.tokenizer)
    ids = tok.encode(args.prompt, eos=False)
    context = model.config.seq_len
    if len(ids) >= context:
        raise UserError("--prompt", f"{len(ids)} tokens", f"leaves no room in the model's context of {context} tokens "
                        "(model.config.seq_len it was trained with)", f"shorten the prompt to fewer than {context} tokens")
    room = context - len(ids)
    new_tokens = args.max_new_tokens if args.max_new_tokens is not None else min(DEFAULT_NEW_TOKENS, room)
    if new_tokens > room:
        raise UserError("--max-new-tokens", new_tokens, f"with the prompt's {len(ids)} tokens exceeds the model's "
                        f"context of {context} tokens (model.config.seq_len it was trained with)",
                        f"use --max-new-tokens {room} or less, or a shorter prompt")
    print(f"tokenizer: {note}", file=sys.stderr)  # after the checks: an error stays one paragraph
    model.to(device)
    if args.dtype != "float32":
        _cast_parameters_(model, DTYPES[args.dtype])
    from .model.transformer import cache_problem

    why = None if args.no_cache else cache_problem(model)
    use_cache = not args.no_cache and why is None
    if why is not None:
        print(f"note: {why}: generating without the key/value cache", file=sys.stderr)
    prompt = torch.tensor([ids], device=device)
    eos = None if args.ignore_eos else tok.eos_id
    total, elapsed = 0, 0.0
    for i in range(args.num_samples):
        if args.num_samples > 1:
            print(f"{'' if i == 0 else chr(10)}--- sample {i + 1} of {args.num_samples} (seed {args.seed + i}) ---")
        gen = torch.Generator(device=device).manual_seed(args.seed + i)
        sys.stdout.write(args.prompt)
        stream = TextStream(tok)
        start = time.perf_counter()
        out = generate(model, prompt, new_tokens, sampling, generator=gen, eos_id=eos, use_cache=use_cache,
                       on_token=lambda t: stream.push(int(t[0])))
        elapsed += time.perf_counter() - start
        total += out.shape[1]
        stream.close()
        sys.stdout.write("\n")
        sys.stdout.flush()
    how = "greedy" if sampling.greedy else (f"temperature {sampling.temperature}, top-k {sampling.top_k or 'all'}, "
                                            f"top-p {sampling.top_p}, seed {args.seed}")
    print(f"generated {total} tokens in {elapsed:.2f} s ({total / max(elapsed, 1e-9):.1f} tokens/s; {how}; "
          f"key/value cache {'on' if use_cache else 'off'}; {device.type}, {args.dtype})", file=sys.stderr)


if __name__ == "__main__":
    from .errors import run_guarded

    run_guarded(main, sys.argv[1:])
