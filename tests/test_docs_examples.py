"""Every Python example of the README and the guides runs, as the page shows it: a page's ```python blocks
run in order in one namespace (a later block uses an earlier one's classes), in a folder holding what the
page's commands would have written before them (a smoke run, its exports). What the examples build is then
used as the page says: a scale vector's inverse round-trips, a block trains forward, an adapter registers.
A block marked ```python placeholder (the reader's own names) is left out, and there is none today."""
from __future__ import annotations

import re
import sys
import types

import pytest
import torch

from helpers import ROOT, main_in_process, tiny_config

USER_PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "development.md")]
FAST = ["--trainer.max_steps=2", "--trainer.val_check_interval=2", "--trainer.limit_val_batches=1",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false"]


def python_blocks(page) -> list[str]:
    return [body for info, body in re.findall(r"^```python([^\n]*)\n(.*?)^```", page.read_text(), re.M | re.S)
            if "placeholder" not in info.split()]


def run_page(name: str) -> dict:
    """Run the page's blocks in order in a module of their own (so that classes they define have a module
    to be found in, as a user's package would); its namespace."""
    module = types.ModuleType(f"docs_example_{name.replace('-', '_').replace('.', '_')}")
    sys.modules[module.__name__] = module
    try:
        for number, block in enumerate(python_blocks(ROOT / "docs" / name), 1):
            try:
                exec(compile(block, f"docs/{name} (python block {number})", "exec"), module.__dict__)
            except Exception as err:
                raise AssertionError(f"docs/{name}: python block {number} fails: {err!r}\n{block}") from err
    finally:
        sys.modules.pop(module.__name__, None)
    return module.__dict__


def test_every_python_example_is_run_here():
    pages = {p.name for p in USER_PAGES if python_blocks(p)}
    assert pages == {"subclassing.md", "strategies.md", "export.md"}, "a page with examples no test here runs"


def _defined(ns: dict, base: type) -> list[type]:
    return [v for v in ns.values() if isinstance(v, type) and issubclass(v, base) and v is not base
            and v.__module__.startswith("docs_example_")]


def test_the_subclassing_examples_build_train_forward_and_invert():
    from scalevec_lit.arch import architectures, unregister
    from scalevec_lit.model import Block, Transformer
    from scalevec_lit.scale import ScaleSite, ScaleStrategy, ScaleVector

    before = {a.architecture for a in architectures()}
    ns = run_page("subclassing.md")
    added = {a.architecture for a in architectures()} - before
    try:
        vectors, blocks = _defined(ns, ScaleVector), _defined(ns, Block)
        assert vectors and blocks and _defined(ns, ScaleSite) and _defined(ns, Transformer)
        for cls in vectors:  # γ -> set_gamma_(γ') -> γ', or False and nothing changed
            v = cls(6)
            with torch.no_grad():
                target = (v().double() * torch.linspace(0.5, 2.0, 6, dtype=torch.float64)).float()
                if v.set_gamma_(target):
                    # the parameter rounded to float32 moves γ by at most ~1 ulp of it (softplus-like maps), plus the
                    # forward's own few roundings: 8 ulp
                    torch.testing.assert_close(v(), target, rtol=8 * torch.finfo(torch.float32).eps, atol=0.0)
                if cls.invertible():
                    kept = v().clone()
                    assert v.set_gamma_(-torch.ones(6)) is False and torch.equal(v(), kept), cls.__name__
        torch.manual_seed(0)
        idx = torch.randint(0, 4096, (2, 16))
        for cls in blocks:
            model = Transformer(tiny_config(), ScaleStrategy(), block=cls)
            logits = model(idx)
            assert logits.shape == (2, 16, 4096) and torch.isfinite(logits).all(), cls.__name__
            logits.float().logsumexp(-1).mean().backward()
            assert all(p.grad is not None for p in model.parameters() if p.requires_grad), cls.__name__
        for cls in _defined(ns, Transformer):
            model = cls(tiny_config(), ScaleStrategy(), Block)
            assert torch.isfinite(model(idx)).all() and model.init_args, cls.__name__
        assert added, "the adapter example registers its architecture"
    finally:
        for name in added:
            unregister(name)
    # the registry is the process's: an adapter left in it shows up in every later message that lists them
    assert {a.architecture for a in architectures()} == before


@pytest.fixture(scope="module")
def smoke_runs(tmp_path_factory, prepared_data):
    """A folder where the smoke runs, the unified run and the exports the pages name were made."""
    folder = tmp_path_factory.mktemp("examples")
    (folder / "data" / "prepared").mkdir(parents=True)
    (folder / "data" / "prepared" / "shakespeare").symlink_to(prepared_data, target_is_directory=True)
    return folder


@pytest.mark.slow
def test_the_strategies_and_export_examples_run_on_a_smoke_run(smoke_runs, monkeypatch, capfd):
    monkeypatch.chdir(smoke_runs)
    ckpt = "runs/smoke/version_0/checkpoints/last.ckpt"
    for argv in (["fit", "--config", "recipes/smoke.yaml", *FAST],
                 ["fit", "--config", "recipes/smoke.yaml", "--config", "recipes/strategy/unified.yaml", *FAST],
                 ["export", "--ckpt", ckpt, "--out", "exported/smoke"],
                 ["export", "--ckpt", ckpt, "--format", "native", "--out", "exported/smoke-native"]):
        code, out = main_in_process(capfd, argv)
        assert code == 0, (argv, out[-3000:])
    ns = run_page("strategies.md")
    assert ns["folded"] is not ns["model"]
    ns = run_page("export.md")
    assert ns["model"] is not None
