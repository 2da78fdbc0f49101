"""``fit --print_plan``'s memory counts against what a real CPU step keeps (``scalevec_lit/lit/plan_count.py``,
``lit/activations.py``; the command and the parameter counts: ``tests/test_plan.py``).

- activations: the per-token count of saved tensors against the bytes autograd saves in a measured CPU step
  (``saved_tensors_hooks``, distinct storages, parameters and buffers excluded) within 1%, fp32 and bf16,
  dense and MoE, for the presets whose saved tensors differ;
- weights, gradients and optimizer state: exact against a real model after one step (AdamW, MuonAdamW), and
  the FSDP2 shards of two gloo processes as planned.
"""
from __future__ import annotations

import pytest
import torch

from helpers import strategy_preset, tiny_config

TOLERANCE = 0.01  # the count leaves out a few O(d) tensors per block (scale-vector temporaries)


# -- activations -----------------------------------------------------------------------------------------------
def _measured_saved(model, idx):
    """Bytes autograd saves while each block runs (key: block index) and outside the blocks (key: None)."""
    fixed = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    where, saved = {"block": None}, {}
    for i, block in enumerate(model.blocks):
        block.register_forward_pre_hook(lambda m, a, i=i: where.__setitem__("block", i))
        block.register_forward_hook(lambda m, a, o: where.__setitem__("block", None))

    def pack(t):
        storage = t.untyped_storage()
        if storage.data_ptr() not in fixed:
            saved.setdefault(where["block"], {})[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(idx)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), idx.flatten())
    loss.backward()
    return {k: sum(v.values()) for k, v in saved.items()}


