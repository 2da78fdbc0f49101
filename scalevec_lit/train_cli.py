"""``fit``, ``validate`` and ``test``: LightningCLI over ``CausalLM`` and ``TokenDataModule`` (YAML recipes,
``--print_config``, ``--print_plan``). The data module's vocabulary and the model's sequence length are linked so
that a recipe cannot disagree with its tokenizer. A recipe may state its global batch (``global_batch_tokens`` or
``global_batch_size``, top level): gradient accumulation then follows from the data-parallel size at start-up
(``lit/batch.py``). The training progress bar counts optimizer steps against ``trainer.max_steps``
(``lit/progress.py``). Errors suggest the fix: the closest known keys for an unknown one, a class's own sentence
for its bad argument.

Imported by ``cli.py`` only for these three commands: the other commands start without Lightning.
"""
from __future__ import annotations

import difflib
import re
import sys
from typing import Optional

from lightning.pytorch.cli import LightningArgumentParser, LightningCLI

from .callbacks._cli_errors import argument_sentence_first, parser_sentence  # one line: a class's argument, a value
from .checkpoint.verify import verify_checkpoint
from .checks import check_config, check_config_files
from .data.datamodule import TokenDataModule
from .errors import debug_enabled, one_paragraph
from .recipe_lookup import resolve_config_args


def _known_keys(parser) -> list[str]:
    """Every key the parser (and its subcommand parsers) accepts."""
    keys: list[str] = []
    try:
        keys += [k for k in parser.get_defaults().keys() if not k.startswith("__")]
    except Exception:  # suggestions are a courtesy; never hide the original error
        pass
    subcommands = getattr(parser, "_subcommands_action", None)
    for sub in getattr(subcommands, "_name_parser_map", {}).values():
        keys += _known_keys(sub)
    return keys


def _recipe_in_group(key: str, known: list[str]) -> Optional[str]:
    """The group (``model.strategy``) when an unknown ``key`` is that group followed by a key of the whole recipe
    (``model.strategy.model.strategy.vector.class_path``): a recipe file was given to the group's option
    (``--model.strategy=recipes/strategy/dnp.yaml``)."""
    parts = key.split(".")
    for n in range(1, len(parts) - 1):
        rest = ".".join(parts[n:])  # two parts at least: a section and its key
        if any(k == rest or k.startswith(rest + ".") or rest.startswith(k + ".") for k in known if "." in k):
            return ".".join(parts[:n])
    return None


class ScaleVecArgumentParser(LightningArgumentParser):
    """Adds the fix to jsonargparse's errors: for an unknown key, the closest known keys; for a wrong class, choice
    or group value, what the key accepts (``callbacks/_cli_values.py``)."""

    def parse_args(self, *args, **kwargs):
        try:
            return super().parse_args(*args, **kwargs)
        except Exception as err:  # noqa: BLE001 - a module a value names raised while imported: one line; else as is
            from .callbacks._cli_values import import_failure_line
            from .errors import UsageError

            line = None if debug_enabled() else import_failure_line(err)
            if line is None:
                raise
            raise UsageError(line) from None

    def error(self, message: str, ex: Exception | None = None):
        # a class's argument, a wrong class/choice/group value: one line (a nested parser's message, not printed but
        # read by the outer one, keeps jsonargparse's key and words apart from the argument's sentence)
        message = parser_sentence(message, self) if self.exit_on_error else argument_sentence_first(message)
        group = re.search(r"Group '([\w.]+)' does not accept option '([\w.]+)'", message)
        unknown = re.search(r"does not accept option '([\w.]+)'|[Uu]nrecognized arguments: --([\w.]+)", message)
        key = f"{group.group(1)}.{group.group(2)}" if group else (unknown and (unknown.group(1) or unknown.group(2)))
        parser = getattr(ex, "subcommand_parser", None) or self
        nested = key and _recipe_in_group(key, _known_keys(parser))
        if nested:
            message = (f"--{nested}: the file given to it is a whole recipe, not {nested}'s own keys (read as {key}); "
                       f"give it with --config FILE (after the base recipe), or give --{nested} a file of {nested}'s "
                       "keys only")
        elif key:
            close = difflib.get_close_matches(key, list(dict.fromkeys(_known_keys(parser))), n=3, cutoff=0.6)
            message += f"\n  unknown key {key!r}" + (
                f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else
                "; run with --help or --print_config to see the accepted keys"
            )
        if not self.exit_on_error or debug_enabled():
            return super().error(message, ex)
        print(f"error: {one_paragraph(message)}", file=sys.stderr, flush=True)
        sys.exit(2)


