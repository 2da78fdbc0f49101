"""A ``trainer.*`` value the parser lets through (the key takes any string or number) and Lightning refuses when the
``Trainer`` is built (``ScaleVecCLI.instantiate_trainer``), in one line naming the key, the value, what is
accepted and the fix, in place of Lightning's sentence (``You selected an invalid strategy name: `strategy='foo'`
… Find a complete list of options in our documentation``) or, for ``trainer.devices``, its ``TypeError`` (which
the command line took for a bug):

- ``trainer.strategy``: a name outside Lightning's registry; a strategy that needs GPUs on a CPU accelerator;
- ``trainer.accelerator``: a name outside Lightning's registry (``gpu`` without a GPU: ``checks.py``);
- ``trainer.devices``: a value the accelerator does not take (a word, 0, a negative count other than -1 on CPU);
- ``trainer.num_nodes``: below 1.

Any other error is left as it is. Imports Lightning only when an error is placed.
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


def trainer_sentence(err: BaseException, trainer: Any) -> Optional[str]:
    """The one line for Lightning's refusal ``err`` of a ``trainer`` value (``trainer``: the parsed section), or
    None for any other error."""
    text = " ".join(str(err).split())
    get = (lambda key: trainer.get(key)) if hasattr(trainer, "get") else (lambda key: getattr(trainer, key, None))
    found = _STRATEGY.search(text)
    if found:
        from lightning.pytorch.strategies import StrategyRegistry

        names = ["auto", *StrategyRegistry.available_strategies()]
        return (f"trainer.strategy: {found.group(1)}: not a strategy Lightning knows; {_suggest(found.group(1), names)}"
                f"give a name of its registry ({', '.join(_SHOWN)}, … {len(names)} in all) or a class: class_path: "
                "lightning.pytorch.strategies.ModelParallelStrategy (FSDP2, as the GPU recipes), e.g. "
                "--trainer.strategy=auto")
    found = _ACCELERATOR.search(text)
    if found:
        names = sorted({*(n.strip() for n in found.group(2).split(",")), "gpu"})
        return (f"trainer.accelerator: {found.group(1)}: not one of {', '.join(names)}; "
                f"{_suggest(found.group(1), names)}e.g. --trainer.accelerator=cpu")
    found = _NEEDS_GPU.search(text)
    if found:
        return (f"trainer.strategy: {found.group(1)}: needs a GPU accelerator, and trainer.accelerator is "
                f"{found.group(2)}; run it on GPUs with --trainer.accelerator=gpu, or on this machine use "
                "--trainer.strategy=auto (or ddp)")
    if _DEVICES.search(text):
        return (f"trainer.devices: {get('devices')}: not a device count the {get('accelerator') or 'chosen'} "
                "accelerator takes; give a number of devices ≥ 1, auto, or -1 for all (on GPUs also a list of "
                "indices, e.g. [0, 1]), e.g. --trainer.devices=1")
    found = _NODES.search(text)
    if found:
        return f"trainer.num_nodes: {found.group(1)}: must be at least 1; e.g. --trainer.num_nodes=1"
    return None
