"""``compile: true`` compiles each block without ``fullgraph`` (a user's block with a break still trains), and
fit names every graph break after the first step (``lit/parallel.graph_break_report``): the shipped presets
compile whole (``tests/test_compile.py``), so any break is the user's, and silent fragmentation would cost
speed (and, on a GPU, host syncs) without a word."""
from __future__ import annotations

import pytest
import torch

from helpers import main_in_process, smoke_args
from scalevec_lit.lit.parallel import graph_break_report

# slow: each test fits with compile: true (inductor compiles the blocks)
pytestmark = pytest.mark.slow

SMALL = ["--model.config.n_layer=1", "--model.config.seq_len=32", "--data.batch_size=2",
         "--trainer.num_sanity_val_steps=0", "--trainer.limit_val_batches=0", "--model.compile=true"]


@pytest.fixture()
def fresh_dynamo():
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    yield
    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()


def test_the_report_names_the_break(fresh_dynamo):
    assert graph_break_report() is None

    def f(x):
        y = x * 2
        torch._dynamo.graph_break()
        return y + 1

    torch.compile(f, backend="eager")(torch.ones(3))
    report = graph_break_report()
    assert report is not None and "1 graph break(s)" in report and "graph_break" in report
    assert "torch._dynamo.explain" in report and "model.compile: false" in report


@pytest.mark.parametrize("block, breaks", [(None, False), ("extensions.blocks.GraphBreakBlock", True)],
                         ids=["shipped", "user_block_with_a_break"])
def test_fit_warns_only_when_a_block_breaks(block, breaks, prepared_data, tmp_path, capfd, recwarn, fresh_dynamo):
    extra = [f"--model.block={block}"] if block else []
    code, text = main_in_process(capfd, smoke_args(prepared_data, tmp_path, 1, *SMALL, *extra))
    assert code == 0, text[-3000:]
    warned = [str(w.message) for w in recwarn if "torch.compile broke the compiled blocks" in str(w.message)]
    assert len(warned) == int(breaks), [str(w.message) for w in recwarn]
    if breaks:
        assert "graph_break" in warned[0]
