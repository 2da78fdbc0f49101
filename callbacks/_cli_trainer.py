"""A ``trainer.*`` value the parser lets through (the key takes any string or number) and Lightning refuses when the
``Trainer`` is built (``ScaleVecCLI.instantiate_trainer``), in one line naming the key, the value, what is
accepted and the fix, in place of Lightning's sentence (``You selected an invalid strategy name: `strategy='foo'`
… Find a complete list of options in our documentation``) or, for ``trainer.devices``, its ``TypeError`` (which
the command line took for a bug):

- ``trainer.strategy``: a name outside Lightning's registry; a strategy that needs GPUs on a CPU accelerator;
- ``trainer.accelerator``: a name outside Lightning's registry (``gpu`` without a GPU: ``checks.py``);
- ``trainer.devices``: a value the accelerator does not take (a word, 0, a negative count other than -1 on CPU);
- ``trainer.num_nodes``: below 1.

Any other error is left as it is. Imports Lightning only when an error is placed. ``refused_value`` gives the same
line for a value a fit refuses on any machine without building the Trainer (``fit --print_plan``).
"""
from __future__ import annotations

import difflib
import re
from typing import Any, Optional

__all__: list[str] = []  # nothing here is a callback

_STRATEGY = re.compile(r"invalid strategy name: `strategy='(.*?)'`")
_ACCELERATOR = re.compile(r"invalid accelerator name: `accelerator='(.*?)'`\. Available names are: (.*?)\.$")
_NEEDS_GPU = re.compile(r"The strategy `(.*?)` requires a GPU accelerator, but received `accelerator='(.*?)'`")
_DEVICES = re.compile(r"`devices` selected with `\w+` should be|`Trainer\(devices=.*?\)` value is not a valid input")
_NODES = re.compile(r"`num_nodes` must be a positive integer, but got (.*?)\.$")
_SHOWN = ("auto", "ddp", "ddp_spawn", "fsdp", "deepspeed", "single_device")  # the registry's others are variants


def _suggest(value: str, names: list[str]) -> str:
    close = difflib.get_close_matches(str(value), names, n=1)
    return f"did you mean {close[0]!r}? " if close else ""


def _strategy_line(value: str) -> str:
    from lightning.pytorch.strategies import StrategyRegistry

    names = ["auto", *StrategyRegistry.available_strategies()]
    return (f"trainer.strategy: {value}: not a strategy Lightning knows; {_suggest(value, names)}"
            f"give a name of its registry ({', '.join(_SHOWN)}, … {len(names)} in all) or a class: class_path: "
            "lightning.pytorch.strategies.ModelParallelStrategy (FSDP2, as the GPU recipes), e.g. "
            "--trainer.strategy=auto")


def _accelerator_line(value: str, available: list[str]) -> str:
    names = sorted({*available, "gpu"})
    return f"trainer.accelerator: {value}: not one of {', '.join(names)}; {_suggest(value, names)}e.g. --trainer.accelerator=cpu"


def _needs_gpu_line(strategy: str, accelerator: str) -> str:
    return (f"trainer.strategy: {strategy}: needs a GPU accelerator, and trainer.accelerator is {accelerator}; run it "
            "on GPUs with --trainer.accelerator=gpu, or on this machine use --trainer.strategy=auto (or ddp)")


def _devices_line(devices: Any, accelerator: Any) -> str:
    accepted = ("a number of processes ≥ 1 or auto (the cpu accelerator takes neither -1 nor a list)"
                if accelerator == "cpu" else "a number of devices ≥ 1, auto, -1 for all, or a list of indices (e.g. [0, 1])")
    return (f"trainer.devices: {devices}: not a device count the {accelerator or 'chosen'} accelerator takes; give "
            f"{accepted}, e.g. --trainer.devices=1")


def _nodes_line(value: Any) -> str:
    return f"trainer.num_nodes: {value}: must be at least 1; e.g. --trainer.num_nodes=1"


