"""Expected wall time of a study before it starts: ``python -m scalevec_lit study plan <study.yaml>
[--devices 1 8] [--device H200] [--mfu 0.35]``, also printed by ``study run`` for a GPU study.

For the study's reference variant (its ``baseline``) the plan of one run is read from ``fit --print_plan
--plan_json`` (``lit/plan.py``, run in a subprocess: the study process imports no torch): FLOPs per token
(6 N_active + 12 L H d_head T, forward and backward), tokens per step and steps. Then, for D devices:

    train FLOP  = steps × tokens per step × FLOPs per token
    val FLOP    = evaluations × limit_val_batches × micro-batch tokens × data-parallel ranks × FLOPs per token / 3
    monitor FLOP = for a ``SharpnessMonitor`` in the study's callbacks: (steps / every_n_steps + 1) calls ×
                  iterations × parameter subsets × 2 (the raw and the preconditioned problem; 1 with
                  ``precondition: false``) × its batch tokens × 3 × FLOPs per token (a Hessian-vector product
                  costs about three forward-backward passes; at most ``iterations`` Lanczos steps a problem)
    run time    = (train + val + monitor FLOP) / (D × peak × MFU) + start-up (compile, data, checkpoints)
    study time  = runs × run time (runs go one after another; each uses every device of the recipe)

``peak`` is the dense bf16 tensor-core peak of the device (H100 and H200 SXM: 989 TFLOP/s; A100: 312) and
MFU an assumption stated beside the figure (default 0.35: what well-tuned compiled training of models of
0.1-2B parameters reaches on H100-class GPUs; the figure is only as good as this number — measure yours
with ``benchmarks/gpu_check.sh`` and pass ``--mfu``). The variants of one study differ only in their scale
vectors (< 0.1% of the FLOPs), so the reference variant's plan stands for all of them.

CPU studies: no peak to divide by; the estimate is the mean wall time of the study's complete runs, when
there are some, times the runs left.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Optional

from ..errors import UserError
from .spec import DONE, Study, fit_command

#: Dense bf16 tensor-core peak, FLOP/s (SXM parts).
PEAK_BF16 = {"H200": 989.4e12, "H100": 989.4e12, "A100": 312.0e12}
DEFAULT_MFU = 0.35
#: Per run: process start, model build, per-block compile, data loader start, final checkpoint.
STARTUP_S = 180.0
HVP_COST = 3.0  # a Hessian-vector product in units of one forward + backward of the same tokens (measured
# on the smoke model: 1.0 s against 0.35 s, docs/monitoring.md)
SHARPNESS = "scalevec_lit.callbacks.SharpnessMonitor"


def run_plan(study: Study, devices: int) -> dict:
    """The plan of one run of the reference variant on ``devices`` devices (a ``fit --print_plan`` subprocess)."""
    variant = study.variant(study.baseline)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "callbacks.yaml").write_text("{}\n")
        cmd = fit_command(study, variant, study.seeds[0], root, (study.lrs_of(variant) or [None])[0])
        cmd = [c for c in cmd if not c.startswith("--ckpt_path")]
        cmd += ["--print_plan", f"--plan_devices={devices}", f"--plan_json={root / 'plan.json'}"]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        if proc.returncode != 0 or not (root / "plan.json").exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            raise UserError(f"study plan: {study.path or study.name}", study.baseline,
                            f"the plan of this variant's fit command failed (exit {proc.returncode}): "
                            + " / ".join(tail), "run that command (study run --dry-run prints it) and fix what it names")
        return json.loads((root / "plan.json").read_text())


def _sharpness_cost(study: Study) -> Optional[dict]:
    args = study.callbacks.get(SHARPNESS)
    if args is None:
        return None
    args = dict(args or {})
    params = args.get("params", ["all"])
    return {"every": int(args.get("every_n_steps", 100)), "iters": int(args.get("iterations", 20)),
            "subsets": 1 if isinstance(params, str) else len(params), "rows": args.get("batch_size"),
            "problems": 2 if args.get("precondition", True) else 1}  # raw λ and the preconditioned one


def run_flops(plan: dict, study: Study) -> dict:
    """FLOPs of one run: training, validation and the sharpness monitor (see the module docstring)."""
    fpt = float(plan["flops_per_token"])
    steps = int(plan["max_steps"] or 0)
    per_step = plan.get("tokens_per_step") or plan["micro_tokens"] * plan["data_parallel"]
    train = steps * per_step * fpt
    interval, limit = plan.get("val_check_interval"), plan.get("limit_val_batches")
    val = 0.0
    if isinstance(interval, int) and interval > 0 and isinstance(limit, int):
        val = (steps // interval) * limit * plan["micro_tokens"] * plan["data_parallel"] * fpt / 3.0
    monitor = 0.0
    sharp = _sharpness_cost(study)
    if sharp and sharp["every"] > 0:  # at step 0 and every N steps; one Lanczos run per parameter subset
        tokens = sharp["rows"] * plan["seq_len"] if sharp["rows"] else plan["micro_tokens"]
        monitor = ((steps // sharp["every"] + 1) * sharp["iters"] * sharp["subsets"] * sharp["problems"] * tokens
                   * HVP_COST * fpt)
    return {"train": train, "val": val, "monitor": monitor, "total": train + val + monitor,
            "tokens": steps * per_step}


def gpu_estimate(study: Study, devices: list[int], device: str = "H200", mfu: float = DEFAULT_MFU,
                 plans: Optional[dict[int, dict]] = None) -> list[dict]:
    """One row per device count: FLOPs and the expected wall time of one run and of the whole study."""
    if device not in PEAK_BF16:
        raise UserError("study plan: --device", device, "is not known", f"give one of {', '.join(sorted(PEAK_BF16))}")
    if not 0.0 < mfu <= 1.0:
        raise UserError("study plan: --mfu", mfu, "must be in (0, 1]", "e.g. --mfu 0.35")
    runs = len(study.runs())
    rows = []
    for d in devices:
        plan = (plans or {}).get(d) or run_plan(study, d)
        flops = run_flops(plan, study)
        run_s = flops["total"] / (d * PEAK_BF16[device] * mfu) + STARTUP_S
        rows.append({"devices": d, "device": device, "mfu": mfu, "runs": runs, "run_flops": flops,
                     "run_s": run_s, "study_s": runs * run_s, "plan": plan})
    return rows


def cpu_estimate(study: Study, out: Path) -> Optional[dict]:
    """Mean wall time of the complete runs and the time of the runs left (``None`` without complete runs)."""
    walls = []
    for done in Path(out).rglob(DONE):
        try:
            walls.append(float(json.loads(done.read_text()).get("wall_s_last_attempt") or 0.0))
        except (OSError, ValueError):
            continue
    walls = [w for w in walls if w > 0]
    if not walls:
        return None
    left = len(study.runs()) - len(walls)
    mean = sum(walls) / len(walls)
    return {"complete": len(walls), "mean_run_s": mean, "left": max(0, left), "left_s": max(0, left) * mean}


def _hm(seconds: float) -> str:
    h, m = divmod(int(round(seconds / 60.0)), 60)
    return f"{h} h {m:02d} min" if h else f"{m} min"


def format_gpu(rows: list[dict], study: Study) -> str:
    first = rows[0]
    plan, flops = first["plan"], first["run_flops"]
    lines = [f"[study] {study.name}: expected wall time ({first['runs']} runs, one after another; reference "
             f"variant {study.baseline!r}: {plan['params_total']:,} parameters, {flops['tokens']:,} tokens per run, "
             f"{plan['flops_per_token'] / 1e9:.3f} GFLOP per token)",
             f"[study]   assumed: {first['device']} dense bf16 peak {PEAK_BF16[first['device']] / 1e12:.0f} TFLOP/s, "
             f"MFU {first['mfu']:.2f} (measure yours with benchmarks/gpu_check.sh; --mfu), "
             f"{STARTUP_S:.0f} s start-up per run"]
    if flops["monitor"]:
        lines.append(f"[study]   SharpnessMonitor: {100 * flops['monitor'] / flops['total']:.1f}% of each run's FLOPs")
    lines.append(f"[study]   {'devices':>8} {'per run':>14} {'whole study':>14}")
    for r in rows:
        lines.append(f"[study]   {r['devices']:>4} × {r['device']} {_hm(r['run_s']):>14} {_hm(r['study_s']):>14}")
    return "\n".join(lines)


def is_gpu_study(plan_or_study) -> bool:
    """A study whose base recipes train on GPUs (``trainer.accelerator: gpu|cuda``)."""
    import yaml

    accel = ""
    for recipe in plan_or_study.base:
        trainer = (yaml.safe_load(Path(recipe).read_text()) or {}).get("trainer") or {}
        accel = str(trainer.get("accelerator", accel))
    return accel.lower() in ("gpu", "cuda")


def print_estimate(study: Study, out: Path, devices: Optional[list[int]] = None, device: str = "H200",
                   mfu: float = DEFAULT_MFU, power: bool = True) -> None:
    from .secondary import power_line

    if power and power_line(study):
        print(f"[study] {power_line(study)}", flush=True)
    if is_gpu_study(study):
        print(format_gpu(gpu_estimate(study, devices or [1, 8], device, mfu), study), flush=True)
        return
    cpu = cpu_estimate(study, out)
    if cpu is None:
        print(f"[study] {study.name}: a CPU study; no complete run yet to time (the study file's header states "
              "the measured time per run)", flush=True)
    else:
        print(f"[study] {study.name}: {cpu['complete']} runs complete, {_hm(cpu['mean_run_s'])} each on average; "
              f"{cpu['left']} left: about {_hm(cpu['left_s'])} one at a time", flush=True)


if __name__ == "__main__":  # pragma: no cover - the command is ``python -m scalevec_lit study plan``
    sys.exit("use: python -m scalevec_lit study plan <study.yaml>")
