"""Helpers shared by the test files (plain functions and constants; the fixtures are in ``conftest.py``).

Test files import them as ``from helpers import ...`` (pytest puts ``tests/`` on ``sys.path``).
"""
from __future__ import annotations

import contextlib
import hashlib
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("PYTHONHASHSEED", "0")


def saved_storages(module, run) -> list[tuple[tuple, int]]:
    """``(shape, bytes)`` of each distinct storage autograd saves while ``run()`` runs (its first tensor's shape),
    the parameters and buffers of ``module`` excluded."""
    import torch

    fixed = {t.untyped_storage().data_ptr() for t in [*module.parameters(), *module.buffers()]}
    seen: dict[int, tuple] = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in fixed:
            seen.setdefault(st.data_ptr(), (tuple(t.shape), st.nbytes()))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return list(seen.values())


def recipe(*parts: str) -> str:
    return str(ROOT / "recipes" / Path(*parts))


SMOKE = recipe("smoke.yaml")

def tiny_config(**overrides):
    from scalevec_lit.model import TransformerConfig

    base = dict(vocab_size=4096, seq_len=32, n_layer=2, n_embd=64, n_head=4, n_kv_head=2)
    base.update(overrides)
    return TransformerConfig(**base)


def strategy_preset(name: str):
    """The ``ScaleStrategy`` of the preset ``recipes/strategy/<name>.yaml``, instantiated by jsonargparse as the
    command line does (without a recipe around it)."""
    import yaml
    from jsonargparse import ArgumentParser

    from scalevec_lit.scale.strategy import ScaleStrategy

    section = yaml.safe_load((ROOT / "recipes" / "strategy" / f"{name}.yaml").read_text())["model"]["strategy"]
    parser = ArgumentParser(exit_on_error=False)
    parser.add_argument("--strategy", type=ScaleStrategy)
    return parser.instantiate_classes(parser.parse_object({"strategy": section})).strategy


def run_cli(args: list[str], cwd: Path, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m scalevec_lit <args>`` in a subprocess from ``cwd`` (the repository on PYTHONPATH).

    It leads a session of its own (its ranks and loader workers are in it). One that has not ended after
    ``timeout`` seconds (every process holding its output counts: a rank or a worker left behind keeps the
    pipes open) fails the test with the Python stacks of every process still there (``hung_stacks``)."""
    env = {"PYTHONPATH": str(ROOT), **(env or {})}
    return run_session([sys.executable, "-m", "scalevec_lit", *args], cwd, timeout, env)


def run_session(command: list[str], cwd: Path, timeout: float, env: dict | None = None) -> subprocess.CompletedProcess:
    """``command`` (Python, unbuffered) as the leader of a new session, its output captured; ``run_cli``."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONFAULTHANDLER": "1", **(env or {})}
    with subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env=full_env, start_new_session=True) as proc:
        out, err = finish(proc, timeout)
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def finish(proc: subprocess.Popen, timeout: float, log: Path | None = None) -> tuple:
    """``proc.communicate()`` for a process started with ``start_new_session=True`` (and ``PYTHONFAULTHANDLER=1``
    in its environment, for stacks): one not ended after ``timeout`` s fails the test with ``hung_stacks``; ``log``
    is the file its output goes to, when not a pipe."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(hung_stacks(proc, timeout, log), pytrace=False)


def session_processes(sid: int) -> list[tuple[int, str]]:
    """``(pid, command line on one line)`` of every process in the session ``sid``, the leader first."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.getsid(int(entry.name)) == sid:
                cmd = " ".join((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode().split())
                found.append((int(entry.name), cmd[:200] or "(exited, not yet reaped)"))
        except (OSError, ProcessLookupError):
            continue
    return sorted(found, key=lambda p: (p[0] != sid, p[0]))


def hung_stacks(proc: subprocess.Popen, timeout: float, log: Path | None = None) -> str:
    """Why a run did not end: the processes of its session, then SIGABRT to each (``PYTHONFAULTHANDLER`` prints
    every thread's Python stack on stderr, or in ``log``), then SIGKILL to what is left; the text for the failure."""
    import signal

    alive = session_processes(proc.pid)
    for pid, _ in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGABRT)
    try:
        out, err = proc.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        out, err = "", "(no output after SIGABRT)"
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    if log is not None:
        err = Path(log).read_text(errors="replace") if Path(log).exists() else f"({log} missing)"
    listing = "\n".join(f"  {pid}: {cmd}" for pid, cmd in alive)
    return (f"did not end within {timeout} s (leader exit status: {proc.poll()}); processes still in its session:\n"
            f"{listing}\nstdout (end):\n{(out or '')[-2000:]}\nstderr with their stacks (end):\n{(err or '')[-16000:]}")


