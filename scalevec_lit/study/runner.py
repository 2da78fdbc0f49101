"""Run a study's grid resumably, one ``python -m scalevec_lit fit`` subprocess per run.

A run is complete when ``done.json`` exists (its endpoint, final validation loss, steps, LR, seed, the
code's commit); ``run_study`` skips complete runs and resumes incomplete ones from their newest checkpoint
(``--ckpt_path last``), or starts them again when they have none. ``--parallel N`` runs N at once.

A stop signal (Ctrl-C, SIGTERM, SIGUSR1, SIGHUP) makes each run in progress save its current step once and
stop, and ``run`` exit with 128 + the signal; a second one kills the runs at once (``stopping.py``).

Provenance: the runner records the git commit of the code that runs (the folder holding the imported
``scalevec_lit``) and whether that folder has uncommitted changes under ``scalevec_lit/``, ``callbacks/``
or ``recipes/``, in ``study_meta.json`` and in every ``done.json``. A study whose runs were made at one
commit refuses to continue at another (``--allow-code-change`` overrides): run a long study from its own
``git worktree`` at a fixed commit so that edits made meanwhile cannot mix into its runs.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import yaml

from ..errors import UserError
from ..stopsignal import StopSignal
from .data_record import check_same_data, data_dir_of, fingerprints
from .events import (collect_done, endpoint, read_scalars, recorded_endpoints, run_endpoint, scheduled,
                     validation_schedule)
from .spec import CKPT_DIR, DONE, ENDPOINTS, VAL_TAG, Run, Study, fit_command, fmt_lr, run_callbacks, run_dir
from .regime import params_from_log, trained_tokens
from .secondary import endpoints_of, power_line
from .stats import best_lr
from .stopping import Runs, killed_line, run_setup, stopped_line


def now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def code_provenance() -> dict:
    """The commit of the code that the runs import (``scalevec_lit`` as this process resolves it, which its
    subprocesses inherit) and whether it has uncommitted changes; paths are not recorded."""
    import scalevec_lit

    pkg = Path(scalevec_lit.__file__).resolve().parent
    repo = pkg.parent

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                                  timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    commit = git("rev-parse", "HEAD")
    dirty = git("status", "--porcelain", "--", "scalevec_lit", "callbacks", "recipes")
    return {"commit": commit or "unknown", "dirty": bool(dirty), "dirty_files": dirty.splitlines()[:20]}


def resolve_lr_from(study: Study, out: Path) -> None:
    """``lr_from: {study: A, variant: v}``: set ``study.lrs`` to ``[best LR of v in study A]``, read from
    ``<out>/../../A/runs`` (the sibling results folder), or, where that holds no complete run of ``v`` (the
    runs stayed on another machine or a wiped scratch disk), from ``A/endpoints.json``, which A's report wrote."""
    if not study.lr_from:
        return
    src = out.parent.parent / study.lr_from["study"] / "runs"
    variant = study.lr_from.get("variant", study.baseline)
    per_lr: dict[float, list[float]] = {}
    for run, d in collect_done(src).items():
        if run.variant == variant and run.lr is not None:
            per_lr.setdefault(run.lr, []).append(run_endpoint(d))
    source = src
    if not per_lr:
        source = src.parent / ENDPOINTS
        per_lr = recorded_endpoints(source, variant)
    lr = best_lr(per_lr)
    if lr is None:
        raise UserError(f"{study.path or study.name}: lr_from", study.lr_from["study"],
                        f"no complete runs of {variant!r} with an LR in that study (looked in {src} and in "
                        f"{src.parent / ENDPOINTS}, which `study report` writes)",
                        "run that study and its report first, or give this study its own lrs")
    study.lrs = [lr]
    study.lr_from = {**study.lr_from, "resolved_lr": lr, "source": str(source),
                     "endpoints": {fmt_lr(k): v for k, v in sorted(per_lr.items())}}


def _start(study: Study, run: Run, out: Path, env: dict) -> tuple[subprocess.Popen, Path, float]:
    root = out / run.rel()
    root.mkdir(parents=True, exist_ok=True)
    resuming = any((root / CKPT_DIR).glob("*.ckpt"))
    if not resuming:  # a fresh start: drop the events of an earlier, unfinished attempt
        shutil.rmtree(root / "tb", ignore_errors=True)
    variant = study.variant(run.variant)
    (root / "callbacks.yaml").write_text(yaml.safe_dump({"trainer": {"callbacks": run_callbacks(study, variant)}},
                                                        sort_keys=False))
    cmd = fit_command(study, variant, run.seed, root, run.lr)
    (root / "cmd.txt").write_text(" ".join(cmd) + "\n")
    print(f"[study] {now()} {'resume' if resuming else 'start '} {run.label()}", flush=True)
    with open(root / "log.txt", "a") as log:  # nothing that can fail comes after Popen: the runner registers it
        log.write(f"\n=== {now()} {'resume' if resuming else 'start'}: {' '.join(cmd)}\n")
        log.flush()
        # its own session: a Ctrl-C at the terminal or a signal to the runner's group reaches the runner only,
        # which passes it on once (``stopping.py``); no terminal input either; it dies with a killed runner and
        # keeps the runner's niceness (``stopping.run_setup``)
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, preexec_fn=run_setup())
    return proc, root, time.time()


