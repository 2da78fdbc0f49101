"""Parameter groups by kind and the Muon + AdamW hybrid: routing, exact equivalence with the two torch
optimizers, LambdaLR, state_dict round trip, the groups table, and a short Muon smoke run."""
from __future__ import annotations

import copy
import re
from functools import partial

import pytest
import torch
from torch import nn

from helpers import ROOT, run_cli, smoke_args, tiny_config
from scalevec_lit.lit.optim import MuonAdamW, build_param_groups, describe_groups, instantiate_optimizer
from scalevec_lit.model.transformer import Transformer



pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def _model() -> Transformer:
    return Transformer(tiny_config(vocab_size=128))


def _fake_grads(model: nn.Module, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for p in model.parameters():
        p.grad = torch.randn(p.shape, generator=g)


def _hybrid(model: nn.Module, **kw) -> MuonAdamW:
    return instantiate_optimizer(partial(MuonAdamW, lr=1e-2, muon_lr=0.05, weight_decay=0.1, **kw),
                                 build_param_groups(model))


def test_groups_are_routed_by_kind_with_their_own_lr_and_decay():
    opt = _hybrid(_model(), muon_weight_decay=0.01)
    rows = {g["name"]: (name, g["lr"], g["weight_decay"]) for name, g in opt.all_param_groups()}
    assert rows == {
        "matrix": ("Muon", 0.05, 0.01),
        "embedding": ("AdamW", 1e-2, 0.0),
        "head": ("AdamW", 1e-2, 0.1),
        "scale": ("AdamW", 1e-2, 0.0),
    }
    table = describe_groups(opt).splitlines()
    assert re.match(r"matrix\s+Muon\s+\d+", table[1]) and re.match(r"scale\s+AdamW\s+5\s", table[4])


def test_hybrid_equals_muon_and_adamw_run_separately():
    a, b = _model(), _model()
    b.load_state_dict(a.state_dict())
    hybrid = _hybrid(a)
    groups_b = build_param_groups(b)
    muon = torch.optim.Muon([g["params"] for g in groups_b if g["kind"] == "matrix"][0], lr=0.05, weight_decay=0.1)
    adamw = torch.optim.AdamW(
        [{"params": g["params"], "weight_decay": g.get("weight_decay", 0.1)} for g in groups_b if g["kind"] != "matrix"],
        lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
    )
    for step in range(3):
        _fake_grads(a, step)
        _fake_grads(b, step)
        hybrid.step()
        muon.step()
        adamw.step()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name


def test_lambda_lr_schedules_both_parts():
    model = _model()
    before = copy.deepcopy(model.state_dict())
    opt = _hybrid(model)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.0 if step == 0 else 0.5)
    _fake_grads(model, 0)
    opt.step()  # lr 0 for every group: no update and no decay anywhere
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    sched.step()
    assert [g["lr"] for g in opt.param_groups] == [0.025, 0.005, 0.005, 0.005]
    assert opt._muon.param_groups[0]["lr"] == 0.025  # the inner optimizers read the same groups


def test_state_dict_round_trip_continues_identically():
    a = _model()
    opt_a = _hybrid(a)
    for step in range(2):
        _fake_grads(a, step)
        opt_a.step()
    b = copy.deepcopy(a)
    opt_b = _hybrid(b)
    state = copy.deepcopy(opt_a.state_dict())
    opt_b.load_state_dict(state)
    kinds = {g["name"]: g for g in state["param_groups"]}
    first_matrix, first_scale = kinds["matrix"]["params"][0], kinds["scale"]["params"][0]
    assert set(state["state"][first_matrix]) == {"momentum_buffer"}
    assert {"exp_avg", "exp_avg_sq", "step"} <= set(state["state"][first_scale])
    _fake_grads(a, 7)
    _fake_grads(b, 7)
    opt_a.step()
    opt_b.step()
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), name


def test_non_matrix_tensors_of_a_muon_kind_go_to_adamw():
    class Experts(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 3, 5))  # stacked experts: 3-D
            self.proj = nn.Linear(5, 3, bias=False)

    opt = MuonAdamW(build_param_groups(Experts()), lr=1e-3, weight_decay=0.1, muon_weight_decay=0.02)
    assert [(n, g["name"], len(g["params"])) for n, g in opt.all_param_groups()] == [
        ("AdamW", "matrix_nd", 1), ("Muon", "matrix", 1)
    ]
    # the split-off tensors keep their kind's decay (Muon's λ) at AdamW's step size
    assert [(g["lr"], g["weight_decay"]) for g in opt.param_groups] == [(1e-3, 0.02), (0.02, 0.02)]


def test_bare_tensors_are_refused_with_the_fix():
    with pytest.raises(TypeError, match=r"model.optimizer: MuonAdamW needs parameter groups with a 'kind' key"):
        MuonAdamW(_model().parameters())


def test_build_param_groups_errors_unchanged():
    with pytest.raises(ValueError, match=r"model.param_groups: \['matrx'\] are not parameter kinds"):
        build_param_groups(_model(), {"matrx": {}})
    with pytest.raises(ValueError, match=r"model.param_groups.scale.weight_decay: scale vectors are decayed by role"):
        build_param_groups(_model(), {"scale": {"weight_decay": 0.1}})


def _losses(root):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = list(root.rglob("events.out.tfevents.*"))
    acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
    acc.Reload()
    return [e.value for e in acc.Scalars("train/loss")]


@pytest.mark.slow
def test_muon_trains_the_smoke_recipe(prepared_data, tmp_path):
    # the smoke recipe made smaller (2 layers, width 64, batch 8) so that 40 Muon steps take seconds on a CPU
    args = smoke_args(prepared_data, tmp_path, 40, "--config", str(ROOT / "recipes" / "optim" / "muon_wsd.yaml"),
                      "--data.batch_size=8", "--trainer.val_check_interval=40", "--model.config.n_layer=2",
                      "--model.config.n_embd=64")
    proc = run_cli(args, cwd=tmp_path, env={"OMP_NUM_THREADS": "1"})  # one thread: robust on a shared 2-core CPU
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = proc.stdout + proc.stderr
    assert re.search(r"matrix\s+Muon\s+\d+", out) and re.search(r"embedding\s+AdamW", out)
    losses = _losses(tmp_path)
    assert len(losses) == 4  # logged every 10 steps
    assert losses[-1] < losses[0] - 0.5, losses  # about 7.2 -> 5.8 in practice