def smoke_args(data_dir: Path, root: Path, steps: int = 20, *extra: str) -> list[str]:
    """fit arguments for a short smoke run writing under ``root``."""
    return [
        "fit", "--config", str(ROOT / "recipes" / "smoke.yaml"),
        f"--data.data_dir={data_dir}", f"--trainer.max_steps={steps}",
        f"--trainer.default_root_dir={root}", f"--trainer.logger.init_args.save_dir={root}",
        "--trainer.val_check_interval=10", "--trainer.limit_val_batches=2",
        "--model.schedule.init_args.warmup_steps=2", "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false", *extra,
    ]


def print_config(*args: str) -> str:
    """In-process ``python -m scalevec_lit fit <args> --print_config``: the resolved YAML (no instantiation)."""
    import contextlib
    import io

    from scalevec_lit.cli import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), pytest.raises(SystemExit) as exit_info:
        main(["fit", *args, "--print_config"])
    assert exit_info.value.code in (0, None), buf.getvalue()
    return buf.getvalue()


def module_from_config(yaml_text: str):
    """Instantiate the ``model:`` section of a resolved recipe as a ``CausalLM`` (model not yet built)."""
    import yaml
    from jsonargparse import ArgumentParser

    from scalevec_lit.lit.module import CausalLM

    model_section = yaml.safe_load(yaml_text)["model"]
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(CausalLM, "model")
    cfg = parser.parse_object({"model": model_section})
    return parser.instantiate(cfg).model


def scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out: dict[str, list] = {}
    for events in sorted(logdir.rglob("events.out.tfevents.*")):
        acc = EventAccumulator(str(events), size_guidance={"scalars": 0})
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            out.setdefault(tag, []).extend((e.step, e.value) for e in acc.Scalars(tag))
    return out


# -- bad input: run a command in-process, check its one paragraph and that nothing outside its output changed
def file_hashes(*roots: Path, exclude: tuple[Path, ...] = ()) -> dict[str, str]:
    out = {}
    for root in roots:
        for p in sorted(Path(root).rglob("*")):
            if p.is_file() and not any(p == e or e in p.parents for e in exclude):
                out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def main_in_process(capfd, args: list[str]) -> tuple[int, str]:
    from scalevec_lit.cli import main

    try:
        main([str(a) for a in args])
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    out, err = capfd.readouterr()
    return code, out + err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gloo_rank(rank: int, fn, world: int, port: int, args: tuple) -> None:
    import gc

    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        fn(rank, world, *args)
        # fn's tensors, FSDP hooks and pending work are gone before the group is: no rank tears its gloo
        # threads down while another still talks to it (a rare SIGABRT at exit otherwise)
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def spawn_gloo(fn, world: int, *args, start_method: str = "spawn") -> None:
    """Run ``fn(rank, world, *args)`` in ``world`` processes joined by one gloo group on a free port.

    ``fn`` is a module-level function of a test file; the group is set up and torn down here (all ranks
    meet at a barrier first), so a worker holds only what it tests.
    """
    import torch.multiprocessing as mp

    mp.start_processes(_gloo_rank, args=(fn, world, free_port(), args), nprocs=world, join=True,
                       start_method=start_method)


