"""CausalLM: the LightningModule that trains a ``Transformer`` with next-token cross-entropy.

Its set-up lives here; its training and validation steps in ``steps.py`` (``TrainingSteps``, its base class).
The model is built in ``configure_model`` (so that sharded strategies can build it on the meta device
and shard it, see ``parallel.py``); the optimizer arrives as an ``OptimizerCallable`` and is given
parameter groups built from the scale registry (``optim.py``).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Callable, Iterable, Literal, Optional

import torch
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from torchmetrics.aggregation import MeanMetric

from ..checkpoint import check_resume
from ..errors import UserError, notice
from ..model.block import Block
from ..model.config import TransformerConfig
from ..model.spec import check_rebuildable, model_spec
from ..model.transformer import BlockFactory, Transformer, count_parameters
from .norm_report import report_unregistered_norm_gains
from ..scale.registry import DECAYED_BY, SCALE
from ..scale.strategy import ScaleStrategy
from .nonfinite import NonFiniteGuard, SkipWindow
from .optim import build_param_groups, check_group_options, describe_groups, instantiate_optimizer
from .parallel import DATASHEET_BF16_TFLOPS, ParallelOptions, parallelize
from .schedules import Schedule, WarmupCosine
from .steps import NonFiniteLossError, TrainingSteps  # noqa: F401  (NonFiniteLossError: also imported from here)
from .tokenizer_check import check_same_tokenizer, data_identity

OptimizerFactory = Callable[[Iterable], torch.optim.Optimizer]


def _adamw(params: Iterable) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)


def resolve_vocab_size(given: int, data_vocab: Optional[int], quiet: bool = False) -> int:
    """The model's vocabulary: the tokenizer's (``data_vocab``, linked from the data) unless the recipe sets
    ``model.config.vocab_size``; a set value smaller than the tokenizer's is refused, a larger one is used as
    given (padding rows, e.g. to a multiple of 64), with one line. The class default means "not set"."""
    if data_vocab is None or given == data_vocab:
        return given
    if given == TransformerConfig.vocab_size:  # not set in the recipe: follow the tokenizer
        return data_vocab
    if given < data_vocab:
        raise UserError("model.config.vocab_size", given, f"is smaller than the vocabulary of the data's tokenizer "
                        f"({data_vocab}): token ids would fall outside the embedding",
                        "leave it out (the vocabulary follows the tokenizer) or set it to at least "
                        f"{data_vocab}")
    if not quiet:
        notice(f"model.config.vocab_size: {given}: used as given, {given - data_vocab} rows more than the "
               f"tokenizer's {data_vocab} tokens (padding, never a target); leave it out to follow the tokenizer")
    return given


class CausalLM(TrainingSteps):
    """Pre-train a decoder-only language model whose scale vectors follow ``strategy``.

    Args:
        config: the model shape (``vocab_size`` is replaced by ``vocab_size`` below when given).
        strategy: scale-vector strategy (presets in ``recipes/strategy/``).
        block: block class, ``(config, layer, strategy) -> nn.Module``; subclass ``Block`` to experiment.
        optimizer: optimizer factory called with parameter groups (YAML: ``class_path: torch.optim.AdamW``).
        schedule: learning-rate schedule (default: warmup 100 steps + cosine to 10%).
        param_groups: per-kind options (``matrix``, ``embedding``, ``head``, ``vector``, ``scale``).
        vocab_size: linked from the data module's tokenizer by the CLI.
        nonfinite: what a NaN/Inf loss does: ``skip`` the step (counted in ``train/skipped_steps``;
            single process only), ``stop`` (save ``nonfinite.ckpt`` beside the checkpoints, then raise), or ``raise``.
            On CUDA the check does not synchronize the host with the device at every step (``nonfinite.py``).
        parallel: FSDP2 options used under ``ModelParallelStrategy`` (activation checkpointing, compile,
            mixed precision).
        compile: ``torch.compile`` each block (also without FSDP).
        peak_tflops: the accelerator's peak (bf16) TFLOP/s per device for ``train/mfu``; on CUDA the
            datasheet value is looked up from the device name when not given (H100/H200 989, A100 312).
        init_from: start from this checkpoint's weights only (a native folder from ``import``/``convert``,
            a ``.ckpt`` or a distributed checkpoint folder): fresh optimizer and schedule; the recipe must
            build the same model (checked at construction, ``init_from.py``); its vocabulary is the checkpoint's.

    To train another model class, subclass it and override ``build_model`` (a recipe names the subclass in
    ``model.class_path``). ``configure_model`` calls it once (on the meta device with ``parallel.meta_init``), and
    fit start rebuilds the model from its spec on the meta device: the model it returns initializes every
    parameter in ``reset_parameters`` and records its extra constructor arguments in ``init_args``.
    """

    def __init__(
        self,
        config: TransformerConfig = TransformerConfig.unresolved(),
        strategy: ScaleStrategy = ScaleStrategy(),
        block: BlockFactory = Block,
        optimizer: OptimizerFactory = _adamw,
        schedule: Optional[Schedule] = None,
        param_groups: Optional[dict[str, dict[str, Any]]] = None,
        vocab_size: Optional[int] = None,
        nonfinite: Literal["skip", "stop", "raise"] = "stop",
        parallel: Optional[ParallelOptions] = None,
        compile: bool = False,
        peak_tflops: Optional[float] = None,
        init_from: Optional[str] = None,
    ) -> None:
        super().__init__()
        # replace() re-runs __post_init__, so the unresolved default gets its derived fields here
        self.config = replace(config, vocab_size=resolve_vocab_size(config.vocab_size, vocab_size,
                                                                    quiet=init_from is not None))
        self.strategy = strategy if strategy is not None else ScaleStrategy()
        self.block = block
        self.optimizer_factory = optimizer
        self.schedule = schedule if schedule is not None else WarmupCosine()
        self.param_groups = param_groups or {}
        check_group_options(self.param_groups)  # issue 23 (part C): a negative lr_mult is refused before the run
        self.nonfinite = nonfinite
        self.parallel = parallel or ParallelOptions()
        self.compile = compile
        self.peak_tflops = peak_tflops
        self.init_from, self._init_state, self._init_tokenizer = init_from, None, None
        self._init_model: Optional[dict] = None  # the model entry of init_from's spec, checked once built
        if init_from is not None:  # check the recipe against the checkpoint before anything else is built
            from .init_from import read_init_with_tokenizer

            self.config, self._init_state, self._init_tokenizer, self._init_model = read_init_with_tokenizer(
                str(init_from), self.config, self.strategy, self.block)
            if config.vocab_size not in (TransformerConfig.vocab_size, self.config.vocab_size):
                notice(f"model.config.vocab_size: {config.vocab_size}: not used: a run from model.init_from has the "
                       f"checkpoint's vocabulary ({self.config.vocab_size}); leave it out")
        self._flops_per_token: Optional[float] = None
        self.model: Optional[Transformer] = None
        self.val_loss = MeanMetric()
        # per-source validation (several data folders): one metric per folder, made in setup()
        self.val_source_loss: Optional[torch.nn.ModuleList] = None
        self.val_source_names: list[str] = []
        self.tokens_seen = 0
        self.skipped_steps = 0
        self._t_last: Optional[float] = None
        self._guard = NonFiniteGuard()
        self._immediate_check = True  # decided at fit start: CPU, or skip without an on-device skip
        self._skip_window = SkipWindow()  # host-side skip: a non-finite micro-batch drops its whole step

    # -- model -------------------------------------------------------------------------------------
    def build_model(self) -> Transformer:
        """Override to build another model class (chosen in a recipe with ``model.class_path``): a ``Transformer``
        subclass built as ``cls(self.config, self.strategy, self.block, **extra)`` with ``self.init_args = extra``
        in its constructor, so that checkpoints rebuild it (``model/spec.py``; checked at fit start)."""
        return Transformer(self.config, self.strategy, self.block)

    def spec(self) -> dict[str, Any]:
        """The checkpoint spec of the model built (its class, config, strategy and block with its init_args)."""
        return model_spec(self.config, self.strategy, getattr(self.model, "block_factory", self.block), self.model)

    def configure_model(self) -> None:
        if self.model is not None:
            return
        mesh = getattr(self, "_device_mesh", None)
        if mesh is not None and self.parallel.meta_init and self._init_state is None:
            from ..model.meta import meta_device

            with meta_device():  # tensors made of one Python number stay real (model/meta.py)
                self.model = self.build_model()
        else:
            self.model = self.build_model()
        if self._init_state is not None:  # weights only: loaded before sharding (FSDP2 shards what is there)
            from .init_from import load_init_weights

            load_init_weights(self.model, self._init_state, str(self.init_from), self._init_model)
            self._init_state = None
        if mesh is not None or self.compile or self.parallel.activation_checkpointing:
            parallelize(self.model, mesh, self.parallel, compile=self.compile)
        if self.model.embed.weight.is_meta:  # materialize and initialize the local shards ourselves
            self.model.to_empty(device=self.device if self.device.type != "meta" else "cpu")
            self.model.reset_parameters()

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        return self.model(idx)

    # -- optimizers --------------------------------------------------------------------------------
    def configure_optimizers(self):
        groups = build_param_groups(self.model, self.param_groups)
        opt = instantiate_optimizer(self.optimizer_factory, groups)
        rank_zero_info("optimizer parameter groups:\n" + describe_groups(opt))
        max_steps = self.trainer.estimated_stepping_batches if self._trainer is not None else None
        if max_steps is None or not math.isfinite(max_steps):
            max_steps = self.schedule.max_steps or 1
        self.schedule.with_max_steps(int(max_steps))
        sched = torch.optim.lr_scheduler.LambdaLR(opt, self.schedule)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step", "name": "lr"}}

    def setup(self, stage: str) -> None:
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        names = list(getattr(dm, "source_names", None) or [])
        if len(names) > 1 and names != self.val_source_names:  # the data module gives one val loader per source
            self.val_source_names = names
            self.val_source_loss = torch.nn.ModuleList(MeanMetric() for _ in names)
        if self._init_tokenizer is not None:  # the pretrained embeddings must stand for the data's tokens
            check_same_tokenizer("model.init_from", str(self.init_from), self._init_tokenizer, data_identity(dm))
        data_vocab = getattr(dm, "vocab_size", None)
        if data_vocab is not None and data_vocab > self.config.vocab_size:
            raise ValueError(
                f"model.config.vocab_size: {self.config.vocab_size} is smaller than the vocabulary ({data_vocab}) of "
                f"the tokenizer that {getattr(dm, 'data_dir', 'the data')!r} was prepared with; token ids would fall "
                "outside the embedding. Set it to at least the tokenizer's size (the CLI links it from the data)"
            )

    # -- start-up report and checkpoint extras --------------------------------------------------------
    def on_fit_start(self) -> None:
        check_rebuildable(self.model, self.spec())  # a model its checkpoints would not rebuild: refused before training
        count = count_parameters(self.model)  # the model built (global sizes under FSDP2, also on the meta device)
        rank_zero_info(f"{type(self.model).__name__}: " + count.summary())
        report_unregistered_norm_gains(self.model)  # a norm's 1-D gain that is not a scale vector: named, with the fix
        self._flops_per_token = self.config.flops_per_token(self.config.seq_len, count.active_non_embedding)
        if self.peak_tflops is None and self.device.type == "cuda":
            name = torch.cuda.get_device_name(self.device)
            self.peak_tflops = next((v for k, v in DATASHEET_BF16_TFLOPS.items() if k in name), None)
        undecayed = [g for opt in self.trainer.optimizers for g in opt.param_groups
                     if g.get("kind") == SCALE and not g.get(DECAYED_BY)]  # a callback marks the groups it decays
        if undecayed:
            rank_zero_warn(
                "scale vectors are not decayed: no scalevec_lit.callbacks.RoleWeightDecay among the callbacks "
                "and the optimizer's weight decay is off for them (add --trainer.callbacks+=RoleWeightDecay)"
            )

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        if not self._immediate_check:  # never write a checkpoint after an unnoticed non-finite loss
            found = self._guard.poll(block=True)
            if found is not None:
                self._on_nonfinite(*found, deferred=True, log=False)
        checkpoint["scalevec"] = {
            "tokens_seen": self.tokens_seen,
            "skipped_steps": self.skipped_steps,
            "spec": self.spec(),
        }
        tokenizer = self._tokenizer_identity()
        if tokenizer:
            checkpoint["scalevec"]["tokenizer"] = tokenizer

    def _tokenizer_identity(self) -> Optional[dict]:
        """The tokenizer the training data was prepared with (as its ``meta.json`` names it): export ships it,
        resume and ``init_from`` compare it with the data's (``tokenizer_check.py``)."""
        return data_identity(getattr(self._trainer, "datamodule", None) if self._trainer is not None else None)

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        path = getattr(self._trainer, "ckpt_path", None) if self._trainer is not None else None
        extra = check_resume(checkpoint, self.spec(), path)  # its record, once its model is known to be this run's
        check_same_tokenizer("--ckpt_path", str(path), extra.get("tokenizer"), self._tokenizer_identity())
        self.tokens_seen = int(extra.get("tokens_seen", 0))
        self.skipped_steps = int(extra.get("skipped_steps", 0))
