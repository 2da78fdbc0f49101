"""Messages from Lightning's internals that are not true of this library's runs, each filtered exactly.

A first ``fit`` prints only what is true and useful to the user. Each filter below matches ONE message
(its text, and for warnings the Lightning module that issues it) and says why it is untrue here; every
other warning, a user's own included, still shows. What this library caused itself is fixed at its cause
instead: the checkpoint folder held the run's lock file when Lightning checked that it was empty
(``SafeModelCheckpoint`` now leaves its own lock file out of that check), and Lightning's model summary (with
a ``FLOPs`` column that reads 0 without an example input) is off by default because ``fit`` prints the
library's own count (``Transformer: parameters: ...``; ``--trainer.enable_model_summary=true`` brings the
summary back).

- ``isinstance(treespec, LeafSpec)`` is deprecated (a ``FutureWarning``): Lightning's own pytree helper
  (``lightning/pytorch/utilities/_pytree.py``) builds torch's deprecated ``LeafSpec()`` whenever the trainer
  wraps a data loader; nothing a user wrote causes it and nothing they can change removes it.
- ``Your `IterableDataset` has `__len__` defined ...`` (``lightning/pytorch/utilities/data.py``): Lightning
  warns about any iterable dataset with a length, in case its workers duplicate data. litdata's
  ``StreamingDataset`` (what ``TokenDataModule`` streams) gives each rank and worker its own chunks, so its
  length is exact; the filter is installed by ``TokenDataModule`` only.
- ``It is recommended to use `self.log('val/loss', ..., sync_dist=True)` ...`` (and ``val/ppl``, and the
  ``val/<source>/loss`` and ``/ppl`` of several data folders; ``logger_connector/result.py``), in a run of
  several processes: Lightning warns about any tensor logged at epoch end without ``sync_dist``. These are
  computed by torchmetrics' ``MeanMetric`` (``lit/steps.py``), whose ``compute`` already reduces over every
  process (a token-weighted mean of the whole validation set), so each rank logs the same, complete value.
  Only these names, from that module: the same warning about a user's own metric still shows.
- ``Experiment logs directory <run folder> exists and is not empty. Previous log files in this directory
  will be deleted ...`` (``lightning/fabric/loggers/csv_logs.py``), with a CSV logger: its folder is the
  run's own (``lit/runfolder.py``), which holds ``config.yaml`` and ``checkpoints/`` when the logger starts,
  and the only file the logger deletes there is an earlier ``metrics.csv``. Filtered for that run folder
  only, and only when it holds no ``metrics.csv`` (a resumed run's, which the logger does delete, is still
  warned about).
- ``The `srun` command is available on your system but is not used. HINT: ...`` (``PossibleUserWarning``,
  ``lightning/fabric/plugins/environments/slurm.py``), on any machine where SLURM is installed (a cluster's
  login node) whenever ``fit`` runs outside a SLURM job: Lightning warns in case the user meant to launch the
  ranks of an allocation with ``srun``. Inside an allocation (``sbatch``, ``salloc``) SLURM sets
  ``SLURM_NTASKS`` and the warning never fires, so where it fires the run is one launched outside SLURM, whose
  processes Lightning (or torchrun) starts itself; ``launch/slurm_fit.sbatch`` is what runs under SLURM.
- The ``litlogger`` tip (a log record of ``lightning.pytorch``'s logger connector, an advertisement printed
  on every run that does not use Lightning's cloud logger): dropped by a ``logging`` filter on the two
  loggers that can emit it, matching its text.

Plain Python: must not import torch or Lightning.
"""
from __future__ import annotations

import logging
import re
import warnings

LEAFSPEC = r"`isinstance\(treespec, LeafSpec\)` is deprecated"
LEAFSPEC_MODULE = r"lightning\.pytorch\.utilities\._pytree"
ITERABLE_LEN = r"Your `IterableDataset` has `__len__` defined"
ITERABLE_LEN_MODULE = r"lightning\.pytorch\.utilities\.data"
LITLOGGER_TIP = "Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]"
EPOCH_SYNC = r"It is recommended to use `self\.log\('val/([^']+/)?(loss|ppl)', \.\.\., sync_dist=True\)`"
EPOCH_SYNC_MODULE = r"lightning\.pytorch\.trainer\.connectors\.logger_connector\.result"
CSV_LOG_DIR = "Experiment logs directory {} exists and is not empty\\. Previous log files"
CSV_LOG_DIR_MODULE = r"lightning\.fabric\.loggers\.csv_logs"
SRUN_UNUSED = r"The `srun` command is available on your system but is not used\."
SRUN_UNUSED_MODULE = r"lightning\.fabric\.plugins\.environments\.slurm"
RANK_ZERO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


class _DropLitLoggerTip(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return LITLOGGER_TIP not in str(record.msg)


def filter_lightning_internals() -> None:
    """The LeafSpec deprecation, the validation metrics' ``sync_dist`` advice and the litlogger tip (installed
    when ``scalevec_lit.lit`` is imported)."""
    warnings.filterwarnings("ignore", message=LEAFSPEC, category=FutureWarning, module=LEAFSPEC_MODULE)
    warnings.filterwarnings("ignore", message=EPOCH_SYNC, module=EPOCH_SYNC_MODULE)
    warnings.filterwarnings("ignore", message=SRUN_UNUSED, module=SRUN_UNUSED_MODULE)
    for name in RANK_ZERO_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropLitLoggerTip) for f in logger.filters):
            logger.addFilter(_DropLitLoggerTip())


def filter_litdata_length() -> None:
    """Lightning's ``IterableDataset`` length warning, untrue for litdata's per-worker streams."""
    warnings.filterwarnings("ignore", message=ITERABLE_LEN, module=ITERABLE_LEN_MODULE)


def filter_csv_log_dir(folder: str) -> None:
    """The CSV logger's "previous log files ... will be deleted" about the run ``folder``, which holds none."""
    warnings.filterwarnings("ignore", message=CSV_LOG_DIR.format(re.escape(folder)), module=CSV_LOG_DIR_MODULE)
