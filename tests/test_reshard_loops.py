"""``lit/reshard.py`` on checkpoint dicts (no processes): Lightning's micro-batch counters follow the new
accumulation, and every checkpoint that cannot resume on another world size is refused with one line; a one-file optimizer state keyed by name
(the runs themselves: ``tests/test_reshard_resume.py``)."""
from __future__ import annotations

import copy

import pytest

from scalevec_lit.errors import UserError
from scalevec_lit.lit.reshard import KEY, optimizer_state_by_name, reshard_loops, world_record


def _checkpoint(world: int, accumulate: int, micro: int, steps: int, dataset: dict | None = None) -> dict:
    ready = steps * accumulate
    progress = {"total": {"ready": ready + 10, "completed": ready + 9, "started": ready + 10, "processed": ready + 10},
                "current": {"ready": ready, "completed": ready - 1, "started": ready, "processed": ready},
                "is_last_batch": False}  # as Lightning saves it inside the step's last on_train_batch_end
    sample = ready * micro * world
    loader = {"dataset": dataset if dataset is not None else {"input_dir_path": "/d/train", "world_size": world,
                                                                "batch_size": micro, "sample_in_epoch": sample}}
    ckpt = {"loops": {"fit_loop": {"epoch_loop.batch_progress": progress,
                                   "state_dict": {"combined_loader": [loader]}}}}
    ckpt[KEY] = world_record(world_size=world, accumulate=accumulate, micro_batch=micro, loops=ckpt["loops"])
    return ckpt


def test_the_counters_follow_the_new_accumulation_and_the_position_stays_global():
    ckpt = _checkpoint(world=4, accumulate=1, micro=2, steps=3)
    assert ckpt[KEY] == {"world_size": 4, "accumulate": 1, "micro_batch": 2, "sequences_per_step": 8, "sequences": 24}
    line = reshard_loops(ckpt, world_size=1, accumulate=4, micro_batch=2)
    progress = ckpt["loops"]["fit_loop"]["epoch_loop.batch_progress"]
    assert progress["current"] == {"ready": 12, "completed": 11, "started": 12, "processed": 12}
    assert progress["total"] == {"ready": 22, "completed": 21, "started": 22, "processed": 22}  # earlier epochs kept
    assert line == ("resuming a checkpoint of 4 process(es) on 1: the same global batch of 8 sequences, 4 accumulation "
                    "step(s) per rank (were 1); data position: 24 sequences read in this epoch, the rest dealt out "
                    "over 1 rank(s)")
    same = _checkpoint(world=2, accumulate=2, micro=2, steps=3)
    before = copy.deepcopy(same)
    assert reshard_loops(same, world_size=2, accumulate=2, micro_batch=2) is None and same == before
    other = _checkpoint(world=2, accumulate=2, micro=2, steps=3)
    assert "the global batch changes from 8 to 4 sequences (set global_batch_tokens or global_batch_size to keep it)" \
        in reshard_loops(other, world_size=1, accumulate=2, micro_batch=2)


@pytest.mark.parametrize("case,match", [
    ("micro", r"data.batch_size: 4: differs from the 2 this checkpoint was written with.*--data.batch_size=2"),
    ("mixed", r"data.data_dir: \(several folders\): a mixed data set resumes only on the number of processes that "
              r"wrote the checkpoint \(2;.*--trainer.devices=2"),
    ("window", r"--ckpt_path: \(this checkpoint\): was written in the middle of an accumulation window \(micro-batch 7 "
               r"of 2 per step\)"),
    ("legacy", r"--ckpt_path: \(this checkpoint\): was written by 2 processes before checkpoints recorded their global "
               r"batch, so it cannot resume on 1; resume it on 2 processes \(--trainer.devices=2\)"),
    ("position", r"records 24 sequences read in this epoch but its data loader 20"),
])
def test_a_checkpoint_that_cannot_resume_on_another_world_size_is_refused_with_the_fix(case, match):
    ckpt = _checkpoint(world=2, accumulate=2, micro=2, steps=3)
    micro = 2
    if case == "micro":
        micro = 4
    elif case == "mixed":
        ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["dataset"] = {"a": {}, "b": {}}
    elif case == "window":
        ckpt["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["ready"] = 7
    elif case == "legacy":
        del ckpt[KEY]
    elif case == "position":
        ckpt["loops"]["fit_loop"]["state_dict"]["combined_loader"][0]["dataset"]["sample_in_epoch"] = 20
    with pytest.raises(UserError, match=match) as err:
        reshard_loops(ckpt, world_size=1, accumulate=4, micro_batch=micro)
    assert err.value.exit_code == 2


def test_a_one_file_optimizer_state_is_keyed_by_name_in_the_optimizer_s_own_group_order():
    import torch

    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    # groups in another order than named_parameters (as the library groups by role): biases first
    opt = torch.optim.AdamW([{"params": [model[0].bias, model[1].bias]}, {"params": [model[0].weight, model[1].weight]}])
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    saved = opt.state_dict()
    named = optimizer_state_by_name(saved, model, opt)
    assert [g["params"] for g in named["param_groups"]] == [["0.bias", "1.bias"], ["0.weight", "1.weight"]]
    for name, p in model.named_parameters():
        assert named["state"][name]["exp_avg"].shape == p.shape  # each moment with its own parameter
    assert optimizer_state_by_name(named, model, opt) is named  # already by name: unchanged