def _diverged(root: Path) -> Optional[str]:
    """The non-finite-loss message of a run stopped by ``model.nonfinite`` (stop/raise), if that is why."""
    try:
        text = (root / "log.txt").read_text(errors="replace")
    except OSError:
        return None
    for line in reversed(text.splitlines()):
        found = re.search(r"non-finite loss \S+ at step \d+", line)
        if found and "model.nonfinite" in line:
            return found.group(0)  # without the checkpoint's path
    return None


def _write_done(root: Path, done: dict) -> None:
    (root / (DONE + ".tmp")).write_text(json.dumps(done, indent=1))
    os.replace(root / (DONE + ".tmp"), root / DONE)


def _finish(study: Study, run: Run, root: Path, rc: int, t0: float, provenance: dict) -> bool:
    if rc != 0 and (why := _diverged(root)):
        # a diverged run is a result (the LR is too high for this variant), not a failure to retry
        logged = read_scalars(root, (VAL_TAG,))
        done = {"variant": run.variant, "seed": run.seed, "lr": run.lr, "diverged": why,
                "final_val_loss": float("nan"), "final_step": None, "endpoint": float("nan"), "endpoint_steps": [],
                "val": logged.get(VAL_TAG, []), "wall_s_last_attempt": round(time.time() - t0, 1),
                "finished": now(), "code": provenance, "command": (root / "cmd.txt").read_text().strip()}
        if not study.keep_checkpoints:
            shutil.rmtree(root / CKPT_DIR, ignore_errors=True)
        _write_done(root, done)
        print(f"[study] {now()} DIVERGED {run.label()}: {why}", flush=True)
        return True
    if rc != 0:
        print(f"[study] FAILED {run.label()} (exit {rc}); see {run.rel() / 'log.txt'}", flush=True)
        return False
    logged = read_scalars(root, (VAL_TAG, "train/loss", "train/tokens"))
    val = logged.get(VAL_TAG, [])
    if not val:
        print(f"[study] FAILED {run.label()}: no {VAL_TAG} logged; see {run.rel() / 'log.txt'}", flush=True)
        return False
    step, loss = val[-1]
    on_schedule, unscheduled = scheduled(val, validation_schedule(root))
    end = endpoint(on_schedule, study.endpoint_evals) or endpoint(val, study.endpoint_evals)
    train_steps = [s for s, _ in logged.get("train/loss", [])]
    tokens = [v for _, v in logged.get("train/tokens", [])]
    last_train_step = max(train_steps) if train_steps else None
    done = {"variant": run.variant, "seed": run.seed, "lr": run.lr, "final_val_loss": loss, "final_step": step,
            "endpoint": end["value"], "endpoint_steps": end["steps"], "val": val, "unscheduled_val_steps": unscheduled,
            "last_train_step": last_train_step,
            "train_tokens": int(tokens[-1]) if tokens else None,
            "trained_tokens": trained_tokens(logged.get("train/tokens", []), last_train_step),
            "params": params_from_log(root),
            "wall_s_last_attempt": round(time.time() - t0, 1), "finished": now(), "code": provenance,
            "command": (root / "cmd.txt").read_text().strip()}
    secondary = endpoints_of(root, study)
    if secondary:
        done["secondary"] = secondary
    if not study.keep_checkpoints:
        shutil.rmtree(root / CKPT_DIR, ignore_errors=True)
    _write_done(root, done)
    left_out = f", validation at step(s) {unscheduled} left out (made at a stop by signal)" if unscheduled else ""
    print(f"[study] {now()} done   {run.label()}: endpoint {end['value']:.4f} (steps {end['steps']}{left_out}), "
          f"final val/loss {loss:.4f}, {done['wall_s_last_attempt']:.0f} s", flush=True)
    return True


def _say(line: Optional[str]) -> None:
    if line:
        try:
            print(f"[study] {now()} {line}", flush=True)
        except OSError:  # its terminal is gone (SIGHUP)
            pass


