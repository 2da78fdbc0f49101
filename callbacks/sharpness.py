"""SharpnessMonitor: the top eigenvalues of the loss Hessian and the optimizer's preconditioned sharpness,
on a fixed held-out batch, every N optimizer steps (issue 27; the edge-of-stability measurements of Cohen
et al. 2021 and 2022).

At step 0 (before the first update) and after every ``every_n_steps``-th optimizer step it takes the batch
it drew once from the validation loader (the first ``batch_size`` rows of its first batch, kept on the
device and in the callback's checkpoint state; a run resumed with other arguments keeps it unless
``batch_size`` changed, and says so in one line: ``_sharpness_state.py``), evaluates the training objective
on it (next-token cross-entropy plus the MoE auxiliary losses) with the model in eval mode (no MoE balancing
update, no recorded statistic changes), and logs for each parameter subset in ``params``:

- ``sharpness/lambda_max`` (and ``sharpness/lambda_2`` … ``lambda_<top_k>``): the largest eigenvalues of the
  Hessian of that objective with respect to the subset (the other parameters held fixed), by Lanczos on
  Hessian-vector products;
- ``sharpness/precond_lambda_max``: for Adam/AdamW, λ_max of ``P^{-1/2} H P^{-1/2}`` with
  ``P = (1 − β₁ᵗ) diag(√v̂ + ε)`` from Adam's current moment estimates (Cohen et al. 2022's definition, with
  the first moment's bias correction: ``_hessian.preconditioner``); ``sharpness/threshold``: the stability
  threshold it is compared with, ``(2 + 2β₁)/((1 − β₁)η)``; for SGD ``threshold`` is ``(2 + 2μ)/((1 − δ)η)``
  (momentum μ, dampening δ) beside the raw ``lambda_max`` (2/η for plain gradient descent);
  ``sharpness/threshold_ratio``: the (preconditioned, for Adam) λ_max over the threshold (1 = the edge of
  stability). Muon, or any optimizer
  without a known diagonal preconditioner: the raw values only, said once in a warning;
- ``sharpness/loss``: the objective on the held-out batch; ``sharpness/iterations``: Lanczos steps taken.

A subset other than ``all`` puts its name in the tag: ``sharpness/scales_input/lambda_max``. Subsets:
``all``, ``matrices`` (the optimizer's ``matrix`` group: hidden linear maps and experts), ``scales`` (every
registered scale parameter), ``scales:input`` / ``scales:output`` (one role).

Between its steps it costs nothing: no hook on the model, no graph or vector kept. At its steps: one
forward and backward building a graph that is differentiated again, plus one product per Lanczos step
(``iterations`` at most), each about a training step's backward; memory: the double-backward graph plus
``iterations`` vectors of the subset's size. The forward runs eager (``torch.compiler.set_stance
("force_eager")``) inside ``scalevec_lit.scale.ops.higher_order()`` (twice-differentiable paths, the math
attention kernel). FSDP2 (``ModelParallelStrategy``) and FSDP are refused at setup: sharded parameters are
gathered for one backward, not for a graph differentiated twice.

May import Lightning and torch; reads the model through the scale registry and public attributes; must not
import ``scalevec_lit.lit``.
"""
from __future__ import annotations

import contextlib
from typing import Any, Optional, Sequence

import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_warn
from torch import nn

from scalevec_lit.errors import UserError
from scalevec_lit.scale.registry import scale_parameters

from ._hessian import NOT_YET, hessian_operator, lanczos, preconditioner, scaled
from ._sharpness_state import CONFIG_KEYS, SUBSETS, check_arguments, legacy_state, monitor_key, resumed_state, say

__all__ = ["SharpnessMonitor"]

TAG = "sharpness"


def subset_parameters(model: nn.Module, optimizer: Optional[torch.optim.Optimizer], subset: str) -> list[nn.Parameter]:
    """The trainable parameters of ``subset`` (``SUBSETS``), in the model's order."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if subset == "all":
        return trainable
    if subset == "matrices":
        groups = [] if optimizer is None else [g for g in optimizer.param_groups if g.get("kind") == "matrix"]
        ids = {id(p) for g in groups for p in g["params"]}
        return [p for p in trainable if id(p) in ids]
    role = subset.partition(":")[2]
    ids = {id(sp.param) for sp in scale_parameters(model) if not role or sp.info.role == role}
    return [p for p in trainable if id(p) in ids]


def subset_prefix(subset: str) -> str:
    return TAG if subset == "all" else f"{TAG}/{subset.replace(':', '_')}"


def objective(module: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy on ``batch`` ``[B, T+1]`` plus the model's auxiliary (MoE) losses: what the
    training step minimizes."""
    x, y = batch[:, :-1].long(), batch[:, 1:].long()
    logits = module(x)
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
    inner = getattr(module, "model", module)
    aux = inner.aux_losses() if hasattr(inner, "aux_losses") else {}
    return loss + sum(aux.values()) if aux else loss