MOE = dict(num_experts=4, top_k=2, expert_intermediate_size=32, num_shared_experts=1, router="sigmoid",
           bias_balancing=True, first_dense_layers=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("moe", [None, MOE, dict(MOE, num_experts=8, top_k=3, num_shared_experts=0, router="softmax",
                                                  bias_balancing=False, first_dense_layers=0)],
                         ids=["dense", "moe_sigmoid_shared", "moe_softmax"])
@pytest.mark.parametrize("preset", ["baseline", "hg", "dp", "unified", "unified_dnp_vup", "sandwich"])
def test_activation_count_matches_a_measured_cpu_step(preset, moe, dtype):
    from scalevec_lit.lit.activations import block_saved_per_token, head_saved_per_token
    from scalevec_lit.model.config import MoEConfig
    from scalevec_lit.model.transformer import Transformer

    config = tiny_config(seq_len=64, vocab_size=256, n_embd=64, n_head=4, n_kv_head=2, intermediate_size=192,
                         moe=MoEConfig(**moe) if moe else None)
    strategy = strategy_preset(preset)
    torch.manual_seed(0)
    model = Transformer(config, strategy).to(dtype)
    batch, s = 4, dtype.itemsize
    measured = _measured_saved(model, torch.randint(0, config.vocab_size, (batch, config.seq_len)))
    tokens = batch * config.seq_len
    for layer in range(config.n_layer):  # on CPU RMSNorm keeps an fp32 copy of its input: n = 4
        estimate = tokens * block_saved_per_token(config, strategy, layer, s, n=4, accelerator=False)
        assert abs(estimate - measured[layer]) <= TOLERANCE * measured[layer], (layer, estimate, measured[layer])
    head = tokens * head_saved_per_token(config, s, n=4)
    assert abs(head - measured[None]) <= TOLERANCE * measured[None], (head, measured[None])


def _alive_after_forward(model, idx) -> int:
    """Bytes allocated and not freed during the forward and the loss (the CPU allocator's events). The garbage
    collector is run before and held off during the window: a collection inside it frees tensors that earlier
    tests left in reference cycles, which the allocator's events count as negative bytes. A full run once read
    -231,848 bytes alive with activation checkpointing (not reproduced alone): an impossible reading is taken
    again, up to three times, and the last one is asserted on."""
    import gc

    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):  # a forward cannot leave negative bytes alive: such a reading is the profiler's, not ours
        gc.collect()
        gc.disable()
        try:
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                loss = torch.nn.functional.cross_entropy(model(idx).flatten(0, 1).float(), idx.flatten())
        finally:
            gc.enable()
        alive = sum(e.nbytes() for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
        loss.backward()
        model.zero_grad(set_to_none=True)
        if alive > 0:
            break
    return alive


@pytest.mark.parametrize("moe", [None, MOE], ids=["dense", "moe"])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_activations_alive_after_the_forward_with_and_without_checkpointing(moe, checkpointing):
    from scalevec_lit.lit.activations import INT64, block_saved_per_token, saved_per_token
    from scalevec_lit.lit.parallel import ParallelOptions, parallelize
    from scalevec_lit.model.config import MoEConfig
    from scalevec_lit.model.transformer import Transformer

    config = tiny_config(seq_len=64, vocab_size=256, n_embd=64, n_head=4, n_kv_head=2, intermediate_size=192,
                         n_layer=4, moe=MoEConfig(**moe) if moe else None)
    model = Transformer(config)
    parallelize(model, None, ParallelOptions(activation_checkpointing=checkpointing))
    idx = torch.randint(0, config.vocab_size, (4, config.seq_len))
    alive = _alive_after_forward(model, idx)
    blocks, head = saved_per_token(config, model.strategy, 4, checkpointing, accelerator=False)
    if checkpointing:  # the block inputs only; the recomputed block comes in the backward
        blocks -= max(block_saved_per_token(config, model.strategy, i, 4, accelerator=False)
                      for i in range(config.n_layer))
    estimate = idx.numel() * (blocks + head - INT64)  # the token ids existed before the forward
    assert abs(estimate - alive) <= TOLERANCE * alive, (estimate, alive)


def test_the_count_gives_the_benchmarked_bytes_per_token_per_block():
    """benchmarks/RESULTS.md (benchmarks/overhead.py, measured): smoke 9,752 B (baseline), 9,776 (dnp), 11,808
    (sandwich); d256 19,480 (baseline)."""
    from scalevec_lit.lit.activations import block_saved_per_token
    from scalevec_lit.model.config import TransformerConfig

    smoke = TransformerConfig(seq_len=128, n_layer=4, n_embd=128, n_head=4, n_kv_head=2)
    d256 = TransformerConfig(seq_len=256, n_layer=6, n_embd=256, n_head=4)
    got = [block_saved_per_token(c, strategy_preset(p), 0, 4, accelerator=False) for c, p in
           [(smoke, "baseline"), (smoke, "dnp"), (smoke, "sandwich"), (d256, "baseline")]]
    assert got == [9752, 9776, 11808, 19480]


def test_activation_checkpointing_keeps_the_block_inputs_and_one_block():
    from scalevec_lit.lit.activations import block_saved_per_token, saved_per_token

    config, strategy = tiny_config(), strategy_preset("baseline")
    plain, head = saved_per_token(config, strategy, 2, checkpointing=False)
    kept, head_ac = saved_per_token(config, strategy, 2, checkpointing=True)
    one = block_saved_per_token(config, strategy, 0, 2)
    assert plain == config.n_layer * one and head == head_ac
    assert kept == config.n_layer * 2 * config.n_embd + one


# -- weights, gradients, optimizer state -----------------------------------------------------------------------
@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
@pytest.mark.parametrize("moe", [None, MOE], ids=["dense", "moe"])
def test_weights_gradients_and_optimizer_state_exact_after_one_step(optimizer, moe):
    from scalevec_lit.lit.optim import MuonAdamW, build_param_groups, instantiate_optimizer
    from scalevec_lit.lit.plan_count import memory_of, optimizer_moments
    from scalevec_lit.model.config import MoEConfig
    from scalevec_lit.model.transformer import Transformer

    config = tiny_config(moe=MoEConfig(**moe) if moe else None)
    strategy = strategy_preset("unified")

    def factory(groups):
        if optimizer == "adamw":
            return torch.optim.AdamW(groups, lr=1e-3)
        return MuonAdamW(groups, lr=1e-3)

    with torch.device("meta"):
        meta = Transformer(config, strategy)
    moments, _, known = optimizer_moments(instantiate_optimizer(factory, build_param_groups(meta)))
    planned = memory_of(meta, moments, 1, 4, 4, 1, False, False, strategy)
    torch.manual_seed(0)
    model = Transformer(config, strategy)
    opt = instantiate_optimizer(factory, build_param_groups(model))
    idx = torch.randint(0, config.vocab_size, (2, config.seq_len))
    torch.nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.flatten()).backward()
    opt.step()
    params = list(dict.fromkeys(model.parameters()))
    weights = sum(p.numel() * p.element_size() for p in params)
    grads = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    state = sum(v.numel() * v.element_size() for st in opt.state.values() for k, v in st.items()
                if torch.is_tensor(v) and k != "step")
    assert known and (planned.weights, planned.gradients, planned.optimizer) == (weights, grads, state)


