"""Resume on another number of processes: what a checkpoint records of the world that wrote it, and how the
training loop's counters follow the new one.

A checkpoint written by N processes resumes on M (``SafeModelCheckpoint`` calls both functions):

- **weights and optimizer**: a distributed (DCP) checkpoint folder reshards by itself (each rank reads the
  slices of its new shards); a one-file checkpoint is read whole and sharded on load (Lightning's
  ``ModelParallelStrategy``);
- **the global batch** stays the recipe's (``global_batch_tokens``/``global_batch_size``), so the gradient
  accumulation follows the new data-parallel size (``lit/batch.py``);
- **the data position** is a global count, the sequences read in this epoch by all ranks together
  (``sequences``, recorded here; litdata records the same count as ``sample_in_epoch``). litdata's
  ``StreamingDataset`` rebuilds the order in which the first world read the epoch and deals the rest out
  over the new ranks, batch by batch (its "elastic" resume), so the optimizer step after the resume reads
  the same sequences as it would have read without the change, none repeated, none skipped. When the
  global batch changes too (``trainer.accumulate_grad_batches`` set, no ``global_batch_size``), the resume
  reads on from the exact count as well (``data/loaders.py``, ``exact_position``: litdata would round it
  down to a whole batch of the new world, and read up to that many - 1 sequences again), and the count no
  longer follows from Lightning's counters: the checkpoints of that epoch record it with the difference
  (``position_offset``);
- **Lightning's micro-batch counters**, which decide where an accumulation window ends, count per rank:
  ``reshard_loops`` rescales them to the new accumulation (otherwise the first step after a resume on fewer
  ranks would step after a part of its micro-batches).

Plain Python on checkpoint dicts; ``load_one_file`` patches Lightning's re-keying while it loads.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from ..errors import UserError

KEY = "scalevec_world"  # the checkpoint's record of the world that wrote it


def world_record(*, world_size: int, accumulate: int, micro_batch: int, loops: dict, offset: int = 0) -> dict:
    """What the checkpoint keeps of its world: processes, accumulation, micro batch, the global batch in
    sequences, and the data position as a global sequence count in the current epoch (the micro-batches of
    this epoch times this world's sequences per micro-batch, plus ``offset``: ``position_offset``)."""
    current = loops["fit_loop"]["epoch_loop.batch_progress"]["current"]["ready"]
    per_step = accumulate * micro_batch * world_size
    return {"world_size": world_size, "accumulate": accumulate, "micro_batch": micro_batch,
            "sequences_per_step": per_step, "sequences": current * micro_batch * world_size + offset}


def position_offset(checkpoint: dict, *, world_size: int, micro_batch: Optional[int]) -> int:
    """What the data position of ``checkpoint`` (its record's count, after ``reshard_loops``) differs from the
    count its micro-batch counter gives on ``world_size`` processes of ``micro_batch`` sequences: 0 unless the
    global batch changed in this epoch (6 sequences read by 1 process in 3 micro-batches, resumed on 4
    processes of 1: counter 1, 8 sequences, so -2). ``world_record`` adds it back until the epoch ends."""
    saved = checkpoint.get(KEY)
    if saved is None or "loops" not in checkpoint:
        return 0
    ready = checkpoint["loops"]["fit_loop"]["epoch_loop.batch_progress"]["current"]["ready"]
    return saved["sequences"] - ready * (micro_batch or saved["micro_batch"]) * world_size


def _loader_states(checkpoint: dict) -> list:
    state = checkpoint.get("loops", {}).get("fit_loop", {}).get("state_dict", {}).get("combined_loader")
    return state if isinstance(state, list) else []


def reshard_loops(checkpoint: dict, *, world_size: int, accumulate: int,
                  micro_batch: Optional[int]) -> Optional[str]:
    """Make ``checkpoint``'s loop counters fit a run of ``world_size`` processes accumulating ``accumulate``
    micro-batches of ``micro_batch`` sequences (in place). Returns the line to print when the world changed,
    ``None`` when nothing changed; ``UserError`` (exit 2) when the checkpoint cannot resume on this world.
    ``micro_batch`` ``None``: not known yet (a module's own loader), taken as the checkpoint's here and compared
    once the loader exists (``check_micro_batch``)."""
    saved = checkpoint.get(KEY)
    if saved is not None and micro_batch is None:
        micro_batch = saved["micro_batch"]
    loaders = _loader_states(checkpoint)
    if saved is None:  # a checkpoint written before this record: only on the world size litdata recorded
        old = next((s["dataset"].get("world_size") for s in loaders if isinstance(s, dict)
                    and isinstance(s.get("dataset"), dict) and "world_size" in s["dataset"]), world_size)
        if old != world_size:
            raise UserError("--ckpt_path", "(this checkpoint)", f"was written by {old} processes before checkpoints "
                           f"recorded their global batch, so it cannot resume on {world_size}",
                           f"resume it on {old} processes (--trainer.devices={old}), then save again")
        return None
    if (saved["world_size"], saved["accumulate"], saved["micro_batch"]) == (world_size, accumulate, micro_batch):
        return None
    if saved["micro_batch"] != micro_batch:
        raise UserError("data.batch_size", micro_batch, f"differs from the {saved['micro_batch']} this checkpoint was "
                       "written with; the data position is kept in whole micro-batches per rank",
                       f"resume with --data.batch_size={saved['micro_batch']} (the global batch sets the "
                       "accumulation on any number of processes)")
    for state in loaders:
        child = state.get("dataset") if isinstance(state, dict) else None
        if isinstance(child, dict) and "input_dir_path" not in child and saved["world_size"] != world_size:
            raise UserError("data.data_dir", "(several folders)", f"a mixed data set resumes only on the number of "
                           f"processes that wrote the checkpoint ({saved['world_size']}; litdata's "
                           "CombinedStreamingDataset cannot deal its position out anew)",
                           f"resume on {saved['world_size']} processes (--trainer.devices={saved['world_size']})")
        if isinstance(child, dict) and "sample_in_epoch" in child and child["sample_in_epoch"] != saved["sequences"]:
            raise UserError("--ckpt_path", "(this checkpoint)", f"records {saved['sequences']:,} sequences read in this "
                           f"epoch but its data loader {child['sample_in_epoch']:,}", "resume from another checkpoint")
    loop = checkpoint["loops"]["fit_loop"]
    progress = loop["epoch_loop.batch_progress"]
    ready = progress["current"]["ready"]
    if ready % saved["accumulate"]:
        raise UserError("--ckpt_path", "(this checkpoint)", f"was written in the middle of an accumulation window "
                       f"(micro-batch {ready} of {saved['accumulate']} per step), so it cannot resume on another "
                       "number of processes", "resume from a checkpoint written at the end of a step (every "
                       "SafeModelCheckpoint save is), or on the same number of processes")
    steps = ready // saved["accumulate"]
    new_ready = steps * accumulate
    for field, value in list(progress["current"].items()):
        progress["current"][field] = new_ready + (value - ready)
    for field, value in list(progress["total"].items()):
        progress["total"][field] = value - ready + new_ready
    new_per_step = accumulate * micro_batch * world_size
    batch = (f"the same global batch of {new_per_step:,} sequences" if new_per_step == saved["sequences_per_step"]
             else f"the global batch changes from {saved['sequences_per_step']:,} to {new_per_step:,} sequences "
                  "(set global_batch_tokens or global_batch_size to keep it)")
    return (f"resuming a checkpoint of {saved['world_size']} process(es) on {world_size}: {batch}, "
            f"{accumulate} accumulation step(s) per rank (were {saved['accumulate']}); data position: "
            f"{saved['sequences']:,} sequences read in this epoch, the rest dealt out over {world_size} rank(s)")


def record_of(trainer, checkpoint: dict, offset: int = 0) -> dict[str, Any]:
    """``world_record`` of a running ``trainer`` for the ``checkpoint`` it is saving."""
    return world_record(world_size=trainer.world_size, accumulate=max(1, int(trainer.accumulate_grad_batches)),
                        micro_batch=micro_batch_of(trainer) or 1, loops=checkpoint["loops"], offset=offset)


def micro_batch_of(trainer) -> Optional[int]:
    """Sequences per micro-batch: the data module's ``batch_size``, else the training loader's (1 if it has
    none); ``None`` while neither is known: a module's own ``train_dataloader()`` (or a data module without a
    ``batch_size``) is built when training starts, after the checkpoint was read."""
    dm = getattr(trainer, "datamodule", None)
    if dm is not None and getattr(dm, "batch_size", None):
        return int(dm.batch_size)
    loader = getattr(getattr(trainer, "fit_loop", None), "_combined_loader", None)
    flat = getattr(loader, "flattened", None) or []
    return int(getattr(flat[0], "batch_size", 1) or 1) if flat else None


def check_micro_batch(saved: int, micro_batch: int) -> None:
    """The training loader's batch size, once it exists, against the ``saved`` one (``reshard_loops`` took it
    as equal while the loader was not built yet)."""
    if micro_batch != saved:
        raise UserError("batch_size", micro_batch, f"of the training data loader differs from the {saved} this "
                        "checkpoint was written with; the data position is kept in whole micro-batches per rank",
                        f"resume with a training loader of batch_size={saved}")


def _clean(name: str) -> str:
    """A parameter's name as torch's distributed state dicts spell it (no wrapper segments)."""
    for wrapper in ("_checkpoint_wrapped_module.", "_orig_mod.", "_fsdp_wrapped_module."):
        name = name.replace(wrapper, "")
    return name


def optimizer_state_by_name(state: dict, module, optimizer) -> dict:
    """A one-file checkpoint's optimizer state (keyed by position, as ``optimizer.state_dict()`` writes it)
    keyed by parameter name instead, from ``optimizer``'s own groups: positions follow the groups (matrices,
    embeddings, head, scales), not ``module.named_parameters()``, which is what Lightning's own re-keying
    assumes (it then hands a moment to a parameter of another shape)."""
    if not state.get("state") or not isinstance(next(iter(state["state"])), int):
        return state
    names = {id(p): _clean(n) for n, p in module.named_parameters()}
    live = [names.get(id(p)) for g in optimizer.param_groups for p in g["params"]]
    saved = [i for g in state["param_groups"] for i in g["params"]]
    if len(live) != len(saved) or None in live:
        return state  # not this optimizer's layout: as Lightning would
    by_index = dict(zip(saved, live))
    return {"state": {by_index[i]: v for i, v in state["state"].items()},
            "param_groups": [{**g, "params": [by_index[i] for i in g["params"]]} for g in state["param_groups"]]}


def verify_folder(path, rank: int, world: int, verify: str = "auto") -> None:
    """A DCP checkpoint folder whole and unchanged before any rank reads it (``checkpoint/folder.py``): each
    rank checks its share of the checksums (``verify``: ``sizes``, or ``auto`` above its threshold, the sizes
    and structure only), and every rank raises the first problem found (collective)."""
    import torch.distributed as dist

    from ..checkpoint.folder import folder_problem, hashes
    from ..checkpoint.verify import unreadable

    full = hashes(path, verify, world)
    problems = [folder_problem(path, full=full, rank=rank, world=world)]
    if world > 1 and dist.is_available() and dist.is_initialized():
        problems = [None] * world
        dist.all_gather_object(problems, folder_problem(path, full=full, rank=rank, world=world))
    problem = next((p for p in problems if p is not None), None)
    if problem is not None:
        raise unreadable(Path(path), ValueError(problem))


def load_one_file(strategy, verify: str = "auto") -> None:
    """Let ``strategy`` (FSDP2, ``ModelParallelStrategy``) resume a one-file checkpoint on any number of
    processes: Lightning reads it whole and shards it; its optimizer state is re-keyed by name first
    (``optimizer_state_by_name``). A DCP folder is checked first (``verify_folder``, by ``verify``)."""
    from lightning.fabric.strategies import model_parallel

    load = strategy.load_checkpoint

    def loading(checkpoint_path, *args, **kwargs):
        if Path(checkpoint_path).is_dir():
            verify_folder(checkpoint_path, strategy.global_rank, strategy.world_size, verify)
        original = model_parallel._rekey_optimizer_state_if_needed
        optimizers = strategy.optimizers
        if len(optimizers) == 1:
            model_parallel._rekey_optimizer_state_if_needed = lambda osd, module: original(
                optimizer_state_by_name(osd, module, optimizers[0]), module)
        try:
            return load(checkpoint_path, *args, **kwargs)
        finally:
            model_parallel._rekey_optimizer_state_if_needed = original

    strategy.load_checkpoint = loading


class WorldRecord:
    """``SafeModelCheckpoint``'s side (a mixin before Lightning's ``ModelCheckpoint``): every checkpoint gets the
    record of its world; a resumed fit rescales the loops to this one and says so in one line."""

    _micro_batch_to_check: Optional[int] = None  # the checkpoint's, when this run's was not known on load
    _offset: tuple = (None, 0)  # (epoch, position_offset) of the checkpoint this fit resumed

    def setup(self, trainer, pl_module, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        self._offset = (None, 0)  # before Lightning reads a checkpoint: a fit of its own starts at 0

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(trainer, pl_module, checkpoint)
        if "loops" in checkpoint:
            epoch, offset = self._offset
            checkpoint[KEY] = record_of(trainer, checkpoint, offset if checkpoint.get("epoch") == epoch else 0)

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(trainer, pl_module, checkpoint)
        self._micro_batch_to_check, self._offset = None, (None, 0)
        if "loops" not in checkpoint or trainer.state.fn != "fit":
            return
        micro_batch = micro_batch_of(trainer)
        if micro_batch is None and checkpoint.get(KEY) is not None:
            self._micro_batch_to_check = checkpoint[KEY]["micro_batch"]
        line = reshard_loops(checkpoint, world_size=trainer.world_size,
                             accumulate=max(1, int(trainer.accumulate_grad_batches)), micro_batch=micro_batch)
        self._offset = (checkpoint.get("epoch"), position_offset(checkpoint, world_size=trainer.world_size,
                                                                  micro_batch=micro_batch))
        if line is not None and trainer.is_global_zero:
            from ..notices import notice

            notice(line)

    def on_train_start(self, trainer, pl_module) -> None:
        super().on_train_start(trainer, pl_module)
        saved, self._micro_batch_to_check = self._micro_batch_to_check, None
        if saved is not None:  # the training loader exists now, before the first step
            check_micro_batch(saved, micro_batch_of(trainer) or 1)
