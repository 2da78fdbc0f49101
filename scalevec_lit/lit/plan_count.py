"""The counts of the launch plan (``plan.py`` prints them): parameters, FLOPs per token, the global batch, the
run length, and the memory per device.

Per-device memory under the recipe's settings, with N the shard count (the data-parallel size under
``ModelParallelStrategy``, i.e. FSDP2; 1 otherwise, where every device holds a replica):

- weights and gradients: each parameter's shard, ``ceil(rows / N) × columns`` (FSDP2 shards dim 0, padded),
  in fp32 (the master weights; bf16 mixed precision gathers bf16 copies per block and reduces gradients in
  fp32, so the sharded gradients are fp32 too); ``bf16-true`` precision without FSDP2 keeps 2 bytes each;
- optimizer state: its moments per parameter shard, read from the optimizer the recipe builds (instantiated
  over meta parameters): AdamW 2 (3 with amsgrad), Muon 1 (its momentum), ``MuonAdamW`` Muon's for its
  groups and AdamW's for the rest; the per-tensor step counters (4 B on the host, unless fused) are
  not counted;
- activations: what autograd saves for one micro-batch (``data.batch_size × model.config.seq_len`` tokens),
  counted per token by ``lit/activations.py`` (validated to 1% against a measured CPU run);
- transient: the loss's peak at the start of the backward (the fp32 logits' gradients), and under FSDP2 the
  gathered parameters in the compute dtype (the root's embedding and head, gathered for the whole forward;
  two blocks at a time, the running one and the prefetched one, or every block with
  ``model.parallel.reshard_after_forward: false``) and one block's unsharded gradients. With activation
  checkpointing the recomputed block is counted in the activations.

Not counted: the CUDA context and the communication buffers (about 1–3 GiB), allocator fragmentation,
``torch.compile``'s own workspace. A plan above 90% of the device memory is called tight.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from ..checks import config_value as _get
from ..data.prepared_meta import meta_location, read_meta
from ..errors import RunError, UserError
from .activations import loss_transient_per_token, saved_per_token

GIB = 2 ** 30
#: Total memory as ``nvidia-smi`` reports it (MiB): H100 SXM 80 GB: 81,559; H200: 143,771; A100 80 GB: 81,920.
DEVICE_MEMORY = {"H100": 81559 * 2 ** 20, "H200": 143771 * 2 ** 20, "A100": 81920 * 2 ** 20}
DEFAULT_DEVICE = "H100"
ASSUMED_DEVICES = 8  # devices: auto on a machine without GPUs
ASSUMED_VOCAB = 32000  # the GPU recipes' vocabulary when no prepared data says otherwise
TIGHT = 0.9
PLAN_TRIES, PLAN_TIMEOUT = 2, 10.0  # reading a remote meta.json for the plan: at most 2 tries of 10 s each


def device_memory(value: Optional[str]) -> tuple[int, str]:
    """``(bytes, label)`` of ``--plan_device_memory``: a GPU name (H100, H200, A100) or a number of GiB."""
    if value is None:
        return DEVICE_MEMORY[DEFAULT_DEVICE], f"{DEFAULT_DEVICE}, assumed: set --plan_device_memory"
    name = str(value).strip().upper()
    if name in DEVICE_MEMORY:
        return DEVICE_MEMORY[name], name
    try:
        gib = float(value)
    except ValueError:
        gib = float("nan")
    if not math.isfinite(gib) or gib <= 0:
        raise UserError("plan_device_memory", value, "is neither a GPU name nor a positive number of GiB",
                        f"give one of {', '.join(DEVICE_MEMORY)} or the GiB of one device, e.g. --plan_device_memory=141")
    return int(gib * GIB), "given"


def shard_numel(shape: torch.Size, shards: int) -> int:
    """Elements of the largest shard when dim 0 is split ``shards`` ways (FSDP2; padded to equal shards)."""
    if len(shape) == 0:
        return 1
    return math.ceil(shape[0] / shards) * math.prod(shape[1:])


def optimizer_moments(optimizer: torch.optim.Optimizer) -> tuple[dict[int, int], str, bool]:
    """``({id(param): state tensors of its size}, description, known)`` for an optimizer over meta parameters."""
    groups = getattr(optimizer, "all_param_groups", lambda: [(type(optimizer).__name__, g) for g in optimizer.param_groups])()
    counts: dict[int, int] = {}
    names, known = [], True
    for name, g in groups:
        if name in ("AdamW", "Adam"):
            k = 3 if g.get("amsgrad") else 2
        elif name == "Muon":
            k = 1
        elif name == "SGD":
            k = 1 if g.get("momentum") else 0
        else:
            k, known = 2, False
        for p in g["params"]:
            counts[id(p)] = k
        if g["params"] and f"{name}: {k}" not in names:
            names.append(f"{name}: {k}")
    what = ", ".join(n + (" moment" if n.endswith(" 1") else " moments") for n in names)
    return counts, what + ("" if known else f" (assumed for {type(optimizer).__name__})"), known


@dataclass
class Memory:
    weights: int
    gradients: int
    optimizer: int
    activations: int
    transient: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations + self.transient


@dataclass
class Plan:
    recipes: str
    devices: int
    devices_note: str
    shards: int
    fsdp: bool
    act_bytes: int
    master_bytes: int
    checkpointing: bool
    reshard: bool
    compile: bool
    config: Any
    vocab_note: str
    count: Any
    flops_per_token: float
    micro_tokens: int
    batch: Any  # GlobalBatch or None
    max_steps: Optional[int]
    optimizer: str
    memory: Memory
    memory_budget: int
    memory_label: str
    notes: list[str] = field(default_factory=list)


def memory_of(model: torch.nn.Module, moments: dict[int, int], shards: int, master_bytes: int, act_bytes: int,
              micro_tokens: int, checkpointing: bool, fsdp: bool, strategy: Any, reshard: bool = True) -> Memory:
    """Per-device bytes of ``model`` (built on the meta device) under the settings."""
    config = model.config
    params = list(dict.fromkeys(model.parameters()))
    weights = sum(shard_numel(p.shape, shards) for p in params) * master_bytes
    optimizer = sum(moments.get(id(p), 0) * shard_numel(p.shape, shards) for p in params) * master_bytes
    blocks, head = saved_per_token(config, strategy, act_bytes, checkpointing)
    activations = micro_tokens * (blocks + head)
    transient = micro_tokens * loss_transient_per_token(config, act_bytes)
    if fsdp:  # gathered copies in the compute dtype: the root (embedding, head) and two blocks (every block when
        # they are not resharded after the forward); one block's unsharded gradients
        sizes = [sum(p.numel() for p in b.parameters()) for b in model.blocks]
        root_numel = sum(p.numel() for p in params) - sum(sizes)
        gathered = 2 * max(sizes) if reshard else sum(sizes)
        transient += (root_numel + gathered + max(sizes)) * act_bytes
    return Memory(weights, weights, optimizer, activations, transient)


def _recipe_devices(cfg: Any) -> Optional[int]:
    devices = _get(cfg, "trainer.devices")
    if isinstance(devices, (list, tuple)):
        return len(devices)
    try:
        n = int(devices)
    except (TypeError, ValueError):
        return None
    return n if n > 0 else None


def _vocab(cfg: Any) -> tuple[Optional[int], str, Optional[str]]:
    """The data's vocabulary (``meta.json`` of ``data.data_dir``'s first folder, local or ``s3://``, read as
    the data module reads it: ``data/prepared_meta.py``), or ``None`` and why it is assumed; third, when that
    ``meta.json`` could not be read, the plan's note saying why (one line: the key, the value, why, the fix),
    else ``None``. A remote one gets at most ``PLAN_TRIES`` tries of ``PLAN_TIMEOUT`` seconds: a plan answers
    at once. A bad ``data.storage_options`` or scheme is refused as ``fit`` refuses it."""
    data_dir = _get(cfg, "data.data_dir")
    first = data_dir[0] if isinstance(data_dir, (list, tuple)) and data_dir else data_dir
    if not first:
        return None, "assumed: no data.data_dir; set --model.config.vocab_size to plan another", None
    where = meta_location(first)
    try:
        meta = read_meta(first, _get(cfg, "data.storage_options"), tries=PLAN_TRIES, timeout=PLAN_TIMEOUT)
        vocab = None if meta is None else int(meta["vocab_size"])
    except RunError as err:
        return None, "assumed: data.data_dir could not be read, see the note", (
            f"data.data_dir: {first}: {err.value} could not be read, so the vocabulary is assumed ({err.problem}); "
            f"set --model.config.vocab_size to the data's vocabulary to plan with it, or {err.fix}")
    except (KeyError, TypeError, ValueError) as err:
        return None, "assumed: data.data_dir could not be read, see the note", (
            f"data.data_dir: {first}: {where} records no vocab_size ({type(err).__name__}: {err}), so the vocabulary "
            f"is assumed; prepare that folder again with --output {first} --overwrite, or set --model.config.vocab_size")
    if vocab is None:
        return None, (f"assumed: no prepared data at data.data_dir ({first}): no {where}; set "
                      "--model.config.vocab_size to plan another"), None
    return vocab, f"from {where}", None


def build_module(cfg: Any, vocab: int):
    """The recipe's ``CausalLM`` (its model not built): the parsed ``model`` section, instantiated."""
    from jsonargparse import ArgumentParser

    from .module import CausalLM

    from ..model.spec import import_object

    section = cfg["model"].clone() if hasattr(cfg["model"], "clone") else cfg["model"]
    section["vocab_size"] = vocab
    values = section.as_dict()
    cls = import_object(values.pop("class_path")) if values.get("class_path") else CausalLM  # model.class_path
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, "model")
    return parser.instantiate_classes(parser.parse_object({"model": values})).model


