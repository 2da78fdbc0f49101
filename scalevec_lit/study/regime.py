"""The training regime of a study, on one line: ``Regime: N tokens per parameter (M per non-embedding parameter),
E epochs over the training text``.

- N = tokens trained per run / the model's parameters (all of them, embeddings included; for an MoE model the
  total, and then also per active parameter: the line adds ``A per active parameter (B per active
  non-embedding parameter)``, from the ``N active per token`` that ``fit`` prints for an MoE model);
- M = tokens trained per run / the parameters outside the token embedding and the output head (the total less
  the ``embedding`` and ``head`` rows of the optimizer's parameter groups that ``fit`` prints; a tied head is
  the embedding's tensor, counted once): the count scaling laws use (Kaplan et al. 2020), and at small sizes far
  from N (the 0.3M documentation model: 20.6 and 60.3);
- E = tokens trained per run / the training tokens of the prepared data (``tokens.train`` of its
  ``meta.json``).

The numbers come from what a run records: the parameter count that ``fit`` prints at its start
(``parameters: 1,838,208 total, ...``, read from the run's ``log.txt`` into ``done.json`` as ``params``), the
tokens trained (steps × global batch × sequence length: the last logged ``train/tokens`` per step times the
steps trained, ``done.json``'s ``trained_tokens``) and the data folder's ``meta.json``. ``regime_line`` formats
the numbers, ``study_regime`` takes them from a study's complete runs (the reference variant's).

Plain Python, like the rest of ``study/``.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Optional

PARAMS_RE = re.compile(r"parameters: ([\d,]+) total")
ACTIVE_RE = re.compile(r"parameters: [\d,]+ total, ([\d,]+) active per token")
GROUPS_HEADER = "optimizer parameter groups:"
GROUP_ROW_RE = re.compile(r"^(embedding|head)\s+\S+\s+\d+\s+([\d,]+)\s")


def _num(x: float) -> str:
    """2 significant digits below 10 (0.22, 0.84, 1.6), one decimal below 100 (20.6), whole numbers above (1,250)."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2g}"


def regime_line(tokens: Optional[float], params: Optional[int], train_tokens: Optional[int],
                non_embedding: Optional[int] = None, active: Optional[int] = None) -> str:
    """``Regime: N tokens per parameter (M per non-embedding parameter), E epochs over the training text`` (``n/a``
    for an unknown number); for an MoE model (``active`` below ``params``) also ``A per active parameter (B per
    active non-embedding parameter)``, the embedding and head being active for every token."""
    n = _num(tokens / params) if tokens and params else "n/a"
    m = _num(tokens / non_embedding) if tokens and non_embedding else "n/a"
    e = _num(tokens / train_tokens) if tokens and train_tokens else "n/a"
    moe = ""
    if tokens and params and active and active < params:
        active_ne = active - (params - non_embedding) if non_embedding else None
        b = _num(tokens / active_ne) if active_ne and active_ne > 0 else "n/a"
        moe = f"; {_num(tokens / active)} per active parameter ({b} per active non-embedding parameter)"
    return (f"Regime: {n} tokens per parameter ({m} per non-embedding parameter){moe}, {e} epochs over the "
            "training text")


def _last_count(root: Path, pattern: re.Pattern) -> Optional[int]:
    """The number ``pattern`` finds last in the run's ``log.txt`` (its last attempt's; ``None`` when none)."""
    try:
        text = (Path(root) / "log.txt").read_text(errors="replace")
    except OSError:
        return None
    found = pattern.findall(text)
    return int(found[-1].replace(",", "")) if found else None


def params_from_log(root: Path) -> Optional[int]:
    """The parameter count the run's last attempt printed at its start (``None`` when its log has none)."""
    return _last_count(root, PARAMS_RE)


def active_params_from_log(root: Path) -> Optional[int]:
    """The parameters active per token that the run's last attempt printed (an MoE model; ``None`` otherwise)."""
    return _last_count(root, ACTIVE_RE)


def embedding_params_from_log(root: Path) -> Optional[int]:
    """The parameters of the token embedding and the output head (an untied head's own tensor) that the run's last
    attempt printed in its table of optimizer parameter groups (``None`` when its log has no embedding row)."""
    try:
        text = (Path(root) / "log.txt").read_text(errors="replace")
    except OSError:
        return None
    if GROUPS_HEADER not in text:
        return None
    rows: dict[str, int] = {}
    for line in text.rsplit(GROUPS_HEADER, 1)[1].splitlines()[1:]:
        if not line.strip():
            break
        found = GROUP_ROW_RE.match(line)
        if found:
            rows[found.group(1)] = int(found.group(2).replace(",", ""))
    return sum(rows.values()) if "embedding" in rows else None


