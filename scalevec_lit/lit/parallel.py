"""Apply FSDP2, activation checkpointing and torch.compile to a plain ``Transformer``.

Model code stays free of parallelism (as torchtitan's ``parallelize.py``): ``CausalLM.configure_model``
calls ``parallelize`` with the device mesh that Lightning's ``ModelParallelStrategy`` gives it.
Order per block: activation checkpointing, then compile, then ``fully_shard``; the root last.

Must not import Lightning.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

import torch
from torch import nn


#: Dense bf16 TFLOP/s per device from datasheets, for MFU when the peak is not measured or given.
DATASHEET_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "B200": 2250.0, "L40S": 362.0}


@dataclass
class ParallelOptions:
    """FSDP2 options (``model.parallel`` in YAML).

    Args:
        activation_checkpointing: recompute each block's activations in the backward pass.
        mixed_precision: ``bf16`` = bf16 parameters and compute, fp32 gradient reductions (GPU);
            ``fp32`` = no mixed precision.
        reshard_after_forward: free gathered parameters after each block's forward (ZeRO-3); False keeps
            them until the backward (ZeRO-2-like, more memory, less communication).
        meta_init: build the model on the meta device, shard it, then materialize and initialize only the
            local shards (needed for models that do not fit one device; the random values then depend on
            the world size).
    """

    activation_checkpointing: bool = False
    mixed_precision: Literal["fp32", "bf16"] = "fp32"
    reshard_after_forward: bool = True
    meta_init: bool = False


def parallelize(
    model: nn.Module, mesh: Optional["torch.distributed.device_mesh.DeviceMesh"], options: ParallelOptions,
    compile: bool = False, compile_options: Optional[dict] = None,
) -> nn.Module:
    """Wrap ``model.blocks`` in place; shard with FSDP2 when ``mesh`` is given.

    ``compile_options``: keyword arguments of ``nn.Module.compile`` for each block (default: none, i.e.
    inductor, graph breaks allowed); ``tests/test_compile.py`` passes ``backend="aot_eager", fullgraph=True``
    to check that every preset's block compiles whole on this very path.
    """
    blocks = model.blocks
    for i, block in enumerate(blocks):
        if options.activation_checkpointing:
            from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

            block = checkpoint_wrapper(block, preserve_rng_state=False)
        if compile:
            block.compile(**(compile_options or {}))
        blocks[i] = block
    if mesh is None:
        return model
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    dp_mesh = mesh["data_parallel"] if mesh.mesh_dim_names and "data_parallel" in mesh.mesh_dim_names else mesh
    if options.mixed_precision == "bf16":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    else:
        mp = MixedPrecisionPolicy()
    for i, block in enumerate(blocks):
        # the last block's parameters are needed again right away by the backward: keep them gathered
        reshard = options.reshard_after_forward and i < len(blocks) - 1
        fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=options.reshard_after_forward)
    return model


def graph_break_report() -> Optional[str]:
    """What Dynamo broke so far in this process (``compile: true`` compiles without ``fullgraph``, so a break in
    a user's block fragments it instead of failing), or None when nothing was broken. Read after the first
    training step: every shipped preset compiles whole (``tests/test_compile.py``)."""
    from torch._dynamo.utils import counters

    breaks = counters.get("graph_break", {})
    if not breaks:
        return None
    reasons = sorted(breaks.items(), key=lambda kv: -kv[1])
    listed = "; ".join(f"{reason.splitlines()[0][:160]} ({n}×)" for reason, n in reasons[:5])
    more = f"; and {len(reasons) - 5} more" if len(reasons) > 5 else ""
    return (f"torch.compile broke the compiled blocks into more graphs than one ({sum(breaks.values())} graph "
            f"break(s)): {listed}{more}. Each break runs the code around it eagerly (slower, and on a GPU often a "
            "host sync). Every shipped preset compiles whole, so a break comes from a block, model or scale class "
            "of your own: find it with torch._dynamo.explain(block)(x, cos, sin), or set model.compile: false")
