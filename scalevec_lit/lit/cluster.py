"""The cluster a run is launched on, as Lightning detects it.

Under SLURM Lightning installs its own requeue handler on SIGUSR1 (``SLURMEnvironment(auto_requeue=True)``, the
default: "SLURM auto-requeueing enabled. Setting signal handlers.", once per task): it saves an ``hpc_ckpt_*``
checkpoint and runs ``scontrol requeue`` itself. This library's ``SafeModelCheckpoint`` owns SIGUSR1 during
training (it saves at the current step and exits with 138) and ``launch/slurm_fit.sbatch`` requeues on that exit
code, so a job stopped by its time limit is requeued once, by one party. ``leave_requeue_to_the_job`` switches
Lightning's handler off for every ``fit`` (its line is gone with it).
"""
from __future__ import annotations


def leave_requeue_to_the_job(trainer) -> None:
    """Lightning's SLURM auto-requeue off, before ``fit`` registers its signal handlers."""
    from lightning.fabric.plugins.environments import SLURMEnvironment

    env = getattr(trainer.strategy, "cluster_environment", None)
    if isinstance(env, SLURMEnvironment):
        env.auto_requeue = False