def check(world, capfd, args: list, code: int, *parts: str) -> str:
    """Run ``args``; assert the exit code, one ``error:`` paragraph holding ``parts``, no traceback, no change."""
    if world.before is None:
        world.freeze()
    got, text = main_in_process(capfd, args)
    assert "Traceback" not in text, text[-3000:]
    assert got == code, (got, text[-3000:])
    if code:
        errors = [line for line in text.splitlines() if line.startswith("error: ")]
        assert len(errors) == 1, text[-3000:]
        for part in parts:
            assert part in errors[0], (part, errors[0])
    else:
        for part in parts:
            assert part in text, (part, text[-3000:])
    world.unchanged()
    return text


def fit(world, *extra) -> list:
    return smoke_args(world.data, world.path / "out", 2, "--trainer.limit_val_batches=0", *extra)


# -- the command line and the recipe (exit 2) ---------------------------------------------------------


# -- second derivatives: tiny float64 models and their objective as a function of one vector -------------
def hessian_model(preset: str, moe: bool, index: int = 0, experts: tuple[int, int, int] = (4, 2, 8),
                  **shape):
    """A tiny float64 model of ``preset`` (``recipes/strategy/``) in eval mode with its scales moved off 1, for
    second-derivative tests (test_double_backward.py, test_sharpness.py); ``experts``: (number, top-k,
    intermediate size) of a MoE variant, which ``index`` varies (per-expert scales, shared experts, bias
    balancing)."""
    import torch
    import yaml

    from scalevec_lit.model import Transformer
    from scalevec_lit.model.config import MoEConfig
    from scalevec_lit.model.spec import strategy_from_dict
    from scalevec_lit.scale import scale_parameters

    strat = strategy_from_dict(yaml.safe_load((ROOT / "recipes" / "strategy" / f"{preset}.yaml").read_text())
                               ["model"]["strategy"])
    moe_cfg = None
    if moe:  # the preset's index varies per-expert scales, shared experts and bias balancing
        moe_cfg = MoEConfig(num_experts=experts[0], top_k=experts[1], expert_intermediate_size=experts[2],
                            aux_loss_coef=0.01, z_loss_coef=0.001, bias_balancing=bool(index % 2),
                            num_shared_experts=index // 2 % 2,
                            scales="expert" if index % 3 == 0 and not strat.branch_specific else "shared")
    cfg = dict(vocab_size=32, seq_len=8, n_layer=1, n_embd=16, n_head=2, n_kv_head=1, intermediate_size=16,
               moe=moe_cfg)
    cfg.update(shape)
    model = Transformer(tiny_config(**cfg), strat).double().eval()  # eval: no balancing update between passes
    with torch.no_grad():  # scales away from 1 (γ = 1 hides a scale applied twice or not at all)
        for sp in scale_parameters(model):
            sp.param.add_(0.3 * torch.randn_like(sp.param))
    return model


def flat_objective(model, idx):
    """The training objective (cross-entropy plus MoE losses) of ``model`` on ``idx`` as a function of one flat
    parameter vector (the trainable parameters in order), and that vector."""
    import torch
    import torch.nn.functional as F

    names = [n for n, p in model.named_parameters() if p.requires_grad]
    shapes = [p.shape for _, p in model.named_parameters() if p.requires_grad]
    theta = torch.cat([p.detach().flatten() for _, p in model.named_parameters() if p.requires_grad])

    def f(flat: torch.Tensor) -> torch.Tensor:
        parts, start = {}, 0
        for n, s in zip(names, shapes):
            parts[n] = flat[start:start + s.numel()].view(s)
            start += s.numel()
        logits = torch.func.functional_call(model, parts, (idx[:, :-1],))
        loss = F.cross_entropy(logits.flatten(0, 1), idx[:, 1:].flatten())
        aux = model.aux_losses()
        return loss + sum(aux.values()) if aux else loss

    return f, theta


def probe_logits(model) -> "torch.Tensor":
    """The float64 logits of a model (cast in place) on one fixed batch of 2x24 tokens below 128."""
    import torch
    with torch.no_grad():
        return model.double()(torch.randint(0, 128, (2, 24), generator=torch.Generator().manual_seed(1)))


def max_rel(a, b) -> float:
    """max |a - b| relative to max |b|."""
    return float((a - b).abs().max() / b.abs().max())
