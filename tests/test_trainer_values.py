"""A ``trainer.*`` value the parser lets through and Lightning refuses when the ``Trainer`` is built
(``callbacks/_cli_trainer.py``, through ``ScaleVecCLI.instantiate_trainer``) is one line naming the key, the value,
what is accepted and the fix (exit 2), in place of Lightning's sentence or, for ``trainer.devices``, a ``TypeError``
reported as a bug (exit 1). In process; nothing outside the run's output changes (``helpers.check``)."""
from __future__ import annotations

import pytest

import scalevec_lit.train_cli  # noqa: F401 - Lightning imported before capfd captures (see test_bad_input.py)
from helpers import check, fit

CASES = [
    ("--trainer.strategy=dpp", "error: trainer.strategy: dpp: not a strategy Lightning knows; did you mean 'ddp'? give "
     "a name of its registry (auto, ddp, ddp_spawn, fsdp, deepspeed, single_device, … 27 in all) or a class: "
     "class_path: lightning.pytorch.strategies.ModelParallelStrategy (FSDP2, as the GPU recipes), e.g. "
     "--trainer.strategy=auto"),
    ("--trainer.accelerator=cpus", "error: trainer.accelerator: cpus: not one of auto, cpu, cuda, gpu, mps, tpu; did "
     "you mean 'cpu'? e.g. --trainer.accelerator=cpu"),
    ("--trainer.devices=two", "error: trainer.devices: two: not a device count the cpu accelerator takes; give a "
     "number of processes ≥ 1 or auto (the cpu accelerator takes neither -1 nor a list), e.g. --trainer.devices=1"),
    ("--trainer.num_nodes=0", "error: trainer.num_nodes: 0: must be at least 1; e.g. --trainer.num_nodes=1"),
    ("--trainer.strategy=fsdp", "error: trainer.strategy: fsdp: needs a GPU accelerator, and trainer.accelerator is "
     "cpu; run it on GPUs with --trainer.accelerator=gpu, or on this machine use --trainer.strategy=auto (or ddp)"),
]


@pytest.mark.parametrize("option, line", CASES, ids=[c[0] for c in CASES])
def test_a_trainer_value_lightning_refuses_is_one_line(world, capfd, option, line):
    text = check(world, capfd, fit(world, option), 2, line)
    assert [t for t in text.splitlines() if t.startswith("error: ")] == [line]
