"""The study report's sharpness figure (``study/figures.plot_sharpness``) states the definitions the
``SharpnessMonitor`` measures with (``callbacks/_hessian.preconditioner``, docs/monitoring.md): Adam's
preconditioner with the first moment's bias correction, ``P = (1 − β₁ᵗ) diag(√v̂ + ε)`` (Cohen et al. 2022),
and the threshold ``(2 + 2β₁)/((1 − β₁)η)``."""
from __future__ import annotations

from helpers import ROOT


def test_the_caption_states_the_monitors_definitions(tmp_path):
    from torch.utils.tensorboard import SummaryWriter

    from scalevec_lit.study.figures import plot_sharpness

    run = tmp_path / "adamw" / "version_0"
    with SummaryWriter(str(run)) as writer:  # what a run with the monitor logs, at steps 0, 2 and 4
        for step, (raw, pre) in enumerate([(3.0, None), (5.0, 80.0), (9.0, 120.0)]):
            writer.add_scalar("sharpness/lambda_max", raw, 2 * step)
            if pre is not None:
                writer.add_scalar("sharpness/precond_lambda_max", pre, 2 * step)
                writer.add_scalar("sharpness/threshold_ratio", pre / 380.0, 2 * step)
    lines = plot_sharpness({"adamw": [run]}, tmp_path)
    assert lines[0] == (
        "Sharpness (`SharpnessMonitor`, held-out batch) of adamw at their best LR: left, λ_max of the loss Hessian "
        "H (solid) and, for Adam/AdamW, of P^{-1/2} H P^{-1/2} with P = (1 − β₁ᵗ) diag(√v̂ + ε), v̂ = v/(1 − β₂ᵗ), "
        "t its step count (dashed; Cohen et al. 2022); right, that over the stability threshold, "
        "(2 + 2β₁)/((1 − β₁)η) for Adam:")
    assert lines[1:] == ["", "![sharpness](sharpness.png)", ""]

    # the same definitions as the monitor's and its documentation's
    from callbacks._hessian import preconditioner

    assert "``P_t = (1 − β₁ᵗ) diag(√v̂_t + ε)``, ``v̂_t = v_t / (1 − β₂ᵗ)``" in preconditioner.__doc__
    assert "threshold ``(2 + 2β₁) / ((1 − β₁) η)``" in preconditioner.__doc__
    monitoring = (ROOT / "docs" / "monitoring.md").read_text()
    assert "`P = (1 − β₁ᵗ) diag(√v̂ + ε)` from Adam's current second moment (`v̂ = v/(1 − β₂ᵗ)`" in monitoring
    assert "Adam `(2 + 2β₁)/((1 − β₁)η)`" in monitoring
