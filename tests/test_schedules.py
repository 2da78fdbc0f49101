"""Learning-rate schedules: values at known steps, validation errors, and the LambdaLR wiring."""
from __future__ import annotations

import math

import pytest
import torch

from scalevec_lit.lit.schedules import WSD, Constant, WarmupCosine


def test_constant_warmup_is_linear_from_one_step_then_flat():
    s = Constant(warmup_steps=4)
    assert [s(i) for i in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    assert Constant()(0) == 1.0  # no warmup: the base lr from the first step


def test_warmup_cosine_values_at_known_steps():
    s = WarmupCosine(warmup_steps=10, min_lr_ratio=0.1, max_steps=110)
    assert s(0) == pytest.approx(0.1)
    assert s(9) == 1.0
    assert s(10) == 1.0  # cosine starts at its top
    assert s(60) == pytest.approx(0.55)  # half way: min + (1 - min) / 2
    assert s(35) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)))
    assert s(110) == pytest.approx(0.1)
    assert s(500) == pytest.approx(0.1)  # held at the floor after max_steps
    values = [s(i) for i in range(10, 111)]
    assert all(a >= b for a, b in zip(values, values[1:]))


@pytest.mark.parametrize(
    "shape, at90",
    [("linear", 0.5), ("cosine", 0.5), ("1-sqrt", 1 - math.sqrt(0.5))],
)
def test_wsd_plateau_then_decay_shape(shape, at90):
    s = WSD(warmup_steps=10, decay_fraction=0.2, decay_shape=shape, min_lr_ratio=0.0, max_steps=100)
    assert s.decay_steps() == 20
    assert s(4) == 0.5
    assert s(10) == 1.0 and s(79) == 1.0 and s(80) == 1.0  # stable until the decay starts at step 80
    assert s(90) == pytest.approx(at90)
    assert s(85) == pytest.approx({"linear": 0.75, "cosine": 0.5 * (1 + math.cos(math.pi / 4)),
                                   "1-sqrt": 1 - math.sqrt(0.25)}[shape])
    assert s(100) == pytest.approx(0.0)
    assert s(200) == pytest.approx(0.0)


def test_wsd_floor_and_rounding_half_up():
    s = WSD(warmup_steps=0, decay_fraction=0.2, decay_shape="linear", min_lr_ratio=0.1, max_steps=100)
    assert s(90) == pytest.approx(0.55)
    assert s(100) == pytest.approx(0.1)
    # 0.25 * 10 = 2.5 decay steps: rounded half up (Python's round() would give 2)
    assert WSD(warmup_steps=0, decay_fraction=0.25, max_steps=10).decay_steps() == 3
    assert WSD(warmup_steps=0, decay_fraction=0.0, max_steps=10)(9) == 1.0  # no decay phase at all


def test_max_steps_follows_each_fit_unless_fixed():
    s = WarmupCosine(warmup_steps=0, min_lr_ratio=0.0)
    s.with_max_steps(100)
    assert s(50) == pytest.approx(0.5)
    s.with_max_steps(200)  # a second fit with another length: the schedule follows it
    assert s.max_steps == 200 and s(100) == pytest.approx(0.5)
    fixed = WarmupCosine(warmup_steps=0, min_lr_ratio=0.0, max_steps=100)
    fixed.with_max_steps(200)  # the user's max_steps wins over the trainer's
    assert fixed.max_steps == 100
    assert "_max_steps_fixed" not in repr(fixed) and "max_steps=100" in repr(fixed)


def test_errors_name_key_value_and_fix():
    with pytest.raises(ValueError, match=r"model.schedule.max_steps: None; WarmupCosine needs .* set max_steps"):
        WarmupCosine(warmup_steps=2)(5)
    with pytest.raises(ValueError, match=r"model.schedule.decay_fraction: 0.9 starts the decay at step 10, before "
                                         r"warmup_steps=20 ends .*lower decay_fraction or warmup_steps"):
        WSD(warmup_steps=20, decay_fraction=0.9, max_steps=100)
    with pytest.raises(ValueError, match=r"model.schedule.decay_shape: 'exp' is not one of linear, cosine, 1-sqrt"):
        WSD(decay_shape="exp")
    with pytest.raises(ValueError, match=r"model.schedule.min_lr_ratio: 1.5 must be in \[0, 1\]"):
        WarmupCosine(min_lr_ratio=1.5)
    with pytest.raises(ValueError, match=r"model.schedule.warmup_steps: -1 must be >= 0"):
        Constant(warmup_steps=-1)


def test_warmup_longer_than_the_run_is_clipped_with_a_notice(capsys):
    s = WarmupCosine(warmup_steps=10).with_max_steps(5)
    assert s.warmup_steps == 5 and [s(i) for i in range(5)] == [0.2, 0.4, 0.6, 0.8, 1.0]
    assert capsys.readouterr().err.count("\n") == 1  # one line
    s.with_max_steps(100)  # a later, longer fit warms up as the recipe asked
    assert s.warmup_steps == 10
    w = WSD(warmup_steps=30, decay_fraction=0.2, decay_shape="linear").with_max_steps(5)
    assert w.warmup_steps == 4 and w.decay_steps() == 1 and w(4) == 1.0 and w(5) == 0.0
    err = capsys.readouterr().err
    assert "note: model.schedule.warmup_steps: 30 is longer than this run (5 steps); warming up over 4" in err


def test_lambda_lr_applies_the_schedule_to_every_group():
    s = WSD(warmup_steps=2, decay_fraction=0.5, decay_shape="linear", max_steps=8)
    p, q = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [p], "lr": 0.1}, {"params": [q], "lr": 0.02}])
    sched = torch.optim.lr_scheduler.LambdaLR(opt, s)
    seen = []
    for step in range(8):
        seen.append([g["lr"] for g in opt.param_groups])
        opt.step()
        sched.step()
    assert seen == [[0.1 * s(k), 0.02 * s(k)] for k in range(8)]
    assert [round(v[0] / 0.1, 6) for v in seen] == [0.5, 1.0, 1.0, 1.0, 1.0, 0.75, 0.5, 0.25]
