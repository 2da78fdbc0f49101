"""The installed package (issue 35): the sdist and the wheel built from it hold every file of the package
(every module, the callbacks, the embedded corpus, every recipe), and the wheel, installed into a fresh
virtual environment outside the source tree, runs there: prepare, a short fit by recipe name, generate,
export, inspect, and an import of every public module.

The fresh environment gets its dependencies (torch, Lightning, ...) from this environment's site-packages
through a ``.pth`` line (nothing is downloaded) and the wheel itself installed with ``--no-deps``; a
``.pth`` line does not run this environment's editable-install hook, so the source tree is not importable
there, which the test checks (``scalevec_lit.__file__`` inside the fresh environment).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pytest

from helpers import ROOT

pytestmark = pytest.mark.slow

SOURCES = ("pyproject.toml", "README.md", "scalevec_lit", "callbacks", "recipes")
WHEEL_DIR = {"scalevec_lit": "scalevec_lit", "callbacks": "scalevec_lit/callbacks", "recipes": "scalevec_lit/recipes"}


def package_files(root: Path) -> dict[str, str]:
    """Every file the package is made of: its path in the source tree ``root`` -> its path in the wheel (caches
    and build records left out)."""
    out = {}
    for folder, target in WHEEL_DIR.items():
        for path in (root / folder).rglob("*"):
            rel = path.relative_to(root / folder)
            if path.is_file() and "__pycache__" not in rel.parts and path.suffix != ".pyc" \
                    and not any(p.endswith(".egg-info") for p in rel.parts):
                out[f"{folder}/{rel.as_posix()}"] = f"{target}/{rel.as_posix()}"
    return out


def _python(*code_or_args: str, cwd: Path, **kw) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.setdefault("OMP_NUM_THREADS", "1")
    return subprocess.run(list(code_or_args), cwd=cwd, env=env, capture_output=True, text=True, timeout=600, **kw)


def _ok(proc: subprocess.CompletedProcess) -> str:
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{proc.args}\n{text[-4000:]}"
    return text


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict:
    """The sdist built from a copy of the sources, and the wheel built from the unpacked sdist."""
    tmp = tmp_path_factory.mktemp("build")
    src, dist = tmp / "src", tmp / "dist"
    src.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        else:
            shutil.copy2(ROOT / name, src / name)
    build = "import setuptools.build_meta as b, sys; name = getattr(b, sys.argv[1])(sys.argv[2]); print('built:', name)"

    def built_name(text: str) -> str:
        return next(line.split(" ", 1)[1] for line in text.splitlines() if line.startswith("built: "))

    sdist = dist / built_name(_ok(_python(sys.executable, "-c", build, "build_sdist", str(dist), cwd=src)))
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp / "unpacked", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    unpacked = next((tmp / "unpacked").iterdir())
    wheel = dist / built_name(_ok(_python(sys.executable, "-c", build, "build_wheel", str(dist), cwd=unpacked)))
    return {"sdist": sdist, "wheel": wheel, "tmp": tmp, "src": src}


def test_the_sdist_and_the_wheel_hold_every_file_of_the_package(built):
    files = package_files(built["src"])  # the sources as copied for the build (others may edit the tree meanwhile)
    expected = set(files.values())
    assert {"scalevec_lit/callbacks/scale_monitor.py", "scalevec_lit/recipes/smoke.yaml",
            "scalevec_lit/recipes/strategy/unified.yaml", "scalevec_lit/data/corpus/tokenizer.json"} <= expected
    with zipfile.ZipFile(built["wheel"]) as whl:
        names = {n for n in whl.namelist() if not n.startswith("scalevec_lit-")}
        entry_points = next(whl.read(n).decode() for n in whl.namelist() if n.endswith("entry_points.txt"))
    assert sorted(expected - names) == []  # a file missing from the wheel
    assert sorted(names - expected) == []  # nothing else (no tests, benchmarks, caches)
    assert "scalevec-lit = scalevec_lit.console:main" in entry_points
    with tarfile.open(built["sdist"]) as tar:
        in_sdist = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    assert sorted(set(files) - in_sdist) == [] and {"pyproject.toml", "README.md"} <= in_sdist


@pytest.fixture(scope="module")
def venv(built) -> Path:
    """A fresh virtual environment with the wheel installed (no dependencies downloaded)."""
    env_dir = built["tmp"] / "venv"
    _ok(_python(sys.executable, "-m", "venv", "--without-pip", str(env_dir), cwd=built["tmp"]))
    python = env_dir / "bin" / "python"
    site = Path(_ok(_python(str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])",
                            cwd=built["tmp"])).strip())
    (site / "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")  # torch & co, not scalevec_lit
    _ok(_python(str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--ignore-installed", "--no-compile",
                "-q", str(built["wheel"]), cwd=built["tmp"]))
    return env_dir


CHECK = r'''
import importlib, json, sys, zipfile
import scalevec_lit
from scalevec_lit.cli import main
from scalevec_lit.recipe_lookup import recipe_root

wheel, ckpt = sys.argv[1], sys.argv[2]
modules = sorted({n[:-3].replace("/", ".").removesuffix(".__init__") for n in zipfile.ZipFile(wheel).namelist()
                  if n.endswith(".py") and not n.endswith("__main__.py")})
public = [m for m in modules if not any(part.startswith("_") for part in m.split("."))]
for name in public:
    importlib.import_module(name)
import scalevec_lit.callbacks as cb
names = [n for m in public if m.startswith("scalevec_lit.callbacks.") for n in importlib.import_module(m).__all__]
callbacks = sorted(n for n in names if getattr(cb, n) is not None)  # YAML's class_path: scalevec_lit.callbacks.X
main(["generate", "--ckpt", ckpt, "--prompt", "ROMEO:", "--max-new-tokens", "4"])
main(["export", "--ckpt", ckpt, "--out", "exported/smoke"])
main(["inspect", ckpt])
main(["recipes", "copy", "strategy/unified", "mine.yaml"])
for i, spelling in enumerate(("strategy/hg", "recipes/strategy/hg.yaml")):  # one rule for names, installed too
    main(["convert", "--ckpt", ckpt, "--strategy", spelling, "--out", f"converted{i}"])
print("found:", json.dumps({"file": scalevec_lit.__file__, "recipes": str(recipe_root()), "public": public,
                            "callbacks": callbacks, "path": sys.path}))
'''


def test_the_installed_wheel_runs_outside_the_source_tree(venv, built, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    cli = str(venv / "bin" / "scalevec-lit")  # the console script, as a user runs it
    text = _ok(_python(cli, "prepare", "--num-workers", "1", cwd=work))
    assert "prepared data/prepared/shakespeare" in text
    text = _ok(_python(cli, "fit", "--config", "smoke", "--trainer.max_steps=2", "--trainer.limit_val_batches=0",
                       "--trainer.enable_progress_bar=false", cwd=work))
    assert "run folder: runs/smoke/version_0" in text and "Transformer: parameters: 1,836,160 total" in text
    ckpt = work / "runs/smoke/version_0/checkpoints/last.ckpt"
    assert ckpt.is_file()
    # generate, export, inspect, recipes copy and every public module's import, in one process (cheaper)
    text = _ok(_python(str(venv / "bin" / "python"), "-c", CHECK, str(built["wheel"]), str(ckpt), cwd=work))
    found = json.loads(next(line[len("found: "):] for line in text.splitlines() if line.startswith("found: ")))
    assert Path(found["file"]).resolve().is_relative_to(venv.resolve()), found["file"]  # not the source tree
    assert Path(found["recipes"]).resolve() == Path(found["file"]).resolve().parent / "recipes"
    assert not any(Path(p).resolve() == ROOT.resolve() for p in found["path"] if p)
    assert {"scalevec_lit.callbacks.scale_monitor", "scalevec_lit.cli", "scalevec_lit.lit.module"} <= set(found["public"])
    assert {"SafeModelCheckpoint", "ScaleVectorMonitor", "RoleWeightDecay", "MoELoadMonitor", "DownstreamEval"} \
        <= set(found["callbacks"])
    assert "ROMEO:" in text and "attn_input" in text  # generate's continuation, inspect's table
    assert (work / "exported/smoke/config.json").is_file() and (work / "exported/smoke/model.safetensors").is_file()
    assert (work / "mine.yaml").read_bytes() == (built["src"] / "recipes/strategy/unified.yaml").read_bytes()
    assert "last.ckpt to strategy/hg" in text and "last.ckpt to recipes/strategy/hg.yaml" in text
    assert all((work / f"converted{i}").exists() for i in (0, 1))
