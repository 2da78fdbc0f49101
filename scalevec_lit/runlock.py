"""One run owns its checkpoint folder: ``run.lock`` (pid, host, start time, command) in that folder.

``acquire_folder`` is called by ``SafeModelCheckpoint`` at fit start (on global rank 0; the other ranks of a group
that SLURM or torchrun started together refuse the same folder with ``check_folder_free`` before the group meets):

- the lock file is created atomically (``O_CREAT | O_EXCL``); a lock held by a live process refuses the
  second run with the fix (wait, stop it, or give this run its own folder);
- a lock left by a dead process on this host (a run killed with SIGKILL, a crashed node's restart on the
  same host) is stale, and so is one whose pid the system has since given to another process (the lock
  records the process's start time, ``proc_start``, which then differs; a lock of an older version, without
  ``proc_start``, whose pid belongs to a process started after the lock was written, likewise): it is taken
  over with a one-line note; a lock from another host cannot be checked
  from here, so the message names the host and says to remove the file if that run is gone;
- a run that does not resume (no ``--ckpt_path``, or a checkpoint outside the folder) into a folder that
  already holds checkpoints of an earlier run is refused: ``--ckpt_path last`` then always resumes the
  run that wrote the folder, never another one.

Plain Python: must not import torch or Lightning.
"""
from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Optional

from .errors import RunError, UserError, notice
from .processes import alive

LOCK = "run.lock"
NOT_RESUME_POINTS = ("nonfinite.ckpt",)  # post-mortem files, never resumed from


def _proc_start(pid: int) -> Optional[str]:
    """When process ``pid`` started (``<boot id>:<clock ticks since boot>`` from ``/proc``), or ``None`` where
    ``/proc`` cannot tell (another system, the process is gone): with the pid it names one process, so a pid
    the system gave to another program after the run ended is not taken for the run."""
    try:
        ticks = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19]  # field 22: starttime
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except (OSError, IndexError):
        return None
    return f"{boot}:{ticks}"


def _started_at(pid: int) -> Optional[float]:
    """When process ``pid`` started, in seconds since the epoch (``/proc``: boot time + its start ticks), or
    ``None`` where ``/proc`` cannot tell."""
    try:
        ticks = int(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()[19])
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, StopIteration):
        return None


def _written_at(held: dict, lock: Optional[Path]) -> Optional[float]:
    """When the lock was written: its ``started`` (local time, to the second), else the file's modification time."""
    try:
        return time.mktime(time.strptime(str(held.get("started")), "%Y-%m-%d %H:%M:%S"))
    except (ValueError, OverflowError):
        pass
    try:
        return lock.stat().st_mtime if lock is not None else None
    except OSError:
        return None


def _holder_running(held: dict, lock: Optional[Path] = None) -> tuple[bool, str]:
    """Whether the run that wrote ``held`` still runs, and why not (``""`` when it does). A lock without
    ``proc_start`` (written by a version before it was recorded) is compared by time: a process that started
    after the lock was written is not the run that wrote it."""
    pid = int(held.get("pid", -1))
    if not alive(pid):
        return False, f"(pid {held.get('pid')})"
    recorded, now = held.get("proc_start"), _proc_start(pid)
    if recorded and now and recorded != now:
        return False, (f"(pid {pid} now belongs to another process, started after that run: the system reused "
                       "the number)")
    if not recorded:
        written, began = _written_at(held, lock), _started_at(pid)
        if written is not None and began is not None and began > written + 2:  # 2 s: `started` is to the second
            return False, (f"(pid {pid} now belongs to another process, started "
                           f"{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(began))}, after the lock was written "
                           f"at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(written))}: the system reused the "
                           "number)")
    return True, ""


def _read(lock: Path) -> dict:
    try:
        return json.loads(lock.read_text())
    except (OSError, ValueError):
        return {}


def checkpoints_in(folder: Path) -> list[Path]:
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.iterdir() if p.suffix == ".ckpt" and p.name not in NOT_RESUME_POINTS)


def acquire_folder(folder: str | Path, key: str = "trainer.default_root_dir", given_as: Optional[str] = None) -> Path:
    """Take ``folder``'s lock for this process (idempotent); refuse a folder in use by another run, and one this
    process cannot create or write (``given_as``: the setting that named it, ``key`` when not given)."""
    folder, setting = Path(folder), given_as or key
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:  # a read-only or missing mount, a file in the way, no permission
        raise UserError(setting, str(folder), f"cannot create the checkpoint folder ({err.strerror}: {err.filename})",
                        f"set {setting} to a folder this process can create and write") from None
    lock = folder / LOCK
    mine = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join(sys.argv)[:500], "proc_start": _proc_start(os.getpid()), "launch": launch_id()}
    for _ in range(3):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            held = _read(lock)
            if held.get("pid") == mine["pid"] and held.get("host") == mine["host"]:
                break  # this process already holds it (a second fit in the same process)
            _refuse_if_held(folder, lock, held, key)
            gone = _holder_running(held, lock)[1] if held else ""
            notice(f"{lock}: taking over the lock of a run that is no longer running {gone or '(unreadable lock)'}")
            lock.unlink(missing_ok=True)
            continue
        except OSError as err:  # a read-only file system, no permission
            raise UserError(setting, str(folder), f"cannot write into the checkpoint folder ({err.strerror}: {lock})",
                            f"set {setting} to a folder this process can write") from None
        with os.fdopen(fd, "w") as fh:
            json.dump(mine, fh)
        break
    return lock


