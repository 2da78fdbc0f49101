"""``python -m scalevec_lit inspect PATH [--compare OTHER] [--out DIR]``: every scale vector of a checkpoint or
a local Hugging Face model, per layer, site, branch and role: the statistics the scale monitor logs, the
conserved quantity ‖w_j‖² − γ_j² of input-role scales, and how each would fold; tables, CSV/JSON, figures.

Modules: ``sites_view`` (the one reader of the scale sites), ``load`` (checkpoint or HF folder → native model),
``stats`` (the numbers, through ``callbacks/_monitor_stats.py``), ``tables`` (terminal tables, CSV, JSON),
``figures`` (PNG), ``compare`` (two models side by side), ``command`` (the command line).
See docs/inspect.md.
"""
from .command import inspect, main
from .load import Loaded, load
from .sites_view import FoldTarget, VectorView, scale_vectors
from .stats import STAT_NAMES, Row, rows_of

__all__ = ["FoldTarget", "Loaded", "Row", "STAT_NAMES", "VectorView", "inspect", "load", "main", "rows_of",
           "scale_vectors"]
