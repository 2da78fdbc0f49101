"""The global batch of a recipe, independent of the machine: ``global_batch_tokens`` (or ``global_batch_size``
in sequences) at the top level of a recipe, ``data.batch_size`` the micro batch per device; gradient
accumulation follows from the data-parallel size at start-up:

    accumulate_grad_batches = global sequences / (data.batch_size × data-parallel size)

where the data-parallel size is ``trainer.devices × trainer.num_nodes`` (divided by the tensor-parallel size
under ``ModelParallelStrategy``). ``ModelParallelStrategy(data_parallel_size='auto', tensor_parallel_size=N)``
means "every process not used by tensor parallelism does data parallelism": the data-parallel size follows
the world size (Lightning's own ``auto`` would be the number of nodes, a 2-D mesh, when both are ``auto``).

Plain Python: must not import Lightning (``cli.py`` passes the numbers).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..errors import UserError

TOKENS_KEY, SEQUENCES_KEY = "global_batch_tokens", "global_batch_size"


@dataclass(frozen=True)
class GlobalBatch:
    """How one optimizer step's batch is made up."""

    sequences: int  # sequences per optimizer step, all ranks together
    seq_len: int
    micro_batch: int  # data.batch_size: sequences per device per forward
    data_parallel: int
    accumulate: int
    devices: int
    num_nodes: int

    @property
    def tokens(self) -> int:
        return self.sequences * self.seq_len

    def describe(self, key: str) -> str:
        nodes = f"{self.num_nodes} node{'s' if self.num_nodes != 1 else ''}"
        return (f"global batch: {self.tokens:,} tokens = {self.sequences:,} sequences of {self.seq_len} tokens = "
                f"data.batch_size {self.micro_batch} × {self.accumulate} accumulation steps × {self.data_parallel} "
                f"data-parallel ranks ({self.devices} devices × {nodes}); trainer.accumulate_grad_batches = "
                f"{self.accumulate} (from {key})")


def resolve_global_batch(
    *, tokens: Optional[int], sequences: Optional[int], seq_len: int, micro_batch: int, data_parallel: int,
    devices: int, num_nodes: int, accumulate_set: int = 1,
) -> Optional[GlobalBatch]:
    """The accumulation that gives the recipe's global batch on this many ranks (``None``: no global batch in the
    recipe, Lightning's ``accumulate_grad_batches`` stands). ``UserError`` naming the numbers and the fix when it
    cannot be met exactly."""
    if tokens is None and sequences is None:
        return None
    if tokens is not None and sequences is not None:
        raise UserError(TOKENS_KEY, tokens, f"and {SEQUENCES_KEY} ({sequences}) are both set",
                        f"keep one: set the other to null (--{SEQUENCES_KEY}=null or --{TOKENS_KEY}=null)")
    key, value = (TOKENS_KEY, tokens) if tokens is not None else (SEQUENCES_KEY, sequences)
    if value < 1:
        raise UserError(key, value, "must be at least 1", f"set it to the batch of one optimizer step, e.g. --{key}="
                        f"{seq_len * micro_batch * data_parallel if key == TOKENS_KEY else micro_batch * data_parallel}")
    if accumulate_set != 1:
        raise UserError("trainer.accumulate_grad_batches", accumulate_set, f"is derived from {key} ({value}) at "
                        "start-up, so it cannot be set as well", f"remove it from the recipe or the command line, or "
                        f"set --{key}=null to use trainer.accumulate_grad_batches as it is")
    unit_seq = micro_batch * data_parallel  # sequences per forward, all ranks together
    ranks = f"data-parallel size {data_parallel} (trainer.devices {devices} × trainer.num_nodes {num_nodes})"
    if key == TOKENS_KEY:
        unit = unit_seq * seq_len
        what = f"data.batch_size {micro_batch} × model.config.seq_len {seq_len} × {ranks} = {unit:,} tokens"
    else:
        unit = unit_seq
        what = f"data.batch_size {micro_batch} × {ranks} = {unit:,} sequences"
    if value % unit:
        below, above = value // unit * unit, (value // unit + 1) * unit
        multiples = f"{below:,} or {above:,}" if below else f"{above:,}"
        fits = [b for b in range(micro_batch - 1, 0, -1) if value % (unit // micro_batch * b) == 0]
        batch_fix = f", or --data.batch_size={fits[0]} (which divides it)" if fits else ""
        raise UserError(key, f"{value:,}", f"is not a multiple of {what}, so no whole number of accumulation steps "
                        "gives it", f"set {key} to a multiple of {unit:,} (e.g. {multiples}){batch_fix}")
    accumulate = value // unit
    return GlobalBatch(sequences=accumulate * unit_seq, seq_len=seq_len, micro_batch=micro_batch,
                       data_parallel=data_parallel, accumulate=accumulate, devices=devices, num_nodes=num_nodes)


def data_parallel_size(world: int, data_parallel: object, tensor_parallel: object, devices: int) -> tuple[int, Optional[int]]:
    """``(data-parallel size, the value to give ModelParallelStrategy or None to leave it)`` for a world of
    ``world`` processes. ``data_parallel='auto'`` with an integer ``tensor_parallel`` follows the world size;
    both ``auto`` keep Lightning's meaning (data parallel over nodes, tensor parallel within a node)."""
    if data_parallel == "auto" and tensor_parallel == "auto":
        return world // max(1, devices), None
    if data_parallel == "auto":
        tp = int(tensor_parallel)
        if tp < 1 or world % tp:
            raise UserError("trainer.strategy.init_args.tensor_parallel_size", tp, f"does not divide the world size "
                            f"{world} (trainer.devices × trainer.num_nodes)", "set it to a divisor of the world "
                            "size (1: pure FSDP2)")
        return world // tp, world // tp
    dp = int(data_parallel)
    tp = devices if tensor_parallel == "auto" else int(tensor_parallel)
    if dp * tp != world:
        raise UserError("trainer.strategy.init_args.data_parallel_size", dp, f"× tensor_parallel_size {tp} is not the "
                        f"world size {world} (trainer.devices × trainer.num_nodes)", "set data_parallel_size: auto "
                        "(it then follows the world size) or the product of the two")
    return dp, None
