"""The runs the extension suite shares (``tests/test_extension_suite.py``, ``tests/test_extension_cases.py``): the
user extensions of ``tests/extensions/`` with their recipes, each fitted once per session (2 steps, in-process),
and the comparisons the tests make. Test files import it as ``from extension_runs import ...``.
"""
from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path

import torch

from helpers import ROOT, smoke_args

EXT = ROOT / "tests" / "extensions"
#: name -> (recipe, what it is: block / model / vector, the class it names)
EXTENSIONS = {
    "temperature": ("temperature.yaml", "model", "extensions.models.TemperatureTransformer"),
    "residual": ("residual_block.yaml", "block", "extensions.blocks.ResidualScaleBlock"),
    "sandwich": ("sandwich_block.yaml", "block", "extensions.blocks.SandwichBlock"),
    "plain_norm": ("plain_norm_block.yaml", "block", "extensions.blocks.PlainNormSandwichBlock"),
    "gelu_mlp": ("gelu_mlp_block.yaml", "block", "extensions.blocks.GeluMLPBlock"),
    "own_attention": ("own_attention_block.yaml", "block", "extensions.blocks.PlainAttentionBlock"),
    "cache_blind": ("cache_blind_block.yaml", "block", "extensions.blocks.CacheBlindBlock"),
    "softcap": ("softcap.yaml", "model", "extensions.models.SoftCapTransformer"),
    "softplus": ("softplus_scale.yaml", "vector", "extensions.scales.SoftplusScale"),
    "tanh": ("tanh_scale.yaml", "vector", "extensions.scales.TanhScale"),
    # the shipped one-norm parallel block, chosen from YAML as a user block is
    "one_norm_parallel": (str(ROOT / "recipes" / "examples" / "parallel_one_norm.yaml"), "block",
                          "scalevec_lit.model.parallel.OneNormParallelBlock"),
}
SMALL = ["--model.config.n_layer=2", "--model.config.seq_len=32", "--data.batch_size=4",
         "--trainer.num_sanity_val_steps=0", "--trainer.limit_val_batches=1"]
#: the strategy file whose conversion is a copy (the recipe's own strategy)
SAME_STRATEGY = {"softplus": EXT / "softplus_scale.yaml", "tanh": EXT / "tanh_scale.yaml"}
BASELINE = ROOT / "recipes" / "strategy" / "baseline.yaml"


def fit_args(data: Path, root: Path, steps: int, *extra: str) -> list[str]:
    return smoke_args(data, root, steps, *SMALL, *extra)


def recipe(name: str) -> str:
    return str(EXT / EXTENSIONS[name][0])


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


_RUNS: dict[str, dict] = {}


def fitted(name: str, data: Path, tmp_path_factory) -> dict:
    """One 2-step fit per extension (in-process, once per session): the module, its .ckpt, what it printed."""
    if name not in _RUNS:
        from scalevec_lit.cli import main

        root = tmp_path_factory.mktemp(name)
        lines, err = _Lines(), io.StringIO()
        logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
        logger.addHandler(lines)
        try:
            with contextlib.redirect_stderr(err):
                cli = main(fit_args(data, root, 2, "--config", recipe(name)))
        finally:
            logger.removeHandler(lines)
        _RUNS[name] = {"name": name, "kind": EXTENSIONS[name][1], "root": root, "cli": cli,
                       "model": cli.model.model.eval(), "ckpt": root / "checkpoints" / "last.ckpt",
                       "lines": lines.lines, "stderr": err.getvalue(), "data": data}
    return _RUNS[name]


def tokens(model, n: int = 12) -> torch.Tensor:
    return torch.randint(0, model.config.vocab_size, (2, n), generator=torch.Generator().manual_seed(5))


@torch.no_grad()
def assert_same_function(loaded, trained) -> None:
    """Same class, same parameters, bitwise the same logits (the same computation on the same weights)."""
    assert type(loaded) is type(trained)
    assert {k: v.shape for k, v in loaded.state_dict().items()} == {k: v.shape for k, v in trained.state_dict().items()}
    idx = tokens(trained)
    assert torch.equal(loaded.eval()(idx), trained(idx))