def launch_id() -> Optional[str]:
    """The start of a group of processes a launcher made together: a SLURM job's start (job id and restart count)
    or a torchrun group's (run id and the start's store); ``None`` for a process started on its own."""
    if os.environ.get("SLURM_JOB_ID") and int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1:
        return f"slurm:{os.environ['SLURM_JOB_ID']}:{os.environ.get('SLURM_RESTART_COUNT', '0')}"
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        # the start's store, rank 0's address and port: the same on every rank of one start (a fresh port per start
        # under launch/torchrun_fit.sh). Not the restart count: each agent keeps its own, and a host that joins an
        # elastic job later (--nnodes MIN:MAX) counts from 0 while the others count on, so its rank refused rank 0's
        # lock of the same start
        return (f"torchrun:{os.environ['TORCHELASTIC_RUN_ID']}:{os.environ.get('MASTER_ADDR', '')}:"
                f"{os.environ.get('MASTER_PORT', '')}")
    return None


def check_folder_free(folder: str | Path, key: str = "trainer.default_root_dir") -> None:
    """On the other ranks of a launched group (``launch_id``), before the processes meet: refuse, as rank 0 does,
    a folder whose lock a live run of another launch holds. Rank 0 stops at its refusal before the group's
    rendezvous, so without this the other ranks waited for it until the rendezvous timed out. Reads only; a lock of
    this launch (rank 0's, written first) passes."""
    mine = launch_id()
    lock = Path(folder) / LOCK
    held = _read(lock) if mine is not None and lock.is_file() else {}
    if held and held.get("launch") != mine:
        _refuse_if_held(Path(folder), lock, held, key)


def _refuse_if_held(folder: Path, lock: Path, held: dict, key: str) -> None:
    """The refusal of a folder whose lock ``held`` belongs to a run on another host or to a live process."""
    if held and held.get("host") != socket.gethostname():
        raise RunError(
            f"checkpoint folder {folder}", "in use",
            f"{lock} says a run on host {held.get('host')} (pid {held.get('pid')}, started {held.get('started')}) "
            "writes here, which cannot be checked from this host",
            f"if that run is gone, delete {lock}; otherwise give this run its own folder ({key}=...)",
        )
    if held and _holder_running(held, lock)[0]:
        raise RunError(
            f"checkpoint folder {folder}", "in use",
            f"another run (pid {held['pid']}, started {held.get('started')}) is writing its checkpoints here",
            f"wait for it to end or stop it (it saves a checkpoint on Ctrl-C/SIGTERM), or give this run its "
            f"own folder: --{key}=<another folder> (and another --trainer.logger.init_args.name)",
        )


def check_lineage(folder: str | Path, resume_from: Optional[str], key: str = "trainer.default_root_dir") -> None:
    """Refuse a run that does not resume from ``folder`` when ``folder`` holds an earlier run's checkpoints."""
    folder = Path(folder)
    existing = checkpoints_in(folder)
    if not existing:
        return
    if resume_from is not None and Path(resume_from).resolve().parent == folder.resolve():
        return
    release_folder(folder)
    what = "starts afresh" if resume_from is None else f"resumes from {resume_from}, outside it,"
    raise UserError(
        f"checkpoint folder {folder}", ", ".join(p.name for p in existing[-3:]),
        f"holds the checkpoints of an earlier run and this run {what} (its checkpoints would mix with them)",
        f"resume that run with --ckpt_path last, or give this run its own folder: --{key}=<another folder> (and "
        "another --trainer.logger.init_args.name), or delete the old checkpoints",
    )


def release_folder(folder: str | Path) -> None:
    """Remove ``folder``'s lock if this process holds it."""
    lock = Path(folder) / LOCK
    held = _read(lock)
    if held.get("pid") == os.getpid() and held.get("host") == socket.gethostname():
        lock.unlink(missing_ok=True)


def moved_folder_state(state: dict, folder: Optional[str]) -> dict:
    """A checkpoint callback's saved state, its paths moved to ``folder`` when that folder holds the files the
    state names under another path (the run's folder moved or renamed, or named relative then absolute):
    Lightning compares the folder by its string and otherwise forgets them, so a resumed run wrote
    ``last-v1.ckpt`` beside a stale ``last.ckpt`` and never deleted the old top-k checkpoints. A state whose
    files are not in ``folder`` (another run's) is returned as it is."""
    saved = state.get("dirpath")
    last = state.get("last_model_path") or state.get("best_model_path")
    if not saved or not folder or saved == folder or not last:
        return state

    def here(path):
        moved = os.path.join(folder, os.path.basename(str(path).rstrip("/")))
        return moved if os.path.exists(moved) else None

    if here(last) is None:
        return state
    moved = {**state, "dirpath": folder}
    for key in ("last_model_path", "best_model_path", "kth_best_model_path"):
        if state.get(key):
            moved[key] = here(state[key]) or ""
    if isinstance(state.get("best_k_models"), dict):
        moved["best_k_models"] = {here(p): v for p, v in state["best_k_models"].items() if here(p) is not None}
    return moved
