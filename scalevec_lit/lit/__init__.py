"""The Lightning layer: CausalLM, optimizer groups, schedules, FSDP2 application."""
from ..known_warnings import filter_lightning_internals

filter_lightning_internals()  # two Lightning-internal messages untrue for every run, each matched exactly
from .module import CausalLM, NonFiniteLossError
from .parallel import ParallelOptions, parallelize
from .schedules import WSD, Constant, Schedule, WarmupCosine

__all__ = ["CausalLM", "Constant", "NonFiniteLossError", "ParallelOptions", "Schedule", "WSD", "WarmupCosine", "parallelize"]
