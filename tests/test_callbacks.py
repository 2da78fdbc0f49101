"""ScaleVectorMonitor (event-file tags and values, consumers of each scale, FSDP2 reduction on 2 CPU processes,
drift against the conservation law) and the smoke recipe's default callbacks; RoleWeightDecay's own tests
are in ``tests/test_role_decay.py``."""
from __future__ import annotations

import copy
from functools import partial

import pytest
import torch
import torch.nn.functional as F

from callback_runs import UNIFIED, VOCAB, _fit, _lm
from helpers import ROOT, run_cli, smoke_args, spawn_gloo, tiny_config
from scalevec_lit.callbacks import RoleWeightDecay, ScaleVectorMonitor
from scalevec_lit.callbacks.scale_monitor import scale_consumers, tensor_statistics
from scalevec_lit.lit.module import CausalLM
from scalevec_lit.lit.optim import build_param_groups
from scalevec_lit.model.transformer import Transformer
from scalevec_lit.scale import MagnitudeDirectionScale, PlainScale
from scalevec_lit.scale.registry import scale_parameters
from scalevec_lit.scale.sites import ScaleInfo, ScaleSite
from scalevec_lit.scale.strategy import ScaleStrategy

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


# -- ScaleVectorMonitor ---------------------------------------------------------------------------------
def _balance(vector, weights):
    """The conserved quantity, written from the laws: per channel ‖w_j‖² − γ_j² for a plain γ; one number
    Σ_j ‖w_j‖² − β² for a magnitude-direction γ = β α / RMS(α)."""
    col = sum(w.detach().double().square().sum(0) for w in weights)
    if isinstance(vector, MagnitudeDirectionScale):
        return (col.sum() - vector.magnitude.detach().double().square().sum()).reshape(1)
    return col - vector().detach().double().square()


def _consumer_weights(model):
    """Independent of the registry: HG branch scales -> their projection, final -> head."""
    out = {}
    for i, block in enumerate(model.blocks):
        for sub, branches in ((block.attn, "qkv"), (block.mlp, ("gate", "up"))):
            for b in branches:
                out[id(sub.input.scales[b])] = [sub.input.proj[b].weight]
    out[id(model.final.scales["head"])] = [model.final.proj["head"].weight]
    return out