def trained_tokens(logged_tokens: list[tuple[int, float]], last_step: Optional[int]) -> Optional[int]:
    """Tokens trained by a run: the tokens per step of the last logged ``train/tokens`` (at 0-based step s,
    after s + 1 steps) times the steps trained (``last_step`` + 1, 0-based)."""
    if not logged_tokens:
        return None
    step, tokens = logged_tokens[-1]
    if last_step is None or last_step == step:
        return int(round(tokens))
    return int(round(tokens / (step + 1) * (last_step + 1)))


def data_train_tokens(data_dir: Optional[str]) -> Optional[int]:
    """``tokens.train`` of a prepared data folder's ``meta.json`` (``None`` when it is not there)."""
    if not data_dir:
        return None
    try:
        meta = json.loads((Path(data_dir) / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    train = (meta.get("tokens") or {}).get("train")
    return int(train) if train else None


def study_regime(runs: dict, reference: str, data_dir: Optional[str]) -> dict:
    """The regime of a study's complete runs ``{Run: done}``: the reference variant's parameters, embedding and
    head parameters, and tokens per run (any variant's when the reference has none), the other variants' parameter
    range, the data's training tokens, and ``line``."""
    def of(key: str, variant: Optional[str]) -> list:
        vals = []
        for r, d in runs.items():
            if variant is not None and r.variant != variant:
                continue
            v = d.get(key)
            if v is None and key == "params" and d.get("root"):
                v = params_from_log(d["root"])
            if v is None and key == "embedding_params" and d.get("root"):
                v = embedding_params_from_log(d["root"])
            if v is None and key == "active_params" and d.get("root"):
                v = active_params_from_log(d["root"])
            if v is None and key == "trained_tokens":
                v = d.get("train_tokens")  # runs made before trained_tokens was recorded: the last logged count
            if v:
                vals.append(int(v))
        return vals

    params = of("params", reference) or of("params", None)
    embedding = of("embedding_params", reference) or of("embedding_params", None)
    tokens = of("trained_tokens", reference) or of("trained_tokens", None)
    all_params = of("params", None)
    p = max(set(params), key=params.count) if params else None
    t = max(set(tokens), key=tokens.count) if tokens else None
    emb = max(set(embedding), key=embedding.count) if embedding else None
    non_embedding = p - emb if p and emb and p > emb else None
    actives = of("active_params", reference) or of("active_params", None)
    active = max(set(actives), key=actives.count) if actives else None
    train = data_train_tokens(data_dir)
    return {"params": p, "params_range": (min(all_params), max(all_params)) if all_params else None,
            "embedding_params": emb, "non_embedding_params": non_embedding,
            "tokens": t, "tokens_range": sorted(set(of("trained_tokens", None))), "train_tokens": train,
            "data_dir": data_dir, "active_params": active, "line": regime_line(t, p, train, non_embedding, active)}


def regime_detail(r: dict, reference: str) -> str:
    """One bullet: where the regime's numbers come from."""
    params = f"{r['params']:,} parameters of `{reference}`" if r["params"] else "parameters not recorded by these runs"
    if r.get("non_embedding_params"):
        params += (f", {r['non_embedding_params']:,} of them outside the embedding and head ({r['embedding_params']:,}"
                   " in the embedding and untied head, from fit's table of optimizer parameter groups)")
    if r.get("active_params") and r["params"] and r["active_params"] < r["params"]:
        params += f"; {r['active_params']:,} active per token (fit's count: the router's top-k of the experts)"
    if r["params_range"] and r["params_range"][0] != r["params_range"][1]:
        params += f" (variants: {r['params_range'][0]:,}–{r['params_range'][1]:,})"
    tokens = (f"{r['tokens']:,} tokens trained per run (steps × global batch × sequence length)" if r["tokens"]
              else "tokens per run not recorded")
    if len(r["tokens_range"]) > 1:
        tokens += f" (runs differ: {', '.join(f'{t:,}' for t in r['tokens_range'])})"
    data = (f"{r['train_tokens']:,} training tokens in `{r['data_dir']}` (its meta.json)" if r["train_tokens"]
            else "the data's training tokens unknown (meta.json not found)")
    return f"{r['line']}: {tokens}; {params}; {data}."
