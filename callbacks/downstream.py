"""DownstreamEval: lm-eval tasks inside the training loop, every N optimizer steps, logged beside the losses.

YAML (``trainer.callbacks``; e.g. ``recipes/examples/downstream_eval.yaml``)::

    - class_path: scalevec_lit.callbacks.DownstreamEval
      init_args: {tasks: [hellaswag, arc_easy], every_n_steps: 1000, limit: 200}

At every step that is a multiple of ``every_n_steps`` the model runs the tasks (``limit`` documents each,
lm-eval's convention: a count, or a fraction below 1) and each metric is logged to the trainer's loggers as
``downstream/<task>/<metric>`` (``acc``, ``acc_norm``, ``exact_match``, perplexities ...) at that step.

- Several processes (DDP, FSDP2): every rank builds every request and runs its share of the forward batches
  (round robin, whatever ``limit``: a rank with none still meets the others at every collective); the scores
  are gathered, the metrics computed on rank 0 and sent to every rank; a sharded model runs each forward on all
  ranks together (``scalevec_lit/evaluate/lm.py``). Tensor parallelism is refused.
- Resumable: the steps evaluated and their metrics are in the checkpoint; a resumed run evaluates at the same
  steps (a step the checkpoint was saved at before its evaluation ran is evaluated on resume).
- Checks its task names at set-up, before the first training step (lm-eval is imported and its index of the
  tasks built then, once): a misspelled task stops the run with the close names, not after
  ``every_n_steps`` of training.
- Costs nothing between its steps: one modulo per batch. The random generators are left as they were, so
  training continues exactly as without the callback.
- The tokenizer is the one the training data was prepared with (its ``meta.json``), or ``tokenizer``.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import lightning as L
from lightning.pytorch.callbacks import Callback

__all__ = ["DownstreamEval"]


class DownstreamEval(Callback):
    """Run lm-eval ``tasks`` every ``every_n_steps`` optimizer steps and log their metrics.

    Args:
        tasks: lm-eval task names (a list, or one comma-separated string).
        every_n_steps: evaluate after every this many optimizer steps.
        limit: documents per task (a fraction of each task below 1; ``None``: all).
        num_fewshot: few-shot examples (default: each task's own).
        batch_size: sequences per forward.
        include_path: a folder (or list of folders) of your own task YAML files.
        max_gen_toks: tokens ``generate_until`` may produce when a task does not say.
        tokenizer: ``tokenizer.json`` (default: the one the training data was prepared with).
        prefix: the first part of the logged names.
        seed: lm-eval's seeds (few-shot sampling); the training's generators are not touched.
    """

    def __init__(self, tasks: str | Sequence[str], every_n_steps: int = 1000, limit: Optional[float] = 100,
                 num_fewshot: Optional[int] = None, batch_size: int = 8,
                 include_path: Optional[str | Sequence[str]] = None, max_gen_toks: int = 64,
                 tokenizer: Optional[str] = None, prefix: str = "downstream", seed: int = 1234) -> None:
        from scalevec_lit.errors import UserError
        from scalevec_lit.evaluate.harness import split_tasks

        key = "DownstreamEval"
        self.tasks = split_tasks(tasks, key=f"{key}.tasks")
        for name, value, low in (("every_n_steps", every_n_steps, 1), ("batch_size", batch_size, 1),
                                 ("max_gen_toks", max_gen_toks, 1), ("num_fewshot", num_fewshot, 0)):
            if value is not None and (not isinstance(value, int) or value < low):
                raise UserError(f"{key}.{name}", value, f"must be a whole number of at least {low}",
                                f"set e.g. {name}: {max(low, 8)}")
        if limit is not None and (not limit > 0 or (limit >= 1 and limit != int(limit))):
            raise UserError(f"{key}.limit", limit, "must be a whole count of documents per task, or a fraction "
                            "in (0, 1)", "set e.g. limit: 100, or limit: null to run every document")
        self.every_n_steps, self.batch_size, self.max_gen_toks = every_n_steps, batch_size, max_gen_toks
        self.limit = None if limit is None else (int(limit) if limit >= 1 else float(limit))
        self.num_fewshot, self.tokenizer, self.prefix, self.seed = num_fewshot, tokenizer, prefix, seed
        self.include_path = [include_path] if isinstance(include_path, str) else list(include_path or [])
        self.last_step: Optional[int] = None  #: the last step evaluated
        self.history: dict[int, dict[str, float]] = {}  #: step → {"<task>/<metric>": value}
        self._manager = None  # lm-eval's task index, built at set-up (or the first evaluation)

    @property
    def state_key(self) -> str:
        return self._generate_state_key(tasks=tuple(self.tasks), every_n_steps=self.every_n_steps, prefix=self.prefix)

    def state_dict(self) -> dict[str, Any]:
        return {"last_step": self.last_step, "history": {int(k): dict(v) for k, v in self.history.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.last_step = state_dict.get("last_step")
        self.history = {int(k): dict(v) for k, v in (state_dict.get("history") or {}).items()}

    # -- hooks ---------------------------------------------------------------------------------------
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        from pathlib import Path

        from scalevec_lit.errors import UserError
        from scalevec_lit.evaluate.harness import require_lm_eval

        if stage != "fit":
            return
        require_lm_eval("DownstreamEval")  # a spec lookup, no import
        from scalevec_lit.recipe_lookup import shipped_folder

        self.include_path = [shipped_folder(f) for f in self.include_path]  # recipes/...: shipped with the package
        for folder in self.include_path:
            if not Path(folder).is_dir():
                raise UserError("DownstreamEval.include_path", folder, "is not a folder",
                                "give a folder of lm-eval task YAML files (relative to where the run starts)")
        tp = getattr(trainer.strategy, "_tensor_parallel_size", 1)
        if isinstance(tp, int) and tp > 1:
            raise UserError("DownstreamEval", f"tensor_parallel_size {tp}", "evaluates with data parallelism only "
                            "(DDP, FSDP2)", "set trainer.strategy.tensor_parallel_size: 1 or remove the callback")
        self.tasks_index()  # every task name checked now, before the first training step (issue 32)

    def tasks_index(self):
        """lm-eval's index of the tasks (built once; an unknown name is a ``UserError`` with the close names)."""
        from scalevec_lit.evaluate.harness import task_manager

        if self._manager is None:
            self._manager = task_manager(self.tasks, self.include_path or None, key="DownstreamEval.tasks",
                                         include_key="DownstreamEval.include_path")
        return self._manager

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        step = trainer.global_step
        if step > 0 and step % self.every_n_steps == 0 and self.last_step != step:
            self.evaluate(trainer, pl_module)  # saved at an evaluation step before the evaluation ran

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any,
                           batch_idx: int) -> None:
        step = trainer.global_step
        if step % self.every_n_steps == 0 and step > 0 and self.last_step != step:
            self.evaluate(trainer, pl_module)

    # -- one evaluation ------------------------------------------------------------------------------
    def _tokenizer(self, trainer: L.Trainer):
        from scalevec_lit.data.tokenizer import Tokenizer
        from scalevec_lit.errors import UserError
        from scalevec_lit.lit.tokenizer_check import data_identity

        if self.tokenizer is not None:
            return Tokenizer(self.tokenizer, key="DownstreamEval.tokenizer")
        ident = data_identity(getattr(trainer, "datamodule", None))
        if not ident or not ident.get("path"):
            raise UserError("DownstreamEval.tokenizer", "(not given)", "the training data records no tokenizer "
                            "(no meta.json)", "set DownstreamEval's tokenizer: <the data's tokenizer.json>")
        return Tokenizer(ident["path"], key="DownstreamEval: the data's tokenizer")

    def evaluate(self, trainer: L.Trainer, pl_module: L.LightningModule) -> dict[str, float]:
        """Run the tasks now; log and return ``{"<task>/<metric>": value}`` (the same on every rank)."""
        from scalevec_lit.evaluate.harness import kept_random_state, metrics, run_tasks
        from scalevec_lit.evaluate.lm import ScaleVecLM

        step = trainer.global_step
        manager = self.tasks_index()
        model = pl_module.model
        lm = ScaleVecLM(model, self._tokenizer(trainer), batch_size=self.batch_size, device=pl_module.device,
                        max_gen_toks=self.max_gen_toks, forward_context=trainer.precision_plugin.forward_context,
                        rank=trainer.global_rank, world_size=trainer.world_size, name=type(pl_module).__name__)
        was_training = model.training
        model.eval()
        try:
            with kept_random_state():
                results = run_tasks(lm, self.tasks, manager, limit=self.limit, num_fewshot=self.num_fewshot,
                                    seed=self.seed, bootstrap_iters=0)
        finally:
            model.train(was_training)
        values = metrics(results) if results is not None else None
        if trainer.world_size > 1:
            import torch.distributed as dist

            box = [values]
            dist.broadcast_object_list(box, src=0)
            values = box[0]
        values = dict(values or {})
        self.last_step, self.history[step] = step, values
        logged = {f"{self.prefix}/{k}": v for k, v in values.items()}
        for logger in trainer.loggers:
            logger.log_metrics(logged, step=step)
        return values
