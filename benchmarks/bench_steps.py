"""What the step benchmarks share (``benchmarks/overhead.py``, ``benchmarks/compiled.py``): the smoke model as a
``CausalLM`` with a preset's strategy, its optimizer and batches, one training step in plain PyTorch
(``PlainStep``) and the plain-Llama reference's (``ReferenceStep``), what a step keeps (saved bytes, state,
allocator peak), interleaved timing rounds and their quartiles, and the machine's one-line description.
Imports the library; the library must not import this file.
"""
from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


#: model-config overrides and batch size per ``--shape`` (smoke: recipes/smoke.yaml as it is)
SHAPES = {
    "smoke": ({}, 16, 128),
    "d256": ({"n_embd": 256, "n_layer": 6, "n_head": 4, "n_kv_head": None, "head_dim": None,
              "intermediate_size": None}, 8, 256),
}


def build_module(preset: str, data_dir: str, seed: int = 0, config: dict | None = None):
    """A ``CausalLM`` from recipes/smoke.yaml's ``model`` section with the preset's strategy, model built."""
    import yaml
    from jsonargparse import ArgumentParser

    from scalevec_lit.data.datamodule import TokenDataModule
    from scalevec_lit.lit.module import CausalLM

    model = yaml.safe_load((ROOT / "recipes" / "smoke.yaml").read_text())["model"]
    model.setdefault("config", {}).update(config or {})
    model["strategy"] = yaml.safe_load((ROOT / "recipes" / "strategy" / f"{preset}.yaml").read_text())["model"]["strategy"]
    model["vocab_size"] = TokenDataModule(data_dir=data_dir).vocab_size
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(CausalLM, "model")
    module = parser.instantiate(parser.parse_object({"model": model})).model
    torch.manual_seed(seed)
    module.configure_model()
    return module


def optimizer_of(module, max_steps: int = 100_000):
    module.schedule.with_max_steps(max_steps)  # outside a Trainer the schedule needs its length
    conf = module.configure_optimizers()
    return conf["optimizer"], conf["lr_scheduler"]["scheduler"]


def batches(data_dir: str, batch_size: int, n: int, seed: int = 0, seq_len: int = 128) -> list[torch.Tensor]:
    from scalevec_lit.data.datamodule import TokenDataModule

    dm = TokenDataModule(data_dir=data_dir, seq_len=seq_len, batch_size=batch_size, seed=seed)
    dm.setup("fit")
    it = iter(dm.train_dataloader())
    return [next(it) for _ in range(n)]


class PlainStep:
    """The plain PyTorch training step over a ``CausalLM``'s model (the same math as Lightning's)."""

    def __init__(self, module) -> None:
        self.module = module
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.opt, self.sched = optimizer_of(module)
        module.train()

    def __call__(self, batch: torch.Tensor) -> float:
        loss, _ = self.module._loss(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.sched.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()


class ReferenceStep:
    """The same step over ``benchmarks/plain_llama.py``'s model of the module's shape."""

    def __init__(self, module) -> None:
        from plain_llama import PlainLlama, plain_optimizer

        c = module.model.config
        torch.manual_seed(0)
        self.model = PlainLlama(c.vocab_size, c.n_embd, c.n_layer, c.n_head, c.n_kv_head, c.intermediate_size,
                                c.seq_len, c.rope_theta)
        self.module = self.model
        self.params = [p for p in self.model.parameters()]
        self.opt = plain_optimizer(self.model)
        self.model.train()

    def __call__(self, batch: torch.Tensor) -> float:
        logits = self.model(batch[:, :-1].long())
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].long().flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.params, 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()


def saved_bytes(step, batch: torch.Tensor) -> tuple[int, float]:
    """Bytes of the distinct storages autograd saves in one training step (parameters and buffers
    excluded): the total, and per token per block (what is saved while a block's forward runs)."""
    model = step.module.model if hasattr(step.module, "model") else step.module
    fixed = {t.untyped_storage().data_ptr() for t in [*model.parameters(), *model.buffers()]}
    seen: dict[int, int] = {}
    in_block: dict[int, int] = {}
    state = {"block": False}
    hooks = []
    for block in model.blocks:
        hooks.append(block.register_forward_pre_hook(lambda m, a: state.__setitem__("block", True)))
        hooks.append(block.register_forward_hook(lambda m, a, o: state.__setitem__("block", False)))

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in fixed:
            seen[st.data_ptr()] = st.nbytes()
            if state["block"]:
                in_block[st.data_ptr()] = st.nbytes()
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            step(batch)
    finally:
        for h in hooks:
            h.remove()
    tokens = batch.shape[0] * (batch.shape[1] - 1)
    return sum(seen.values()), sum(in_block.values()) / tokens / len(model.blocks)


def state_bytes(step: PlainStep) -> int:
    n = sum(p.numel() * p.element_size() for p in step.params)
    for st in step.opt.state.values():
        n += sum(v.numel() * v.element_size() for v in st.values() if torch.is_tensor(v))
    return n


def step_peak_bytes(step: PlainStep, batch: torch.Tensor) -> int:
    """Peak of the running sum of allocator events during one step (grads are None at its start)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step(batch)
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events() if e.name() == "[memory]")
    run = peak = 0
    for _, nbytes in events:
        run += nbytes
        peak = max(peak, run)
    return peak


def quartiles(xs: list[float]) -> tuple[float, float, float]:
    if len(xs) < 2:
        return (float("nan"),) * 3
    q = statistics.quantiles(xs, n=4)
    return q[0], statistics.median(xs), q[2]


def interleaved_times(steps: dict, names: list[str], data: list, rounds: int, warmup: int) -> dict[str, list[float]]:
    """Seconds per step of every variant, interleaved (the order rotates each round); warm-up rounds dropped."""
    times: dict[str, list[float]] = {n: [] for n in names}
    for r in range(warmup + rounds):
        order = names[r % len(names):] + names[: r % len(names)]
        batch = data[r % len(data)]
        for n in order:
            t0 = time.perf_counter()
            steps[n](batch)
            if r >= warmup:
                times[n].append(time.perf_counter() - t0)
    return times


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {torch.get_num_threads()} thread(s)"