def _sharded_worker(rank: int, world: int, out: str) -> None:
    """FSDP2 over ``world`` gloo ranks: rank 0's local bytes of weights, gradients and AdamW state after one step."""
    import json

    from torch.distributed.device_mesh import init_device_mesh

    from scalevec_lit.lit.parallel import ParallelOptions, parallelize
    from scalevec_lit.model.config import MoEConfig
    from scalevec_lit.model.transformer import Transformer

    torch.manual_seed(0)
    model = Transformer(tiny_config(vocab_size=4095, n_embd=72, n_head=4, n_kv_head=2, intermediate_size=100, moe=MoEConfig(**MOE)))
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("data_parallel",))
    parallelize(model, mesh, ParallelOptions())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, 4095, (2, 32))
    torch.nn.functional.cross_entropy(model(idx).flatten(0, 1), idx.flatten()).backward()
    opt.step()
    local = [p.to_local() for p in model.parameters()]
    sizes = {"weights": sum(t.numel() * t.element_size() for t in local),
             "gradients": sum(p.grad.to_local().numel() * p.grad.to_local().element_size() for p in model.parameters()),
             "optimizer": sum(v.to_local().numel() * v.to_local().element_size() for st in opt.state.values()
                              for k, v in st.items() if k != "step")}
    if rank == 0:
        with open(out, "w") as f:
            json.dump(sizes, f)


@pytest.mark.slow
def test_fsdp2_shards_of_weights_gradients_and_optimizer_state_as_planned(tmp_path):
    """Rank 0 holds the largest shard (``ceil(rows / N)`` rows): its bytes are the plan's, exactly."""
    import json

    from helpers import spawn_gloo

    from scalevec_lit.lit.plan_count import memory_of, optimizer_moments
    from scalevec_lit.model.config import MoEConfig
    from scalevec_lit.model.transformer import Transformer

    out = tmp_path / "sizes.json"
    spawn_gloo(_sharded_worker, 2, str(out))
    config = tiny_config(vocab_size=4095, n_embd=72, n_head=4, n_kv_head=2, intermediate_size=100, moe=MoEConfig(**MOE))
    with torch.device("meta"):
        meta = Transformer(config)
    moments, _, _ = optimizer_moments(torch.optim.AdamW(meta.parameters(), lr=1e-3))
    planned = memory_of(meta, moments, 2, 4, 4, 1, False, True, meta.strategy)
    assert json.loads(out.read_text()) == {"weights": planned.weights, "gradients": planned.gradients,
                                           "optimizer": planned.optimizer}


def test_shards_are_whole_rows_padded_to_equal_parts():
    from scalevec_lit.lit.plan_count import shard_numel

    assert [shard_numel(torch.Size(s), n) for s, n in [((5, 3), 2), ((8, 3), 8), ((3,), 4), ((), 8)]] == [9, 3, 1, 1]
