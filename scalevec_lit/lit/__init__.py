"""The Lightning layer: CausalLM, optimizer groups, schedules, FSDP2 application."""
from .module import CausalLM, NonFiniteLossError
from .parallel import ParallelOptions, parallelize
from .schedules import WSD, Constant, Schedule, WarmupCosine

__all__ = ["CausalLM", "Constant", "NonFiniteLossError", "ParallelOptions", "Schedule", "WSD", "WarmupCosine", "parallelize"]
