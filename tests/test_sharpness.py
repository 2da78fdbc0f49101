"""SharpnessMonitor (issue 27): its eigenvalues against the dense Hessian's, its preconditioned sharpness
against a direct computation from the optimizer's state, its thresholds, its subsets, its tags at the right
steps from YAML, and its schedule and held-out batch across a resume.

Tolerances: the models are float64 and Lanczos runs with ``tol=1e-10``; for a symmetric matrix a Ritz value
θ with residual ``‖H y − θ y‖ = |β s| ≤ tol |θ|`` is within ``tol |θ|`` of an eigenvalue, and Lanczos finds
the extreme ones first, so each of the top three is within 1e-10 relative plus float64 rounding of
``eigvalsh``'s: bound 1e-9.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers import flat_objective, hessian_model, main_in_process, scalars, smoke_args
from scalevec_lit.callbacks import SharpnessMonitor
from scalevec_lit.lit.optim import MuonAdamW, build_param_groups
from scalevec_lit.scale import scale_parameters
from scalevec_lit.scale.ops import higher_order

pytestmark = pytest.mark.usefixtures("one_thread")


def micro(preset: str = "unified", moe: bool = False):
    model = hessian_model(preset, moe, 1, experts=(2, 1, 4), vocab_size=8, n_embd=8, intermediate_size=8)
    return model, torch.randint(0, 8, (2, 5))


def dense_hessian(model, idx) -> torch.Tensor:
    f, theta = flat_objective(model, idx)
    with higher_order():
        return torch.autograd.functional.hessian(f, theta, vectorize=True)


def positions(model, params) -> torch.Tensor:
    """Indices of ``params`` in the flattened parameter vector of ``flat_loss``."""
    ids, out, start = {id(p) for p in params}, [], 0
    for p in model.parameters():
        if p.requires_grad:
            if id(p) in ids:
                out.append(torch.arange(start, start + p.numel()))
            start += p.numel()
    return torch.cat(out)


def close(a: float, b: float, bound: float = 1e-9) -> bool:
    return abs(a - b) <= bound * abs(b)


@pytest.mark.parametrize("preset, moe", [("unified", False), ("hg", True)], ids=["unified-dense", "hg-moe"])
def test_top_eigenvalues_equal_eigvalsh_of_the_dense_hessian(preset, moe):
    model, idx = micro(preset, moe)
    H = dense_hessian(model, idx)
    H = (H + H.T) / 2  # (the MoE router's float32 logits leave an asymmetry of about 2^-24)
    monitor = SharpnessMonitor(top_k=3, iterations=80, tol=1e-10, params=["all", "scales:input"])
    out = monitor.measure(model, idx, optimizer=None)
    top = torch.linalg.eigvalsh(H).flip(0)[:3].tolist()
    bound = 1e-9 if not moe else 1e-6  # MoE: compared with the symmetrized matrix
    for name, value in zip(("lambda_max", "lambda_2", "lambda_3"), top):
        assert close(out[f"sharpness/{name}"], value, bound), (name, out[f"sharpness/{name}"], value)
    sub = positions(model, [sp.param for sp in scale_parameters(model) if sp.info.role == "input"])
    sub_top = torch.linalg.eigvalsh(H[sub][:, sub]).flip(0)[:3].tolist()
    for name, value in zip(("lambda_max", "lambda_2", "lambda_3"), sub_top):
        assert close(out[f"sharpness/scales_input/{name}"], value, bound)
    assert "sharpness/threshold" not in out  # no optimizer, nothing to compare with


def adam_steps(model, idx, optimizer, steps: int = 3) -> None:
    from scalevec_lit.callbacks.sharpness import objective

    for _ in range(steps):
        optimizer.zero_grad()
        objective(model, idx).backward()
        optimizer.step()


def test_preconditioned_sharpness_equals_a_direct_computation_from_adams_state():
    model, idx = micro()
    groups = build_param_groups(model, {"scale": {"lr": 0.004}})  # two learning rates: η = 0.01 the largest
    opt = torch.optim.AdamW(groups, lr=0.01, betas=(0.8, 0.99), eps=1e-6)
    adam_steps(model, idx, opt)
    out = SharpnessMonitor(iterations=80, tol=1e-10).measure(model, idx, opt)
    # direct: P = (1 - β1^t) diag(sqrt(v / (1 - β2^t)) + eps), each group's η_g / η folded in, λ_max of D H D
    d = []
    for p in model.parameters():
        group = next(g for g in opt.param_groups if any(q is p for q in g["params"]))
        st = opt.state[p]
        v_hat = st["exp_avg_sq"] / (1 - 0.99 ** float(st["step"]))
        bias1 = 1 - 0.8 ** float(st["step"])
        d.append(((group["lr"] / 0.01) / (bias1 * (v_hat.sqrt() + 1e-6))).sqrt().flatten())
    d = torch.cat(d)
    direct = torch.linalg.eigvalsh(d[:, None] * dense_hessian(model, idx) * d[None, :])[-1].item()
    assert close(out["sharpness/precond_lambda_max"], direct)
    assert out["sharpness/threshold"] == (2 + 2 * 0.8) / ((1 - 0.8) * 0.01)
    assert out["sharpness/threshold_ratio"] == out["sharpness/precond_lambda_max"] / out["sharpness/threshold"]


def test_sgd_threshold_and_muon_says_once_that_it_has_none(recwarn):
    model, idx = micro()
    sgd = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    out = SharpnessMonitor(iterations=30).measure(model, idx, sgd)
    assert out["sharpness/threshold"] == (2 + 2 * 0.9) / 0.05
    assert "sharpness/precond_lambda_max" not in out  # one learning rate: P = I, the raw λ_max is compared
    assert out["sharpness/threshold_ratio"] == out["sharpness/lambda_max"] / out["sharpness/threshold"]

    muon = MuonAdamW(build_param_groups(model), lr=0.01, muon_lr=0.02)
    adam_steps(model, idx, muon, 1)
    monitor = SharpnessMonitor(iterations=30, params=["all", "scales"])
    for _ in range(2):
        out = monitor.measure(model, idx, muon)
    assert "sharpness/threshold" not in out and "sharpness/precond_lambda_max" not in out
    assert "sharpness/scales/precond_lambda_max" in out  # the scales are AdamW's in the hybrid
    said = [str(w.message) for w in recwarn if "Muon updates" in str(w.message)]
    assert said == ["SharpnessMonitor: params 'all': no preconditioned sharpness: Muon updates (part of) the subset: "
                    "its orthogonalized update has no diagonal preconditioner, so only the raw sharpness is logged"]


def test_arguments_are_checked():
    with pytest.raises(ValueError, match=r"SharpnessMonitor.params: 'scales:middle': is not a parameter subset; "
                                         r"use some of all, matrices, scales, scales:input, scales:output"):
        SharpnessMonitor(params=["scales:middle"])
    with pytest.raises(ValueError, match=r"SharpnessMonitor.iterations: 2: must be a whole number >= top_k \(3\); "
                                         r"set e.g. iterations: 20"):
        SharpnessMonitor(top_k=3, iterations=2)
    with pytest.raises(ValueError, match=r"SharpnessMonitor.every_n_steps: 0: must be a whole number >= 1; set e.g. "
                                         r"every_n_steps: 100"):
        SharpnessMonitor(every_n_steps=0)


def _config(tmp_path, every_ckpt: int, sharpness: bool = True, every: int = 2) -> str:
    cfg = tmp_path / f"sharpness_{sharpness}.yaml"
    cfg.write_text(
        "trainer:\n  callbacks:\n"
        "    - class_path: scalevec_lit.callbacks.SafeModelCheckpoint\n"
        f"      init_args: {{every_n_train_steps: {every_ckpt}, save_last: true, save_top_k: -1}}\n"
        "    - class_path: lightning.pytorch.callbacks.LearningRateMonitor\n"
        "    - class_path: scalevec_lit.callbacks.ScaleVectorMonitor\n"
        "      init_args: {every_n_steps: 2, histogram_every_n_steps: 0, heatmap: false, step_size: true}\n"
        + ("    - class_path: scalevec_lit.callbacks.SharpnessMonitor\n"
           f"      init_args: {{every_n_steps: {every}, top_k: 2, iterations: 4, batch_size: 2, params: [all, 'scales:input']}}\n"
           if sharpness else "")
    )
    return str(cfg)


def test_callback_from_yaml_logs_at_its_steps_and_resume_keeps_its_schedule(prepared_data, tmp_path, capfd, monkeypatch):
    """A MoE model with bias balancing (the forward has side effects), AdamW; the scale monitor beside it."""
    monkeypatch.chdir(tmp_path)
    small = ["--model.config.n_layer=1", "--model.config.n_embd=32", "--model.config.n_head=2",
             "--model.config.n_kv_head=1", "--model.config.seq_len=32", "--data.batch_size=2",
             '--model.config.moe={"num_experts": 4, "top_k": 2, "expert_intermediate_size": 32, '
             '"bias_balancing": true, "aux_loss_coef": 0.01, "z_loss_coef": 0.001}',
             "--trainer.val_check_interval=1000", "--trainer.limit_val_batches=1", "--trainer.log_every_n_steps=1"]
    code, out = main_in_process(capfd, smoke_args(prepared_data, tmp_path, 4, "--config", _config(tmp_path, 4), *small))
    assert code == 0, out[-3000:]
    assert "SharpnessMonitor:" not in out  # no moment at step 0 is expected, not warned about
    logs = scalars(tmp_path / "smoke" / "version_0")
    for tag in ("sharpness/lambda_max", "sharpness/lambda_2", "sharpness/loss", "sharpness/scales_input/lambda_max"):
        assert sorted(s for s, _ in logs[tag]) == [0, 2, 4], tag
    # AdamW has a second moment from the first step on: preconditioned values at 2 and 4, not at 0
    assert sorted(s for s, _ in logs["sharpness/precond_lambda_max"]) == [2, 4]
    lr = dict(logs["lr/matrix"])  # the learning rate of the next update, as the monitor reads it
    checked = [(step, value) for step, value in logs["sharpness/threshold"] if step in lr]  # lr: steps 0-3
    assert [step for step, _ in checked] == [2]
    for step, value in checked:
        assert value == pytest.approx((2 + 2 * 0.9) / ((1 - 0.9) * lr[step]), rel=1e-6)  # (logged as float32)

    # item 2 from the hooks: the measured column step at the logs after a step, the folded view at every log
    final = "scale/input/final/shared/final/precond/"
    assert sorted(s for s, _ in logs[final + "step_rel_mean"]) == [2, 4]
    assert sorted(s for s, _ in logs[final + "lr_gamma_sq_mean"]) == [0, 2, 4]
    # the measurements change nothing in training: the same run without the monitor has the same losses
    alone = tmp_path / "alone"
    alone.mkdir()
    code, out = main_in_process(capfd, smoke_args(prepared_data, alone, 4, "--config", _config(alone, 4, False), *small))
    assert code == 0, out[-3000:]
    assert scalars(alone / "smoke" / "version_0")["train/loss"] == logs["train/loss"]
    # the study report's figure: drawn from the runs that logged sharpness, nothing from the others
    from scalevec_lit.study.figures import plot_sharpness

    lines = plot_sharpness({"with": [tmp_path / "smoke" / "version_0"], "alone": [alone / "smoke"]}, tmp_path)
    assert lines[-2] == "![sharpness](sharpness.png)" and "of with at their best LR" in lines[0]
    assert (tmp_path / "sharpness.png").stat().st_size > 10_000
    assert plot_sharpness({"alone": [alone / "smoke"]}, alone) == [] and not (alone / "sharpness.png").exists()

    state = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=False)["callbacks"]
    (kept,) = [v for k, v in state.items() if k.startswith("SharpnessMonitor")]
    assert kept["last_step"] == 4 and kept["batch"].shape == (2, 33)

    # resumed with another every_n_steps (issue 32): its state is found, the batch kept, and one line says so
    code, out = main_in_process(capfd, smoke_args(prepared_data, tmp_path, 6, "--config", _config(tmp_path, 4, every=3),
                                                  *small, "--ckpt_path=last"))
    assert code == 0, out[-3000:]
    assert ("warning: SharpnessMonitor: resumed with other arguments (every_n_steps 2 → 3): keeps its last measured "
            "step (step 4) and the saved held-out batch (2 rows); the new arguments apply from its next measurement"
            in out.splitlines())
    resumed = scalars(tmp_path / "smoke" / "version_1")
    assert sorted(s for s, _ in resumed["sharpness/lambda_max"]) == [6]  # not 4 again, and not 5


# -- issue 27 item 2: the effective step of the merged consumer columns (ScaleVectorMonitor) -----------------
@pytest.mark.parametrize("preset", ["hg", "unified"])
def test_column_step_figures_equal_a_direct_computation(preset):
    from scalevec_lit.callbacks import ScaleVectorMonitor
    from scalevec_lit.callbacks.sharpness import objective
    from scalevec_lit.scale.sites import scale_tag

    model, idx = micro(preset)
    opt = torch.optim.AdamW(build_param_groups(model, {"scale": {"lr": 0.004}}), lr=0.01)
    adam_steps(model, idx, opt, 1)
    monitor = ScaleVectorMonitor(heatmap=False, histogram_every_n_steps=0, step_size=True)
    vectors = {id(sp.vector): sp for sp in scale_parameters(model) if sp.info.role == "input" and sp.consumers}

    def merged_columns(sp) -> torch.Tensor:
        """[n, rest]: row j = every consumer's slice j times γ_j (a head-shaped γ: slice i is channel i mod n)."""
        gamma = sp.vector().detach().double()
        rows = []
        for c in sp.consumers:
            w = c.weight.detach().double().movedim(c.axis, 0)
            w = w.reshape(w.shape[0], -1)
            w = w.reshape(-1, gamma.numel(), w.shape[1]).transpose(0, 1).reshape(gamma.numel(), -1)
            rows.append(w * gamma[:, None])
        return torch.cat(rows, 1)

    before = {vid: merged_columns(sp) for vid, sp in vectors.items()}
    kept = monitor.snapshot(model)
    opt.zero_grad()
    objective(model, idx).backward()
    opt.step()
    lrs = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    logged = monitor.collect(model, lrs=lrs, before=kept).scalars
    assert len(vectors) >= 4
    for vid, sp in vectors.items():
        after = merged_columns(sp)
        ratio = (after - before[vid]).norm(dim=1) / before[vid].norm(dim=1)
        tag = lambda name: scale_tag(dataclasses.replace(sp.info, part="precond"), name)  # noqa: E731
        assert close(logged[tag("step_rel_mean")], ratio.mean().item(), 1e-12)
        assert close(logged[tag("step_rel_max")], ratio.max().item(), 1e-12)
        g2 = sp.vector().detach().double().square()
        assert close(logged[tag("lr_gamma_sq_mean")], 0.01 * g2.mean().item(), 1e-15)  # consumers: matrices, η = 0.01
        assert close(logged[tag("lr_gamma_sq_min")], 0.01 * g2.min().item(), 1e-15)
    # without the step before, no measured step (and nothing kept)
    assert not any(k.endswith("step_rel_mean") for k in monitor.collect(model, lrs=lrs).scalars)