def _meta(study: Study, out: Path, parallel: int, provenance: dict, allow_code_change: bool,
          allow_data_change: bool = False) -> None:
    path = out / "study_meta.json"
    meta = json.loads(path.read_text()) if path.exists() else {}
    if meta.get("code") and meta["code"].get("commit") != provenance["commit"] and not allow_code_change:
        raise UserError(f"study: {out}", provenance["commit"],
                        f"runs in this folder were made at commit {meta['code']['commit']}, the code now is at "
                        "another", "continue from a worktree at that commit, or pass --allow-code-change")
    data_dir = data_dir_of(study, {})  # this start's: the study's args (with --data) or its base recipe
    data = {"dir": data_dir, "fingerprints": fingerprints(data_dir)}
    check_same_data(meta, data_dir, data["fingerprints"], out, allow_data_change)
    out_arg = f" --out {out}" if not out.is_absolute() else ""
    meta.setdefault("started", now())
    meta.setdefault("code", provenance)
    meta.update({"study": str(study.path) if study.path else study.name,
                 "command": f"python -m scalevec_lit study run {study.path}{out_arg} --parallel {parallel}",
                 "threads": os.environ.get("OMP_NUM_THREADS", ""),
                 "sessions": meta.get("sessions", []) + [{"started": now(), "code": provenance, "data": data}]})
    if not (meta.get("data") or {}).get("fingerprints"):
        meta["data"] = data
    if study.lr_from:
        meta["lr_from"] = study.lr_from
    dirs = [a.split("=", 1)[1] for a in study.args if a.startswith("--data.data_dir=")]
    if dirs:
        meta["data_dir"] = dirs[-1]
    path.write_text(json.dumps(meta, indent=1))


def run_study(study: Study, out: Path, parallel: int = 1, dry_run: bool = False,
              allow_code_change: bool = False, limit: Optional[int] = None, allow_data_change: bool = False) -> int:
    """Run every incomplete run of the study's grid; returns the number of failed runs."""
    resolve_lr_from(study, out)
    grid = study.runs()
    todo = [r for r in grid if not (out / r.rel() / DONE).exists()]
    if limit is not None:
        todo = todo[:limit]
    lr_note = f"; LR {fmt_lr(study.lrs[0])} from study {study.lr_from['study']}" if study.lr_from else ""
    print(f"[study] {study.name}: {len(grid)} runs, {len(grid) - len([r for r in grid if not (out / r.rel() / DONE).exists()])} "
          f"complete, {len(todo)} to run ({parallel} at a time){lr_note}", flush=True)
    if power_line(study):
        print(f"[study] {power_line(study)}", flush=True)
    if not todo:  # nothing to run: no provenance check, no meta update
        return 0
    from .callback_check import check_callbacks

    check_callbacks(study)  # every callback of the runs builds from its arguments, before the first run
    if dry_run:
        for r in todo:
            print(" ".join(fit_command(study, study.variant(r.variant), r.seed, out / r.rel(), r.lr)))
        return 0
    out.mkdir(parents=True, exist_ok=True)
    provenance = code_provenance()
    print(f"[study] code at commit {provenance['commit']}{' (with uncommitted changes)' if provenance['dirty'] else ''}",
          flush=True)
    _meta(study, out, parallel, provenance, allow_code_change, allow_data_change)
    if study.path is not None:
        shutil.copyfile(study.path, out / "study.yaml")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")  # an MLflow logger writes a file store in its run (loggers.py)
    env.setdefault("OMP_NUM_THREADS", "1" if parallel > 1 else env.get("OMP_NUM_THREADS", ""))
    if not env["OMP_NUM_THREADS"]:
        env.pop("OMP_NUM_THREADS")
    runs, started = Runs(), {}
    failed = 0
    previous = runs.install()
    try:
        try:
            while (todo and not runs.got) or runs.procs:
                while todo and not runs.got and len(runs.procs) < max(1, parallel):
                    r = todo.pop(0)
                    proc, root, t0 = _start(study, r, out, env)
                    runs.add(proc)
                    started[proc.pid] = (r, root, t0)
                _say(runs.news())
                time.sleep(0.5 if not runs.got else 0.1)
                for proc in list(runs.procs):
                    rc = runs.exited(proc)
                    if rc is None:
                        continue
                    r, root, t0 = started.pop(proc.pid)
                    if not runs.got or rc == 0 or _diverged(root):  # a run stopped by the signal is not a failure
                        failed += not _finish(study, r, root, rc, t0, provenance)
            _say(runs.news())
        except BaseException:  # the runner failed: its runs save their step and stop (a signal now kills them)
            if not runs.got:
                runs.handler(signal.SIGTERM, None)
            runs.wait()
            raise
    finally:
        runs.restore(previous)
    if len(runs.got) > 1:
        raise StopSignal(runs.got[1], killed_line(runs.got[1]))
    if runs.got:  # the line names the runner's own signal (run_guarded prints it)
        raise StopSignal(runs.got[0], stopped_line(runs.got[0], runs.passed_on()))
    print(f"[study] {now()} finished: {failed} failed", flush=True)
    return failed
