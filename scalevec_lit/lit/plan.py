"""The plan of a recipe before a launch: ``python -m scalevec_lit fit --config R --print_plan [--plan_devices N]
[--plan_device_memory H200|<GiB>]`` prints the parameters, the per-device memory, the FLOPs, the batch and
the run length, then exits 0 without building the trainer, the data or the model (the model is built on the
meta device only; nothing is allocated, no GPU is needed).

The counts are ``plan_count.py``'s (what each memory row holds and what is not counted is written there); this
file prints them (``format_plan``, ``print_plan``) and writes the numbers a wall-time estimate reads
(``write_plan_json``).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from ..checks import config_value as _get
from ..errors import notice
from .activations import COMPILED_NOTE
from .plan_count import GIB, TIGHT, Plan, make_plan


def _gib(n: float) -> str:
    return f"{n / GIB:8.2f} GiB"


def _dtype(nbytes: int) -> str:
    return {2: "bf16", 4: "fp32"}[nbytes]


def format_plan(p: Plan) -> str:
    c, n = p.config, p.count
    moe = c.moe
    shape = (f"{c.n_layer} layers, d {c.n_embd}, {c.n_head}/{c.n_kv_head} heads of {c.head_dim}, MLP "
             f"{c.intermediate_size}, seq_len {c.seq_len}, vocab {c.vocab_size:,} ({p.vocab_note})")
    if moe is not None:
        shape += (f"; MoE: {moe.num_experts} experts of {moe.expert_intermediate_size}, top-{moe.top_k}, "
                  f"{moe.num_shared_experts} shared, first {moe.first_dense_layers} dense")
    params = f"{n.total:,} total, {n.active:,} active per token, {n.scale:,} in scale vectors ({100 * n.scale_share:.4f}%)"
    lines = [f"plan: {p.recipes or '(no recipe)'} on {p.devices} devices ({p.devices_note})",
             f"  model        {shape}", f"  parameters   {params}",
             f"  FLOPs        {p.flops_per_token / 1e9:.3f} GFLOP per token (6 N_active + 12 L H d_head T, forward + "
             "backward)"]
    if p.batch is not None:
        lines.append(f"  batch        {p.batch.tokens:,} tokens per step = data.batch_size {p.batch.micro_batch} × "
                     f"{p.batch.accumulate} accumulation steps × {p.batch.data_parallel} data-parallel ranks × "
                     f"{p.batch.seq_len} tokens; {p.batch.tokens * p.flops_per_token / 1e15:.3f} PFLOP per step")
        if p.max_steps:
            total = p.max_steps * p.batch.tokens
            lines.append(f"  run          {p.max_steps:,} steps = {total:,} tokens ({total / 1e9:.2f}B; "
                         f"{total / n.total:.1f} per parameter, {total / n.active:.1f} per active parameter); "
                         f"{total * p.flops_per_token:.3e} FLOP")
    else:
        lines.append(f"  batch        no global batch in the recipe: data.batch_size × seq_len = {p.micro_tokens:,} "
                     "tokens per device and micro-batch")
    how = (f"FSDP2 over {p.shards} data-parallel rank{'s' if p.shards > 1 else ''}, {_dtype(p.act_bytes)} compute with fp32 master weights"
           + (" and fp32 gradient reductions" if p.act_bytes == 2 else "") if p.fsdp else
           f"one full replica per device, {_dtype(p.act_bytes)} activations, {_dtype(p.master_bytes)} weights")
    lines.append(f"  parallel     {how}; activation checkpointing {'on' if p.checkpointing else 'off'}; "
                 f"torch.compile per block {'on' if p.compile else 'off'}")
    m, share = p.memory, f"1/{p.shards} each" if p.shards > 1 else "whole"
    rows = [(f"weights ({_dtype(p.master_bytes)}, {share})", m.weights),
            (f"gradients ({_dtype(p.master_bytes)}, {share})", m.gradients),
            (f"optimizer ({p.optimizer}; {_dtype(p.master_bytes)}, {share})", m.optimizer),
            (f"activations ({p.micro_tokens:,} tokens per micro-batch, saved for the backward"
             + (", blocks checkpointed" if p.checkpointing else "") + ")", m.activations),
            ("transient (loss peak" + (f", gathered {_dtype(p.act_bytes)} root + "
                                       + ("2 blocks" if p.reshard else "every block") + ", 1 block's gradients"
                                       if p.fsdp else "") + ")",
             m.transient)]
    width = max(len(r[0]) for r in rows)
    lines.append("  memory per device:")
    lines += [f"    {name.ljust(width)} {_gib(v)}" for name, v in rows]
    budget = f"{p.memory_budget / GIB:.1f} GiB ({p.memory_label})"
    verdict = ("fits" if m.total <= TIGHT * p.memory_budget else "tight (above 90%)" if m.total <= p.memory_budget
               else "DOES NOT FIT")
    lines.append(f"    {'total'.ljust(width)} {_gib(m.total)} of {budget}: {verdict} ({100 * m.total / p.memory_budget:.0f}%)")
    lines.append("  not counted: CUDA context and communication buffers (1–3 GiB), allocator fragmentation"
                 + (f"; {COMPILED_NOTE}" if p.compile else ""))
    lines += [f"  note: {note}" for note in p.notes]
    return "\n".join(lines)


def print_plan(cfg: Any, devices: Optional[int] = None, memory: Optional[str] = None) -> Plan:
    """Print the plan on stdout; a one-line warning on stderr when it does not fit."""
    plan = make_plan(cfg, devices, memory)
    print(format_plan(plan), flush=True)
    if plan.memory.total > plan.memory_budget:
        notice(f"plan: {plan.memory.total / GIB:.1f} GiB per device exceeds the {plan.memory_budget / GIB:.1f} GiB of "
               f"{plan.devices} devices; set --model.parallel.activation_checkpointing=true, lower data.batch_size "
               "or use more devices (--plan_devices=N to plan them)", kind="warning")
    return plan


def write_plan_json(p: Plan, cfg: Any, path: str) -> None:
    """The numbers of the plan that a wall-time estimate needs (``study/estimate.py``), as JSON."""
    limit = _get(cfg, "trainer.limit_val_batches")
    data = {
        "recipes": p.recipes, "devices": p.devices, "flops_per_token": p.flops_per_token,
        "params_total": p.count.total, "params_active": p.count.active, "micro_tokens": p.micro_tokens,
        "seq_len": p.config.seq_len,
        "data_parallel": p.batch.data_parallel if p.batch is not None else p.shards,
        "tokens_per_step": p.batch.tokens if p.batch is not None else None, "max_steps": p.max_steps,
        "val_check_interval": _get(cfg, "trainer.val_check_interval"),
        "limit_val_batches": limit if isinstance(limit, (int, float)) else None,
        "accelerator": str(_get(cfg, "trainer.accelerator", "")), "compile": p.compile,
        "memory_total_bytes": p.memory.total, "memory_budget_bytes": p.memory_budget,
    }
    Path(path).write_text(json.dumps(data, indent=1))