def test_fsdp_is_refused_at_setup_with_the_fix():
    from types import SimpleNamespace

    from scalevec_lit.errors import UserError

    class ModelParallelStrategy:  # the name is what the monitor checks (FSDP2 in Lightning)
        pass

    with pytest.raises(UserError, match=r"trainer.callbacks: SharpnessMonitor: trainer.strategy ModelParallelStrategy: "
                                        r"Hessian-vector products need .*; measure sharpness on a single device or "
                                        r"with DDP"):
        SharpnessMonitor().setup(SimpleNamespace(strategy=ModelParallelStrategy()), None, "fit")


def test_checkpointed_and_compiled_blocks_give_the_same_eigenvalues():
    """Activation checkpointing recomputes inside the twice-differentiated graph; compiled blocks run eager
    during a measurement (a compiled graph has no second derivative): both the very same numbers."""
    import copy

    from scalevec_lit.lit.parallel import ParallelOptions, parallelize

    model, idx = micro("unified", True)
    ref = SharpnessMonitor(iterations=40, tol=1e-10).measure(model, idx, None)["sharpness/lambda_max"]
    for options, compile in ((ParallelOptions(activation_checkpointing=True), False), (ParallelOptions(), True)):
        other = copy.deepcopy(model)
        parallelize(other, None, options, compile=compile)
        assert SharpnessMonitor(iterations=40, tol=1e-10).measure(other, idx, None)["sharpness/lambda_max"] == ref
