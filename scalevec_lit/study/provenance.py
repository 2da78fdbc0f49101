"""The report's opening: the regime line and how the study was run (command, commit, data, tokens, the steps
of every endpoint, the grid), and the pre-registration.

Plain Python, like the rest of ``study/``.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from .data_record import data_dir_of, fingerprints
from .regime import regime_detail, study_regime
from .runner import now
from .spec import Study, fmt_lr


def _data_line(study: Study, meta: dict) -> str:
    data_dir = data_dir_of(study, meta)
    if not data_dir:
        return "Data: n/a."
    meta_path = Path(data_dir) / "meta.json"
    if meta_path.exists():
        meta = json.loads(meta_path.read_text())
        tok = meta.get("tokens", {})
        prints = fingerprints(str(data_dir))
        content = (f", data fingerprint train {prints['train'][:16]}, val {prints['val'][:16]} (`integrity.fingerprint`, "
                   f"as where the report was written)" if prints else "")
        return (f"Data: `{data_dir}` ({tok.get('train', 0):,} training / {tok.get('val', 0):,} validation tokens, "
                f"vocabulary {meta.get('vocab_size')}, tokenizer sha256 {meta.get('tokenizer_sha256')}{content}).")
    return f"Data: `{data_dir}` (its meta.json was not found where the report was written)."


def provenance_section(out: Path, study: Study, runs: dict, meta: dict, order: list[str]) -> list[str]:
    """The title, the regime line, ``## How it was run`` and ``## Pre-registration``."""
    base, title = study.baseline, study.name
    commits = sorted({(d.get("code") or {}).get("commit", "unknown") for d in runs.values()})
    dirty = any((d.get("code") or {}).get("dirty") for d in runs.values())
    walls = [d.get("wall_s_last_attempt", 0.0) for d in runs.values()]
    finished = sorted(d.get("finished", "") for d in runs.values())
    tokens = sorted({d.get("train_tokens") for d in runs.values() if d.get("train_tokens")})
    at_final = all(d.get("final_step") == d.get("last_train_step") for d in runs.values()
                   if d.get("last_train_step") is not None and not d.get("diverged"))
    n_div = sum(1 for d in runs.values() if d.get("diverged"))
    expected = len(study.runs()) if study.variants else len(runs)
    regime = study_regime(runs, base, data_dir_of(study, meta))
    L = [f"# Study `{title}`: report", "",
         f"Generated {now()} by `python -m scalevec_lit study report {out}` (the tables and figures are "
         "computed from the runs; the discussion at the end is hand-written).", "",
         regime["line"] + ".", ""]
    if study.description:
        L += [study.description.strip(), ""]
    L += ["## How it was run", ""]
    run_cmd = meta.get("command") or (f"python -m scalevec_lit study run {study.path}" if study.path else "n/a")
    at_once = re.search(r"--parallel (\d+)", run_cmd)
    at_once = int(at_once.group(1)) if at_once else 1
    L += [f"- Command: `OMP_NUM_THREADS=1 {run_cmd}` (every run single-threaded, "
          f"{'one run at a time' if at_once == 1 else f'{at_once} runs at a time'}), "
          f"at commit **`{', '.join(commits)}`**"
          f"{' (with uncommitted changes!)' if dirty else ' (clean)'}; runs started {meta.get('started', 'n/a')}, "
          f"finished between {finished[0]} and {finished[-1]}; sum of run wall times {sum(walls) / 60:.1f} min.",
          f"- Base recipe(s): {', '.join(f'`{b}`' for b in study.base) or 'n/a'}; shared args: `{' '.join(study.args)}`.",
          f"- {_data_line(study, meta)}",
          f"- {regime_detail(regime, base)}",
          f"- Training tokens per run (last logged `train/tokens`): {', '.join(f'{t:,}' for t in tokens) or 'n/a'}.",
          f"- Endpoint: mean of the last {study.endpoint_evals} scheduled validation losses, logged at 0-based "
          f"steps {_endpoint_steps(runs)}; last evaluation at the final step in every "
          f"non-diverged run: **{'yes' if at_final else 'NO'}**.",
          f"- Grid: {len(order)} variants × LRs × seeds {study.seeds}: {len(runs)} of {expected} runs complete"
          f"{f', {n_div} diverged (non-finite loss; counted as the worse side in sign tests)' if n_div else ''}."]
    reused = sorted(f"`{r.label()}` from `{d['reused_from']}`" for r, d in runs.items() if d.get("reused_from"))
    if reused:
        L += [f"- Re-used runs (copied in before the study ran them; their finish times are the original ones): "
              f"{'; '.join(reused)}."]
    if meta.get("lr_from"):
        lf = meta["lr_from"]
        L += [f"- Learning rate from study `{lf['study']}`: {fmt_lr(lf['resolved_lr'])}, the best of "
              f"`{lf.get('variant', 'baseline')}` there (mean endpoints per LR: "
              + ", ".join(f"{k}: {sum(v) / len(v):.4f}" for k, v in lf.get("endpoints", {}).items()) + ")."]
    L += [""]
    if study.preregistration:
        L += ["## Pre-registration (from the study file, committed before the runs)", ""]
        L += ["> " + line if line.strip() else ">" for line in study.preregistration.strip().splitlines()]
        L += [""]
    return L


def _endpoint_steps(runs: dict) -> str:
    """The steps of every run's endpoint (the most common set, then the runs with another), and the validations
    left out of an endpoint because they were made at a stop by signal, off the schedule."""
    groups: dict[tuple, list[str]] = {}
    for r, d in sorted(runs.items(), key=lambda item: item[0].label()):
        if d.get("endpoint_steps"):
            groups.setdefault(tuple(d["endpoint_steps"]), []).append(r.label())
    if not groups:
        return "n/a"
    order = sorted(groups, key=lambda k: -len(groups[k]))
    text = f"{list(order[0])} in {'every run' if len(order) == 1 else f'{len(groups[order[0]])} runs'}"
    for k in order[1:]:
        text += f", {list(k)} in {', '.join(f'`{x}`' for x in groups[k])}"
    off = [f"`{r.label()}` at {d['unscheduled_val_steps']}" for r, d in sorted(runs.items(), key=lambda i: i[0].label())
           if d.get("unscheduled_val_steps")]
    if off:
        text += (f" (validations made where a run stopped on a signal are off the schedule and left out: "
                 f"{'; '.join(off)})")
    again = [f"`{r.label()}`" for r, d in sorted(runs.items(), key=lambda i: i[0].label()) if d.get("endpoint_recomputed")]
    if again:
        text += (f"; the endpoints of {', '.join(again)} were recorded with such a validation and are taken again "
                 "from their scheduled validations here")
    return text
