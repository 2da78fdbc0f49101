"""An optimizer argument torch refuses (a negative ``weight_decay``: ``Invalid weight_decay value: -0.1``) is
reported in our words: the key, the value, what it would do, the fix (the command line: test_exit_codes.py)."""
from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from scalevec_lit.errors import UserError
from scalevec_lit.lit.optim import MuonAdamW, build_param_groups, instantiate_optimizer


def _groups():
    return build_param_groups(nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4)))


@pytest.mark.parametrize("value, problem", [
    (-0.1, "-0.1: a negative weight decay makes the optimizer grow every decayed weight at every step (away from 0 "
           "instead of towards it); set a value >= 0 (0 turns decay off), e.g. "
           "--model.optimizer.init_args.weight_decay=0.1"),
    (float("nan"), "nan: is not a finite number; set a number >= 0 (0 turns decay off), e.g. "
                   "--model.optimizer.init_args.weight_decay=0.1"),
])
def test_a_negative_or_nan_weight_decay_gets_our_message(value, problem):
    with pytest.raises(UserError) as err:
        instantiate_optimizer(functools.partial(torch.optim.AdamW, weight_decay=value), _groups())
    assert str(err.value) == "model.optimizer.init_args.weight_decay: " + problem


def test_other_refused_arguments_name_their_key():
    with pytest.raises(UserError) as err:
        instantiate_optimizer(functools.partial(torch.optim.AdamW, eps=-1.0), _groups())
    assert str(err.value).startswith("model.optimizer.init_args.eps: -1.0: is outside the range the optimizer accepts")
    with pytest.raises(ValueError, match="^something else$"):  # anything else is not reworded
        instantiate_optimizer(lambda groups: (_ for _ in ()).throw(ValueError("something else")), _groups())


@pytest.mark.parametrize("key", ["weight_decay", "muon_weight_decay"])
def test_muon_adamw_refuses_a_negative_decay_of_either_optimizer(key):
    with pytest.raises(UserError) as err:
        MuonAdamW(_groups(), **{key: -0.01})
    assert str(err.value).startswith(f"model.optimizer.init_args.{key}: -0.01: a negative weight decay makes "
                                     "MuonAdamW grow every decayed weight")
