"""Ablation studies: run a grid of (variant x learning rate x seed) ``fit`` runs resumably, then report on
them with paired statistics.

``python -m scalevec_lit study run <study.yaml> [--parallel N] [--out DIR] [--dry-run] [--report]``
``python -m scalevec_lit study report <out dir> [--study <study.yaml>]``
``python -m scalevec_lit study plan <study.yaml> [--devices 1 8] [--device H200] [--mfu 0.35]``: the expected
wall time (``estimate``), also printed by ``study run`` before a GPU study starts.

One file per job: ``spec`` (the study file's data and the ``fit`` command of a run), ``checks`` (the whole
study file checked before any run) and ``callback_check`` (every run's callbacks built from their arguments,
in a subprocess), ``runner`` (run the grid resumably, record the code's commit), ``data_record`` (the data's
fingerprints, the same at every start), ``events`` (TensorBoard
scalars, the validation schedule, endpoints, complete runs), ``stats`` and ``power`` (paired t, sign test,
Student-t CI, the exact detectable effect, best LR), ``regime`` (tokens per parameter and epochs),
``secondary`` (other endpoints, the pre-registered power), ``estimate`` (wall time), ``figures`` (PNG plots),
``report`` (``report.md``, one file per section: ``provenance``, ``grid``, ``claims``).

May import yaml, tensorboard's event reader, (lazily, Agg backend) matplotlib, and of the rest of
``scalevec_lit`` only ``errors``, ``stopsignal`` and ``recipe_lookup``. Must not import torch or Lightning:
runs (and the callbacks' check) happen in subprocesses, so that a study process stays small and a crashed run
cannot take the study down.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

from ..errors import CommandLineParser, RunError
from .callback_check import check_callbacks
from .events import collect_done, endpoint, read_scalars, run_endpoint
from .runner import code_provenance, resolve_lr_from, run_study
from .spec import (CKPT_DIR, DONE, RWD, VAL_TAG, Run, Study, Variant, fit_command, load_study, run_callbacks,
                   run_dir)


def main(argv: Optional[list[str]] = None) -> int:
    parser = CommandLineParser(prog="python -m scalevec_lit study", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_run = sub.add_parser("run", help="run the study's incomplete runs (resumable)")
    p_run.add_argument("study")
    p_run.add_argument("--parallel", type=int, default=1, help="runs at once (default 1)")
    p_run.add_argument("--out", default=None, help="runs folder (default: the study's `out`)")
    p_run.add_argument("--dry-run", action="store_true", help="print the commands of the runs to do")
    p_run.add_argument("--report", action="store_true", help="write the report when all runs are done")
    p_run.add_argument("--limit", type=int, default=None, help="run at most this many of the incomplete runs")
    p_run.add_argument("--data", default=None, help="a prepared data folder for every run (--data.data_dir)")
    p_run.add_argument("--allow-code-change", action="store_true",
                       help="continue a study whose earlier runs were made at another commit")
    p_run.add_argument("--allow-data-change", action="store_true",
                       help="continue a study whose earlier runs read data with other fingerprints")
    p_run.add_argument("--mfu", type=float, default=None, help="assumed model FLOPs utilization for the "
                       "wall-time estimate of a GPU study (default 0.35)")
    p_plan = sub.add_parser("plan", help="the expected wall time of a study, before it starts")
    p_plan.add_argument("study")
    p_plan.add_argument("--devices", type=int, nargs="+", default=[1, 8], help="device counts (default: 1 8)")
    p_plan.add_argument("--device", default="H200", help="H200 (default), H100 or A100")
    p_plan.add_argument("--mfu", type=float, default=None, help="assumed model FLOPs utilization (default 0.35)")
    p_plan.add_argument("--out", default=None, help="runs folder (default: the study's `out`)")
    p_rep = sub.add_parser("report", help="write report.md and plots from complete runs")
    p_rep.add_argument("dir", help="the study's output folder (holding runs/) or the runs folder")
    p_rep.add_argument("--study", default=None, help="the study YAML (default: the copy saved in the runs folder)")
    args = parser.parse_args(argv)
    if args.cmd == "plan":
        from .estimate import DEFAULT_MFU, print_estimate

        study = load_study(args.study)
        check_callbacks(study)  # every run's callbacks build from their arguments, before anything else
        print_estimate(study, Path(args.out or study.out), args.devices, args.device, args.mfu or DEFAULT_MFU)
        return 0
    if args.cmd == "run":
        study = load_study(args.study)
        if args.data:
            study.args = [a for a in study.args if not a.startswith("--data.data_dir=")] + [f"--data.data_dir={args.data}"]
        out = Path(args.out or study.out)
        if not args.dry_run:
            from .estimate import DEFAULT_MFU, print_estimate

            print_estimate(study, out, mfu=args.mfu or DEFAULT_MFU, power=False)  # run_study states it
        failed = run_study(study, out, args.parallel, args.dry_run, args.allow_code_change, args.limit,
                           args.allow_data_change)
        if args.report and not failed and not args.dry_run:
            from .report import write_report

            write_report(out.parent if out.name == "runs" else out, study)
        if failed:  # exit 1 (a failure at run time), so that `study run ... && study report ...` stops here
            raise RunError("study", study.name, f"{failed} run(s) failed (the lines `[study] FAILED` above name each "
                           "and its log.txt)", "read those logs, fix the cause and run the same command again: "
                           "complete runs are skipped, interrupted ones resume")
        return 0
    from .report import write_report

    study = load_study(args.study) if args.study else None
    write_report(Path(args.dir), study)
    return 0


if __name__ == "__main__":
    sys.exit(main())