def trainer_sentence(err: BaseException, trainer: Any) -> Optional[str]:
    """The one line for Lightning's refusal ``err`` of a ``trainer`` value (``trainer``: the parsed section), or
    None for any other error."""
    text = " ".join(str(err).split())
    get = _getter(trainer)
    found = _STRATEGY.search(text)
    if found:
        return _strategy_line(found.group(1))
    found = _ACCELERATOR.search(text)
    if found:
        return _accelerator_line(found.group(1), [n.strip() for n in found.group(2).split(",")])
    found = _NEEDS_GPU.search(text)
    if found:
        return _needs_gpu_line(found.group(1), found.group(2))
    if _DEVICES.search(text):
        return _devices_line(get("devices"), get("accelerator"))
    found = _NODES.search(text)
    if found:
        return _nodes_line(found.group(1))
    return None


def _getter(trainer: Any):
    return (lambda key: trainer.get(key)) if hasattr(trainer, "get") else (lambda key: getattr(trainer, key, None))


def _count(value: Any, low: int) -> bool:
    """``value`` is a whole number ≥ ``low`` (or -1), or its digits as a string."""
    if isinstance(value, str):
        value = value.strip()
        value = int(value) if value.isdigit() or value == "-1" else None
    return isinstance(value, int) and not isinstance(value, bool) and (value >= low or value == -1)


def _devices_refused(devices: Any, accelerator: Any) -> bool:
    """Whether Lightning refuses ``devices`` on any machine: 0 or an empty list; on a ``cpu`` accelerator anything
    but a count ≥ 1 (or auto); on another (``auto`` too) anything but a count ≥ 1, -1, or GPU indices (a list of
    them, each once, or ``"0,1"``). Whether the machine has those devices is left to the fit."""
    if devices is None or devices == "auto":
        return False
    if devices in ([], 0, "0"):
        return True
    if accelerator == "cpu":
        return not _count(devices, 1) or devices in (-1, "-1")
    if isinstance(devices, str) and "," in devices:
        devices = [d for d in devices.split(",") if d.strip()]
    if isinstance(devices, (list, tuple)):  # GPU indices, each once
        ids = [int(d) if _count(d, 0) else -1 for d in devices]
        return not ids or min(ids) < 0 or len(set(ids)) < len(ids)
    return not _count(devices, 1)


def refused_value(trainer: Any) -> Optional[str]:
    """The one line (as ``trainer_sentence`` words it) for the first ``trainer.strategy``, ``trainer.accelerator``,
    ``trainer.num_nodes`` or ``trainer.devices`` value that a fit refuses on any machine, in Lightning's order, or
    None; builds no ``Trainer`` (``fit --print_plan``, which runs where the fit will not: a GPU recipe's plan on a
    machine without a GPU is not refused). A class (``class_path``) or an object is left to the fit."""
    if trainer is None:
        return None
    from lightning.pytorch.accelerators import AcceleratorRegistry
    from lightning.pytorch.strategies import FSDPStrategy, StrategyRegistry

    get = _getter(trainer)
    strategy, accelerator = get("strategy"), get("accelerator")
    strategy = strategy.lower() if isinstance(strategy, str) else None
    accelerator = accelerator if isinstance(accelerator, str) else None
    if strategy is not None and strategy != "auto" and strategy not in StrategyRegistry.available_strategies():
        return _strategy_line(strategy)
    available = list(AcceleratorRegistry.available_accelerators())
    if accelerator is not None and accelerator not in (*available, "auto", "gpu"):
        return _accelerator_line(accelerator, ["auto", *available])
    nodes = get("num_nodes")
    if nodes is not None and (not isinstance(nodes, int) or nodes < 1):
        return _nodes_line(nodes)
    if _devices_refused(get("devices"), accelerator):
        return _devices_line(get("devices"), accelerator)
    if strategy in FSDPStrategy.get_registered_strategies() and accelerator not in (None, "auto", "cuda", "gpu"):
        return _needs_gpu_line("fsdp", accelerator)
    return None
