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
- The ``litlogger`` tip (a log record of ``lightning.pytorch``'s logger connector, an advertisement printed
  on every run that does not use Lightning's cloud logger): dropped by a ``logging`` filter on the two
  loggers that can emit it, matching its text.

Plain Python: must not import torch or Lightning.
"""
from __future__ import annotations

import logging
import warnings

LEAFSPEC = r"`isinstance\(treespec, LeafSpec\)` is deprecated"
LEAFSPEC_MODULE = r"lightning\.pytorch\.utilities\._pytree"
ITERABLE_LEN = r"Your `IterableDataset` has `__len__` defined"
ITERABLE_LEN_MODULE = r"lightning\.pytorch\.utilities\.data"
LITLOGGER_TIP = "Tip: For seamless cloud logging and experiment tracking, try installing [litlogger]"
RANK_ZERO_LOGGERS = ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero")


class _DropLitLoggerTip(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return LITLOGGER_TIP not in str(record.msg)


def filter_lightning_internals() -> None:
    """The LeafSpec deprecation and the litlogger tip (installed when ``scalevec_lit.lit`` is imported)."""
    warnings.filterwarnings("ignore", message=LEAFSPEC, category=FutureWarning, module=LEAFSPEC_MODULE)
    for name in RANK_ZERO_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropLitLoggerTip) for f in logger.filters):
            logger.addFilter(_DropLitLoggerTip())


def filter_litdata_length() -> None:
    """Lightning's ``IterableDataset`` length warning, untrue for litdata's per-worker streams."""
    warnings.filterwarnings("ignore", message=ITERABLE_LEN, module=ITERABLE_LEN_MODULE)
