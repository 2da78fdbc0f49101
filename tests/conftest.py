"""Shared fixtures: the embedded corpus prepared once per session, tiny configs, a CLI runner."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("PYTHONHASHSEED", "0")


@pytest.fixture(scope="session")
def prepared_data(tmp_path_factory) -> Path:
    """The embedded Shakespeare corpus, tokenized with the embedded tokenizer, in a temp folder."""
    from scalevec_lit.data.prepare import prepare

    out = tmp_path_factory.mktemp("data") / "shakespeare"
    prepare(output_dir=out, num_workers=1)
    return out


def tiny_config(**overrides):
    from scalevec_lit.model import TransformerConfig

    base = dict(vocab_size=4096, seq_len=32, n_layer=2, n_embd=64, n_head=4, n_kv_head=2)
    base.update(overrides)
    return TransformerConfig(**base)


def run_cli(args: list[str], cwd: Path, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run ``python -m scalevec_lit <args>`` in a subprocess from ``cwd`` (the repository on PYTHONPATH)."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "scalevec_lit", *args], cwd=cwd, capture_output=True, text=True, timeout=timeout,
        env=full_env,
    )


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


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


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


def recipe(*parts: str) -> str:
    return str(ROOT / "recipes" / Path(*parts))