class ScaleVecCLI(LightningCLI):
    """LightningCLI with the links between data and model, and errors that suggest the fix."""

    def __init__(self, *args, model_class_path: Optional[str] = None, **kwargs) -> None:
        self.model_class_path = model_class_path  # issue 25 (H1): a CausalLM subclass chosen by model.class_path
        super().__init__(*args, **kwargs)

    def before_instantiate_classes(self) -> None:
        # -- issue 24 (part G): --print_plan prints the plan (lit/plan.py) and exits 0, before any build
        if self.subcommand is not None and self.config[self.subcommand].get("print_plan"):
            from .callbacks._cli_trainer import refused_value
            from .errors import UsageError
            from .lit.plan import print_plan

            sub = self.config[self.subcommand]
            line = refused_value(sub.get("trainer"))  # a trainer value the fit would refuse: refused here too
            if line is not None:
                raise UsageError(line)
            plan = print_plan(sub, sub.get("plan_devices"), sub.get("plan_device_memory"))
            if sub.get("plan_json"):
                from .lit.plan import write_plan_json

                write_plan_json(plan, sub, sub["plan_json"])
            raise SystemExit(0)
        # -- end of part G
        if self.subcommand is not None:
            check_config(self.config[self.subcommand], self.subcommand)
            from .lit.progress import drop_bars_when_disabled

            drop_bars_when_disabled(self.config[self.subcommand]["trainer"])
            from .lit.runfolder import resolve_run_folder

            resolve_run_folder(self.config[self.subcommand], self.subcommand)  # one folder per run (issue 26)

    def before_fit(self) -> None:
        from scalevec_lit.callbacks._resume_last import nothing_to_resume
        from scalevec_lit.callbacks.checkpoint import lock_checkpoint_folders

        ckpt_path = self.config[self.subcommand].get("ckpt_path")
        if nothing_to_resume(self.trainer, ckpt_path):  # a first start with --ckpt_path last: from step 0, no warning
            ckpt_path = self.config_init[self.subcommand]["ckpt_path"] = None
        lock_checkpoint_folders(self.trainer, ckpt_path)

    def instantiate_trainer(self, **kwargs):
        from scalevec_lit.callbacks.checkpoint import install_checkpoint_io

        from .lit.cluster import leave_requeue_to_the_job

        try:
            trainer = super().instantiate_trainer(**kwargs)
        except Exception as err:  # noqa: BLE001 - Lightning's refusal of a trainer value: one line; others unchanged
            from .callbacks._cli_trainer import trainer_sentence
            from .errors import UsageError

            line = trainer_sentence(err, self.config[self.subcommand].get("trainer") if self.subcommand else None)
            if line is None or debug_enabled():
                raise
            raise UsageError(line) from None
        install_checkpoint_io(trainer)  # atomic writes, clear errors for corrupt files
        leave_requeue_to_the_job(trainer)  # under SLURM: launch/slurm_fit.sbatch requeues, not Lightning too
        if self.subcommand == "fit":  # issue 34 item 4: a lost rank stops the others in bounded time (lit/peers.py)
            from .lit.peers import TIMEOUT_KEY, install

            install(trainer, self.config[self.subcommand].get(TIMEOUT_KEY))
        return trainer

    def _parse_ckpt_path(self) -> None:
        """Lightning loads the whole checkpoint here only to read hyperparameters, which CausalLM does not
        store (its spec travels in ``checkpoint['scalevec']``); check the file instead, cheaply."""
        if not self.config.get("subcommand"):
            return
        ckpt_path = self.config[self.config.subcommand].get("ckpt_path")
        if ckpt_path and str(ckpt_path) not in ("last", "best", "hpc", "registry"):
            verify_checkpoint(ckpt_path, full=False)

    def instantiate_classes(self) -> None:
        from scalevec_lit.callbacks._cli_errors import own_sentence_first  # a class's own error, not jsonargparse's text

        from .lit.model_class import without_class_path

        with without_class_path(self.config, self.subcommand), own_sentence_first():  # H1: not an argument of the class
            super().instantiate_classes()
        if getattr(self, "trainer", None) is not None:
            from .lit.progress import install_step_progress_bar

            install_step_progress_bar(self.trainer)  # "step n/max_steps" instead of "Epoch 1/-2"
            if self.subcommand == "fit":
                self._resolve_global_batch(self.trainer)
        model_config = getattr(getattr(self, "model", None), "config", None)
        if self.subcommand is not None and model_config is not None:  # the saved config.yaml is what runs
            self.config[self.subcommand]["model.config.vocab_size"] = model_config.vocab_size

    def _resolve_global_batch(self, trainer) -> None:
        """The data-parallel size follows the world size (``data_parallel_size: auto``); the accumulation follows
        from the recipe's global batch (``lit/batch.py``), printed in one line."""
        from lightning.pytorch.strategies import ModelParallelStrategy
        from lightning.pytorch.utilities import rank_zero_info

        from .lit.batch import SEQUENCES_KEY, TOKENS_KEY, data_parallel_size, resolve_global_batch

        devices, nodes = trainer.num_devices, trainer.num_nodes
        world = devices * nodes
        strategy = trainer.strategy
        dp = world
        if isinstance(strategy, ModelParallelStrategy):
            dp, set_to = data_parallel_size(world, strategy._data_parallel_size, strategy._tensor_parallel_size, devices)
            if set_to is not None:
                strategy._data_parallel_size = set_to
        config = self.config[self.subcommand]
        batch = resolve_global_batch(
            tokens=config.get(TOKENS_KEY), sequences=config.get(SEQUENCES_KEY), seq_len=self.model.config.seq_len,
            micro_batch=int(getattr(self.datamodule, "batch_size", 1)), data_parallel=dp, devices=devices,
            num_nodes=nodes, accumulate_set=trainer.accumulate_grad_batches,
        )
        if batch is not None:
            trainer.accumulate_grad_batches = batch.accumulate
            rank_zero_info(batch.describe(TOKENS_KEY if config.get(TOKENS_KEY) is not None else SEQUENCES_KEY))

    def add_arguments_to_parser(self, parser) -> None:
        import scalevec_lit.callbacks as callbacks

        from .lit.batch import SEQUENCES_KEY, TOKENS_KEY

        dir(callbacks)  # imports every callback module: jsonargparse resolves a short name among imported classes

        parser.add_argument(f"--{TOKENS_KEY}", type=Optional[int], default=None,
                            help="tokens per optimizer step, all devices together; gradient accumulation follows "
                                 "from data.batch_size, model.config.seq_len and the data-parallel size at start-up")
        parser.add_argument(f"--{SEQUENCES_KEY}", type=Optional[int], default=None,
                            help="the same in sequences (set one of the two)")
        # -- issue 24 (part G): the plan before a launch (lit/plan.py)
        parser.add_argument("--print_plan", type=bool, nargs="?", const=True, default=False,
                            help="print the parameters, per-device memory, FLOPs, batch and run length, then exit "
                                 "(nothing allocated, no GPU needed)")
        parser.add_argument("--plan_devices", type=Optional[int], default=None,
                            help="devices to plan for (default: trainer.devices × trainer.num_nodes; auto: 8)")
        parser.add_argument("--plan_device_memory", type=Optional[str], default=None,
                            help="memory of one device: H100 (default), H200, A100 or a number of GiB")
        parser.add_argument("--plan_json", type=Optional[str], default=None,
                            help="with --print_plan: also write the plan as JSON to this file (read by "
                                 "`study plan` for wall-time estimates)")
        # -- end of part G
        # -- issue 25 (H1): model.class_path (lit/model_class.py)
        from .lit.model_class import add_class_path_argument

        add_class_path_argument(parser, self.model_class_path)
        # -- end of H1
        from .lit.peers import peer_timeout_argument

        peer_timeout_argument(parser)  # issue 34 item 4
        parser.link_arguments("model.config.seq_len", "data.seq_len")
        parser.link_arguments("data.vocab_size", "model.vocab_size", apply_on="instantiate")


