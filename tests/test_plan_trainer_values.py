"""``fit --print_plan`` builds no Trainer, yet refuses a ``trainer.strategy``, ``trainer.accelerator``,
``trainer.devices`` or ``trainer.num_nodes`` value that the fit refuses on any machine, with the fit's own line
(``callbacks/_cli_trainer.refused_value``; the fit's lines: tests/test_trainer_values.py), exit 2, no plan printed.
What only the machine decides (a GPU recipe planned on a machine without one) is left to the fit. In process."""
from __future__ import annotations

import pytest

import scalevec_lit.train_cli  # noqa: F401 - Lightning imported before capfd captures (see test_bad_input.py)
from helpers import ROOT, main_in_process
from test_trainer_values import CASES

PLAN = ["fit", "--config", str(ROOT / "recipes/smoke.yaml"), "--print_plan", "--plan_devices=1"]


@pytest.mark.parametrize("option, line", CASES, ids=[c[0] for c in CASES])
def test_the_plan_refuses_what_the_fit_refuses(capfd, option, line):
    code, text = main_in_process(capfd, [*PLAN, option])
    assert (code, [t for t in text.splitlines() if t.startswith("error: ")]) == (2, [line]), text
    assert "plan:" not in text


def test_gpu_values_still_plan_on_a_machine_without_a_gpu(capfd):
    code, text = main_in_process(capfd, [*PLAN, "--trainer.accelerator=gpu", "--trainer.devices=[0, 1]",
                                         "--trainer.strategy=fsdp", "--trainer.num_nodes=2"])
    assert code == 0, text
    assert "plan: " in text and "error:" not in text


def _line(**trainer):
    from scalevec_lit.callbacks._cli_trainer import refused_value

    return refused_value(trainer)


DEVICES = "not a device count the {} accelerator takes; give a number"


@pytest.mark.parametrize("trainer, start", [
    ({"accelerator": "cpu", "devices": 0}, "trainer.devices: 0: " + DEVICES.format("cpu")),
    ({"accelerator": "cpu", "devices": -1}, "trainer.devices: -1: " + DEVICES.format("cpu")),
    ({"accelerator": "cpu", "devices": [0, 1]}, "trainer.devices: [0, 1]: " + DEVICES.format("cpu")),
    ({"accelerator": "gpu", "devices": "0,-2"}, "trainer.devices: 0,-2: " + DEVICES.format("gpu")),
    ({"accelerator": "auto", "devices": "two"}, "trainer.devices: two: " + DEVICES.format("auto")),
    ({"accelerator": "cuda", "devices": []}, "trainer.devices: []: " + DEVICES.format("cuda")),
    ({"accelerator": "gpu", "devices": [1, 1]}, "trainer.devices: [1, 1]: " + DEVICES.format("gpu")),
    ({"accelerator": "gpu", "devices": -2}, "trainer.devices: -2: " + DEVICES.format("gpu")),
    ({"accelerator": "tpu", "strategy": "FSDP_cpu_offload"}, "trainer.strategy: fsdp: needs a GPU accelerator, and "
     "trainer.accelerator is tpu"),
    ({"num_nodes": -3, "devices": "zero"}, "trainer.num_nodes: -3: must be at least 1"),  # Lightning's order
    ({"strategy": "nope", "accelerator": "nope"}, "trainer.strategy: nope: not a strategy Lightning knows"),
])
def test_refused_values(trainer, start):
    assert (_line(**trainer) or "").startswith(start)


@pytest.mark.parametrize("accelerator, offered, not_offered", [
    ("cpu", "neither -1 nor a list", "-1 for all"), ("gpu", "-1 for all, or a list of indices", "neither")])
def test_the_devices_line_offers_only_what_the_accelerator_takes(accelerator, offered, not_offered):
    line = _line(accelerator=accelerator, devices="two")
    assert offered in line and not_offered not in line, line


@pytest.mark.parametrize("trainer", [
    {"accelerator": "gpu", "devices": "0,1"}, {"accelerator": "cuda", "devices": [2, 3]}, {"devices": -1},
    {"accelerator": "cpu", "devices": "4"}, {"accelerator": "cpu", "devices": "auto"}, {"devices": None},
    {"strategy": "fsdp"}, {"strategy": "FSDP", "accelerator": "cuda"}, {"strategy": "ddp", "accelerator": "cpu"},
    {"strategy": {"class_path": "lightning.pytorch.strategies.ModelParallelStrategy"}, "accelerator": "cpu"},
    {"accelerator": "mps", "num_nodes": 1, "devices": 1},
])
def test_accepted_values(trainer):
    assert _line(**trainer) is None