@contextlib.contextmanager
def measuring(module: nn.Module):
    """Eval mode, eager, twice-differentiable paths, grad on; the modules' recorded outputs of the last
    training forward (MoE ``last_aux_losses``/``last_load_stats``) put back afterwards."""
    from scalevec_lit.scale.ops import higher_order

    kept = [(m, {k: getattr(m, k) for k in ("last_aux_losses", "last_load_stats") if hasattr(m, k)})
            for m in module.modules()]
    kept = [(m, attrs) for m, attrs in kept if attrs]
    was_training = module.training
    module.eval()
    try:
        with torch.enable_grad(), torch.compiler.set_stance("force_eager"), higher_order():
            yield
    finally:
        module.train(was_training)
        for m, attrs in kept:
            for k, v in attrs.items():
                setattr(m, k, v)


class SharpnessMonitor(Callback):
    """Log the loss Hessian's top eigenvalues and the optimizer's preconditioned sharpness (module docstring).

    Args:
        every_n_steps: optimizer steps between measurements (also one at step 0).
        top_k: eigenvalues logged per subset (``lambda_max``, ``lambda_2`` …).
        iterations: at most this many Lanczos steps (Hessian-vector products) per eigenvalue problem.
        tol: a Ritz value is converged when its residual is at most ``tol`` times its size.
        seed: the start vector's seed (the same every time: measurements differ only by the model).
        batch_size: rows of the validation loader's first batch used (None: all of it).
        params: the parameter subsets measured: ``all``, ``matrices``, ``scales``, ``scales:input``, ``scales:output``.
        precondition: also measure the optimizer's preconditioned sharpness and log its threshold.
    """

    def __init__(
        self,
        every_n_steps: int = 100,
        top_k: int = 1,
        iterations: int = 20,
        tol: float = 1e-3,
        seed: int = 0,
        batch_size: Optional[int] = None,
        params: Sequence[str] = ("all",),
        precondition: bool = True,
    ) -> None:
        params = check_arguments(every_n_steps, top_k, iterations, tol, seed, batch_size, params)
        self.every_n_steps, self.top_k, self.iterations = int(every_n_steps), int(top_k), int(iterations)
        self.tol, self.seed, self.batch_size = float(tol), int(seed), batch_size
        self.params, self.precondition = params, precondition
        self.batch: Optional[torch.Tensor] = None  # the held-out batch (CPU copy in the checkpoint state)
        self._device_batch: Optional[torch.Tensor] = None
        self._last_step: Optional[int] = None
        self._said: set[str] = set()
        self._index: Optional[int] = None  # its position among the trainer's SharpnessMonitors (set up)

    # -- setup -----------------------------------------------------------------------------------------
    def setup(self, trainer: Any, pl_module: nn.Module, stage: str) -> None:
        monitors = [cb for cb in getattr(trainer, "callbacks", None) or () if isinstance(cb, SharpnessMonitor)]
        self._index = next((i for i, cb in enumerate(monitors) if cb is self), None)  # its checkpoint key
        name = type(trainer.strategy).__name__
        if "FSDP" in name or "ModelParallel" in name:
            raise UserError(
                "trainer.callbacks: SharpnessMonitor", f"trainer.strategy {name}",
                "Hessian-vector products need a graph differentiated twice, and sharded (FSDP/FSDP2) parameters "
                "are gathered for one backward only",
                "measure sharpness on a single device or with DDP (e.g. a smaller copy of the run), or remove the "
                "callback")

    def held_out_batch(self, trainer: Any) -> torch.Tensor:
        """The batch drawn once from the validation loader (kept in the state, so a resumed run reuses it)."""
        if self.batch is None:
            dm = getattr(trainer, "datamodule", None)
            loader = dm.val_dataloader() if dm is not None and hasattr(dm, "val_dataloader") else None
            if isinstance(loader, (list, tuple)):
                loader = loader[0] if loader else None
            if loader is None:
                raise UserError("trainer.callbacks: SharpnessMonitor", "no validation loader",
                                "it measures on a held-out batch drawn from the data module's validation loader",
                                "give the data module a validation split, or remove the callback")
            batch = next(iter(loader))
            self.batch = (batch if self.batch_size is None else batch[: self.batch_size]).detach().cpu()
        return self.batch

    # -- measuring -------------------------------------------------------------------------------------
    def _say_once(self, key: str, message: str, trainer: Any) -> None:
        if key not in self._said:
            self._said.add(key)
            if trainer is None or trainer.is_global_zero:
                rank_zero_warn(f"SharpnessMonitor: {message}")

    def measure(self, module: nn.Module, batch: torch.Tensor, optimizer: Optional[torch.optim.Optimizer],
                trainer: Any = None) -> dict[str, float]:
        """One measurement: every tag and its value (see the module docstring)."""
        if any(hasattr(p, "placements") for p in module.parameters()):
            raise UserError("trainer.callbacks: SharpnessMonitor", "sharded (DTensor) parameters",
                            "Hessian-vector products through FSDP2 shards are not supported",
                            "measure on a single device or with DDP, or remove the callback")
        out: dict[str, float] = {}
        with measuring(module):
            loss = objective(module, batch)
            out[f"{TAG}/loss"] = float(loss.detach())
            for subset in self.params:
                prefix = subset_prefix(subset)
                params = subset_parameters(module, optimizer, subset)
                if not params:
                    self._say_once(f"empty:{subset}", f"params {subset!r}: the model has no such parameters; "
                                   "nothing logged for it", trainer)
                    continue
                op = hessian_operator(loss, params)
                n = sum(p.numel() for p in params)
                eig = lanczos(op, n, self.top_k, self.iterations, self.tol, self.seed, params[0].detach())
                for i, value in enumerate(eig.values):
                    out[f"{prefix}/lambda_{'max' if i == 0 else i + 1}"] = value
                out[f"{prefix}/iterations"] = float(eig.iterations)
                if not eig.converged:
                    self._say_once(f"conv:{subset}", f"params {subset!r}: Lanczos did not reach tol={self.tol} in "
                                   f"{self.iterations} iterations (raise iterations or tol)", trainer)
                if self.precondition and optimizer is not None:
                    self._preconditioned(op, params, optimizer, eig.values[0], prefix, subset, out, trainer)
                del op
            del loss
        return out

    def _preconditioned(self, op, params, optimizer, lam, prefix, subset, out, trainer) -> None:
        pre, reason = preconditioner(optimizer, params)
        if pre is None:
            if reason in NOT_YET:  # step 0, a warmup from 0: the next measurement has it
                return
            self._say_once(f"pre:{subset}:{reason[:20]}", f"params {subset!r}: no preconditioned sharpness: {reason}",
                           trainer)
            return
        value = lam
        if pre.d is not None:
            pre_eig = lanczos(scaled(op, pre.d), pre.d.numel(), 1, self.iterations, self.tol, self.seed, pre.d)
            value = pre_eig.values[0]
            out[f"{prefix}/precond_lambda_max"] = value
        out[f"{prefix}/threshold"] = pre.threshold
        out[f"{prefix}/threshold_ratio"] = value / pre.threshold

    # -- hooks -----------------------------------------------------------------------------------------
    def _run(self, trainer: Any, pl_module: nn.Module) -> None:
        step = trainer.global_step
        if self._last_step == step:
            return
        self._last_step = step
        batch = self.held_out_batch(trainer)
        if self._device_batch is None or self._device_batch.device != pl_module.device:
            self._device_batch = batch.to(pl_module.device)
        optimizer = trainer.optimizers[0] if trainer.optimizers else None
        values = self.measure(pl_module, self._device_batch, optimizer, trainer)
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(values, step)
        if not trainer.loggers:
            self._say_once("logger", "the trainer has no logger, nothing is logged; set trainer.logger", trainer)

    def on_train_start(self, trainer: Any, pl_module: nn.Module) -> None:
        if trainer.global_step == 0:
            self._run(trainer, pl_module)

    def on_train_batch_end(self, trainer: Any, pl_module: nn.Module, outputs: Any, batch: Any, batch_idx: int) -> None:
        step = trainer.global_step
        if step > 0 and step % self.every_n_steps == 0:
            self._run(trainer, pl_module)

    def on_train_end(self, trainer: Any, pl_module: nn.Module) -> None:
        self._device_batch = None

    @property
    def state_key(self) -> str:
        """``SharpnessMonitor`` (``SharpnessMonitor[i]`` for the i-th of several) once set up: a run resumed with
        other arguments finds its state (``_sharpness_state.py``); before set-up, keyed by its arguments."""
        return monitor_key(self._index, self._generate_state_key(every_n_steps=self.every_n_steps,
                                                                 params=tuple(self.params)))

    def config(self) -> dict[str, Any]:
        """The arguments saved with the state (compared on resume)."""
        return {k: (list(getattr(self, k)) if k == "params" else getattr(self, k)) for k in CONFIG_KEYS}

    def state_dict(self) -> dict[str, Any]:
        return {"batch": self.batch, "last_step": self._last_step, "config": self.config()}

    def on_load_checkpoint(self, trainer: Any, pl_module: nn.Module, checkpoint: dict[str, Any]) -> None:
        states = checkpoint.get("callbacks") or {}
        if self._index is not None and self.state_key not in states:  # saved under the arguments' key (earlier)
            key, state = legacy_state(states, self._index)
            if state is not None:
                self.load_state_dict(dict(state))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the saved batch and last measured step; drop the batch when ``batch_size`` changed, and say in
        one line what was kept and dropped when the arguments changed."""
        self.batch, self._last_step, line = resumed_state(state_dict, self.config())
        self._device_batch = None
        say(line)