def run_training(argv: list[str]):
    """``fit``/``validate``/``test`` with ``argv`` (the command first); returns the ``ScaleVecCLI``."""
    argv = resolve_config_args(argv, sys.argv)  # --config smoke: a shipped recipe by name; a path wins (issue 35)
    from .lit.elastic import resolve_auto_nodes

    given = argv == sys.argv[1:]
    argv = resolve_auto_nodes(argv)  # --trainer.num_nodes=auto: the nodes of this torchrun start (issue 46 item 3)
    if given:
        sys.argv[1:] = argv  # LightningCLI reads sys.argv itself (it warns when given args beside a command line)
    check_config_files(argv)
    from .lit.peers import translate

    with translate():  # a failed collective after a peer is lost: one line naming it (lit/peers.py)
        cli = _run_cli(None if argv == sys.argv[1:] else argv)  # None: LightningCLI reads sys.argv itself
    from scalevec_lit.callbacks.checkpoint import stopped_by_signal

    stop = getattr(cli, "trainer", None) and stopped_by_signal(cli.trainer)
    if stop:
        raise SystemExit(stop)
    return cli


def _run_cli(args: Optional[list[str]]):
    from .lit.model_class import model_class  # issue 25 (H1): the CausalLM subclass a recipe chooses, or CausalLM

    model_cls, model_class_path = model_class(list(sys.argv[1:] if args is None else args))
    from .lit.runfolder import release_unused

    try:
        return ScaleVecCLI(
            model_cls,
            TokenDataModule,
            model_class_path=model_class_path,
            parser_class=ScaleVecArgumentParser,
            auto_configure_optimizers=False,
            save_config_kwargs={"overwrite": True},
            seed_everything_default=42,
            trainer_defaults={"enable_model_summary": False},  # fit prints the library's own count (issue 35)
            args=args,
        )
    finally:
        release_unused()  # the run folder chosen for a command that then wrote nothing is removed again