def make_plan(cfg: Any, devices: Optional[int] = None, memory: Optional[str] = None) -> Plan:
    """The plan of the parsed subcommand config ``cfg`` (a jsonargparse Namespace) on ``devices`` devices."""
    from ..model.config import TransformerConfig
    from ..model.transformer import count_parameters
    from .batch import SEQUENCES_KEY, TOKENS_KEY, data_parallel_size, resolve_global_batch
    from .optim import build_param_groups, instantiate_optimizer

    notes: list[str] = []
    nodes = int(_get(cfg, "trainer.num_nodes", 1) or 1)
    if devices is not None:
        if devices < 1:
            raise UserError("plan_devices", devices, "must be at least 1", "give the number of devices, e.g. "
                            "--plan_devices=8")
        world, devices_note = devices, "--plan_devices"
    elif _recipe_devices(cfg) is not None:
        world, devices_note = _recipe_devices(cfg) * nodes, "the recipe's trainer.devices × trainer.num_nodes"
    else:
        world = ASSUMED_DEVICES * nodes
        devices_note = (f"assumed: trainer.devices is {_get(cfg, 'trainer.devices')}; set --plan_devices=N "
                        "for another count")
    per_node, nodes = (world // nodes, nodes) if world % nodes == 0 else (world, 1)
    strategy_path = str(_get(cfg, "trainer.strategy.class_path", _get(cfg, "trainer.strategy", "")))
    fsdp = "ModelParallelStrategy" in strategy_path
    dp = world
    if not fsdp and "fsdp" in strategy_path.lower():
        notes.append(f"{strategy_path}: Lightning's FSDP (FSDP1) is planned as a replica per device; the GPU "
                     "recipes shard with ModelParallelStrategy (FSDP2)")
    if not fsdp and world > 1:
        notes.append("DDP keeps one more copy of the gradients (its buckets): not counted")
    if fsdp:
        dp, _ = data_parallel_size(world, _get(cfg, "trainer.strategy.init_args.data_parallel_size", "auto"),
                                   _get(cfg, "trainer.strategy.init_args.tensor_parallel_size", 1), per_node)
        if dp != world:
            notes.append(f"tensor_parallel_size {world // dp}: the model is not split by tensor parallelism; "
                         f"FSDP2 shards over the {dp} data-parallel ranks")
    data_vocab, vocab_note, unread = _vocab(cfg)
    recipe_vocab = _get(cfg, "model.config.vocab_size")
    if data_vocab is None and recipe_vocab not in (None, TransformerConfig.vocab_size):
        vocab, vocab_note = None, "model.config.vocab_size"
    else:
        vocab = data_vocab or ASSUMED_VOCAB
        notes += [unread] if unread else []
    module = build_module(cfg, vocab)
    parallel = module.parallel
    precision = str(_get(cfg, "trainer.precision", "32-true"))
    if fsdp:
        act_bytes = 2 if parallel.mixed_precision == "bf16" else 4
        master_bytes = 4
    else:
        act_bytes = 2 if precision.startswith(("bf16", "16")) else 4
        master_bytes = 2 if precision in ("bf16-true", "16-true") else 4
    from ..model.meta import meta_device

    with meta_device():  # tensors made of one Python number stay real (model/meta.py)
        model = module.build_model()
    count = count_parameters(model)
    opt = instantiate_optimizer(module.optimizer_factory, build_param_groups(model, module.param_groups))
    moments, opt_text, _ = optimizer_moments(opt)
    seq_len = module.config.seq_len
    micro = int(_get(cfg, "data.batch_size", 1))
    batch = resolve_global_batch(tokens=_get(cfg, TOKENS_KEY), sequences=_get(cfg, SEQUENCES_KEY), seq_len=seq_len,
                                 micro_batch=micro, data_parallel=dp, devices=per_node, num_nodes=nodes,
                                 accumulate_set=int(_get(cfg, "trainer.accumulate_grad_batches", 1) or 1))
    mem = memory_of(model, moments, dp if fsdp else 1, master_bytes, act_bytes, micro * seq_len,
                    parallel.activation_checkpointing, fsdp, module.strategy, parallel.reshard_after_forward)
    budget, label = device_memory(memory)
    steps = _get(cfg, "trainer.max_steps")
    return Plan(
        recipes=", ".join(str(getattr(c, "relative", c)) for c in (_get(cfg, "config") or []) if c is not None),
        devices=world, devices_note=devices_note, shards=dp if fsdp else 1, fsdp=fsdp, act_bytes=act_bytes,
        master_bytes=master_bytes, checkpointing=parallel.activation_checkpointing,
        reshard=parallel.reshard_after_forward, compile=module.compile,
        config=module.config, vocab_note=vocab_note, count=count,
        flops_per_token=module.config.flops_per_token(seq_len, count.active_non_embedding), micro_tokens=micro * seq_len,
        batch=batch, max_steps=steps if isinstance(steps, int) and steps > 0 else None, optimizer=opt_text,
        memory=mem, memory_budget=budget, memory_label=label, notes=notes)