def test_monitor_event_files_hold_the_parameters_statistics(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    lm = _lm(UNIFIED, partial(torch.optim.AdamW, lr=0.02, weight_decay=0.1), cls=CausalLM)
    starts = {}

    from lightning.pytorch.callbacks import Callback

    class Snapshot(Callback):  # c_j of every input-role vector before any update
        def on_train_start(self, trainer, pl_module):
            weights = _consumer_weights(pl_module.model)
            for sp in scale_parameters(pl_module.model):
                if sp.info.role == "input":
                    starts[id(sp.vector)] = _balance(sp.vector, weights[id(sp.vector)])

    _fit(lm, [Snapshot(), ScaleVectorMonitor(every_n_steps=2, histogram_every_n_steps=4)], steps=4, root=tmp_path)
    (events,) = list(tmp_path.rglob("events.out.tfevents.*"))
    acc = EventAccumulator(str(events), size_guidance={"scalars": 0, "histograms": 0, "images": 0})
    acc.Reload()
    tags = {t for t in acc.Tags()["scalars"] if t.startswith("scale/")}

    model, weights = lm.model, _consumer_weights(lm.model)
    params = list(scale_parameters(model))
    expected, values = set(), {}
    for sp, row in zip(params, tensor_statistics([sp.param for sp in params]).tolist()):
        assert row == pytest.approx([sp.param.double().mean().item(), sp.param.double().std(unbiased=False).item(),
                                     sp.param.min().item(), sp.param.max().item()], rel=1e-12, abs=1e-12)
        for stat, v in zip(("mean", "std", "min", "max"), row):
            values[f"scale/{sp.info.tag}/{stat}"] = v
    vectors = {id(sp.vector): sp for sp in params}
    for vid, sp in vectors.items():
        base = f"scale/{sp.info.role}/{sp.info.site}/{sp.info.branch}/{sp.info.tag.split('/')[3]}"
        gamma = sp.vector().detach().double()
        for stat, v in zip(("mean", "std", "min", "max"),
                           (gamma.mean(), gamma.std(unbiased=False), gamma.min(), gamma.max())):
            values[f"{base}/gamma/{stat}"] = v.item()
        if sp.info.role == "input":
            drift = _balance(sp.vector, weights[vid]) - starts[vid]
            values[f"{base}/precond/min_gamma_sq"] = gamma.square().min().item()
            values[f"{base}/precond/drift_mean"] = drift.mean().item()
            values[f"{base}/precond/drift_absmax"] = drift.abs().max().item()
            values[f"{base}/precond/drift_rel"] = (drift.mean() / starts[vid].abs().mean()).item()
    expected = set(values)
    assert tags == expected
    assert len([t for t in tags if "/precond/" in t]) == 4 * 11  # 2 layers x (q,k,v,gate,up) + final head
    assert "scale/output/attn_proj/q/layer01/direction/std" in tags
    for tag, v in values.items():
        logged = acc.Scalars(tag)
        assert [e.step for e in logged] == [0, 2, 4], tag
        assert logged[-1].value == pytest.approx(v, rel=1e-5, abs=1e-6), tag
    assert any(abs(acc.Scalars(t)[-1].value) > 1e-4 for t in tags if t.endswith("drift_absmax"))  # it did move
    hist = acc.Tags()["histograms"]
    assert {f"scale/{sp.info.tag}" for sp in params} <= set(hist)
    assert [e.step for e in acc.Histograms(f"scale/{params[0].info.tag}")] == [0, 4]
    for role in ("input", "output"):
        images = acc.Images(f"scale/{role}/heatmap")
        assert [e.step for e in images] == [0, 2, 4] and images[0].width > 400 and images[0].height > 100


def test_consumers_are_found_from_the_sites_and_unknown_ones_are_skipped():
    model = Transformer(tiny_config(vocab_size=VOCAB),
                        ScaleStrategy(placement=dict(v="dual")))  # dual v: an input-role u on v's own rows
    found = scale_consumers(model)
    attn, mlp = model.blocks[0].attn, model.blocks[0].mlp
    assert [(c.name, c.axis) for c in found[id(attn.input.scales["shared"])]] == [("q", -1), ("k", -1), ("v", -1)]
    assert [c.weight for c in found[id(attn.input.scales["shared"])]] == [
        attn.input.proj["q"].weight, attn.input.proj["k"].weight, attn.input.proj["v"].weight]
    assert [c.weight for c in found[id(mlp.input.scales["shared"])]] == [mlp.input.proj["gate"].weight,
                                                                         mlp.input.proj["up"].weight]
    assert [c.weight for c in found[id(model.final.scales["shared"])]] == [model.final.proj["head"].weight]
    assert [(c.name, c.axis) for c in found[id(attn.input.proj["v"].out_scale)]] == [("v", -2)]

    class Odd(ScaleSite):  # a site that names no consumer for its vector
        def __init__(self):
            super().__init__()
            self.vec = PlainScale(64)

        def scale_vectors(self):
            yield ScaleInfo(0, "mlp_input", "shared", "input"), self.vec

    odd = Odd()
    with torch.no_grad():
        odd.vec.scale.mul_(0.5)
    assert scale_consumers(odd) == {}
    snap = ScaleVectorMonitor(heatmap=False).collect(odd)
    assert snap.scalars["scale/input/mlp_input/shared/layer00/precond/min_gamma_sq"] == 0.25
    assert not any("drift" in t for t in snap.scalars)


def test_monitor_arguments_are_checked():
    with pytest.raises(ValueError, match=r"ScaleVectorMonitor.every_n_steps: 0 must be >= 1"):
        ScaleVectorMonitor(every_n_steps=0)
    with pytest.raises(ValueError, match=r"ScaleVectorMonitor.histogram_every_n_steps: -1 must be >= 0 \(0 = off\)"):
        ScaleVectorMonitor(histogram_every_n_steps=-1)


def _fsdp_worker(rank: int, world: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    from scalevec_lit.lit.parallel import ParallelOptions, parallelize

    torch.manual_seed(0)
    model = Transformer(tiny_config(vocab_size=VOCAB, n_layer=2), ScaleStrategy(**UNIFIED))
    with torch.no_grad():  # non-trivial values (same on both ranks: same seed)
        for p in model.parameters():
            p.mul_(torch.empty_like(p).uniform_(0.5, 1.5))
    reference = copy.deepcopy(model)
    parallelize(model, init_device_mesh("cpu", (world,)), ParallelOptions())
    assert type(next(scale_parameters(model)).param).__name__ == "DTensor"
    got = ScaleVectorMonitor().collect(model, histograms=True)
    want = ScaleVectorMonitor().collect(reference, histograms=True)
    assert got.scalars.keys() == want.scalars.keys()
    for tag, v in want.scalars.items():
        if tag.endswith(("/min", "/max", "min_gamma_sq")):
            assert got.scalars[tag] == v, tag  # min and max reduce exactly
        else:
            assert got.scalars[tag] == pytest.approx(v, rel=1e-9, abs=1e-12), tag
    for tag, v in want.histograms.items():
        assert (got.histograms[tag] == v).all(), tag
    assert got.heatmaps["input"][1] == want.heatmaps["input"][1]
    # RoleWeightDecay on the local shards: the gathered result equals the unsharded reference
    opt = torch.optim.AdamW(build_param_groups(model), lr=0.1, weight_decay=0.2)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    decay = RoleWeightDecay()
    decay.build_plan(model, opt)
    decay.on_before_optimizer_step(None, model, opt)
    for sp, ref in zip(scale_parameters(model), scale_parameters(reference)):
        factor = (1 - 0.1 * 0.2) if sp.info.role == "input" else 1.0
        assert torch.equal(sp.param.full_tensor(), ref.param.detach() * factor), sp.info.tag


@pytest.mark.slow
def test_monitor_reduces_fsdp2_shards_like_the_whole_model():
    # fork (as DataLoader workers do, one thread each): the children reuse this process's imports
    spawn_gloo(_fsdp_worker, 2, start_method="fork")


@pytest.mark.slow
def test_smoke_recipe_runs_both_callbacks_by_default(prepared_data, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = smoke_args(prepared_data, tmp_path, 4, "--model.config.n_layer=2", "--model.config.n_embd=64",
                      "--data.batch_size=4", "--trainer.val_check_interval=4", "--trainer.limit_val_batches=1",
                      "--trainer.callbacks+=scalevec_lit.callbacks.ScaleVectorMonitor",
                      "--trainer.callbacks.every_n_steps=2")
    proc = run_cli(args, cwd=tmp_path, env={"OMP_NUM_THREADS": "1"})
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "RoleWeightDecay (preset iwd)" in out and "scale vectors are not decayed" not in out
    (events,) = list(tmp_path.rglob("events.out.tfevents.*"))
    acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
    acc.Reload()
    steps = {e.step for e in acc.Scalars("scale/input/attn_input/shared/layer00/scale/mean")}
    assert steps == {0, 2, 4}  # the recipe's monitor (every 50) and the one added with += (every 2)
    assert "scale/input/final/shared/final/precond/drift_mean" in acc.Tags()["scalars"]


@pytest.mark.parametrize("vector", [PlainScale, MagnitudeDirectionScale])
def test_monitor_drift_follows_the_conservation_law_of_the_model_itself(vector):
    """The library's own model, SGD without decay in float64 (close to gradient flow): the conserved
    quantity of each input-role vector drifts far less than the consumers' norms move (the drift is
    second order in the step size, the movement first order)."""
    torch.manual_seed(0)
    cfg = tiny_config(vocab_size=VOCAB, n_layer=2, n_embd=32, n_head=2, seq_len=16)
    model = Transformer(cfg, ScaleStrategy(vector=vector, branch_specific=True)).double()
    with torch.no_grad():  # γ away from 1 so that the weights and the scales both move
        for sp in scale_parameters(model):
            sp.param.mul_(1.0 + 0.3 * torch.rand_like(sp.param))
    monitor = ScaleVectorMonitor(heatmap=False)
    start = monitor.collect(model).scalars
    col_sq = {sp.info.tag: sum(c.weight.detach().double().square().sum(dim=[d for d in range(c.weight.ndim) if d != c.weight.ndim - 1])
                               for c in sp.consumers) for sp in scale_parameters(model) if sp.consumers}
    opt = torch.optim.SGD(model.parameters(), lr=0.01)  # drift/movement ≈ 0.002 (plain), 0.017 (β) here
    data = torch.randint(0, VOCAB, (8, 17), generator=torch.Generator().manual_seed(1))
    for _ in range(300):
        loss = F.cross_entropy(model(data[:, :-1]).flatten(0, 1), data[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    end = monitor.collect(model).scalars
    checked = set()
    for sp in scale_parameters(model):
        if not sp.consumers:
            continue
        moved = (sum(c.weight.detach().double().square().sum(dim=[d for d in range(c.weight.ndim) if d != c.weight.ndim - 1])
                     for c in sp.consumers) - col_sq[sp.info.tag]).abs()
        moved = moved.sum() if vector is MagnitudeDirectionScale else moved.max()
        base = sp.info.tag.rsplit("/", 1)[0]
        drift = end[f"scale/{base}/precond/drift_absmax"]
        assert start[f"scale/{base}/precond/drift_absmax"] == 0.0
        assert moved > 1e-5, (base, moved)  # the consumers really moved (float64 rounding: ~1e-16)...
        assert drift < 0.05 * moved, (base, drift, float(moved))  # ...the conserved quantity did not
        checked.add(base)
    assert len(checked) == 2 * 5 + 1  # q, k, v, gate, up per layer and the head


@pytest.mark.slow
def test_callbacks_load_from_a_plain_checkout_without_a_table(tmp_path):
    """``scalevec_lit.callbacks.X`` from the repository on PYTHONPATH alone (the editable install's finder
    removed): every name a module of ``callbacks/`` lists in ``__all__``, and nothing else."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "sys.meta_path[:] = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]\n"
        f"sys.path.insert(0, {str(ROOT)!r})\n"
        "import scalevec_lit.callbacks as c\n"
        "print(c.__file__)\n"
        "print(' '.join(dir(c)))\n"
        "print(c.RoleWeightDecay.__module__)\n"
        "try:\n    c.NoSuchCallback\nexcept AttributeError as e:\n    print('refused:', e)\n"
    )
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    path, names, module, refused = res.stdout.splitlines()
    assert path == str(ROOT / "callbacks" / "__init__.py")
    assert names.split() == ["DownstreamEval", "MoELoadMonitor", "RoleWeightDecay", "SafeCheckpointIO",
                             "SafeModelCheckpoint", "ScaleSnapshot", "ScaleVectorMonitor", "SharpnessMonitor"]
    assert module == "scalevec_lit.callbacks.role_decay"
    assert refused == "refused: module 'scalevec_lit.callbacks' has no attribute 'NoSuchCallback'"
