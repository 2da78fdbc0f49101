"""The API reference: which public names it documents, grouped into pages, and the Markdown of each page.

One list drives both the site (``tools/build_docs.py`` writes ``api/*.md`` from it, and mkdocstrings renders
each class and function from its docstring) and the check that every public name has a documented contract
(``tests/test_api_reference.py``). A module listed without names contributes every name of its ``__all__``;
``scalevec_lit.callbacks`` contributes every public callback module's ``__all__``.
"""
from __future__ import annotations

import importlib
import inspect
import pkgutil
from dataclasses import dataclass


@dataclass(frozen=True)
class Page:
    slug: str
    title: str
    intro: str
    modules: tuple[tuple[str, tuple[str, ...]], ...]  # (module, names); no names: the module's __all__


PAGES = (
    Page("scale", "Scale vectors and norm sites",
         "The scale vector (the gain of a norm), the sites that hold them, the strategy that places them, and "
         "folding. Subclass `ScaleVector` for a new parameterization and `NormSite` for a new place.",
         (("scalevec_lit.scale", ()), ("scalevec_lit.scale.convert", ("copy_scales_",)))),
    Page("model", "Model: blocks and configuration",
         "The plain-PyTorch Transformer, its blocks (subclass `Block` and override `build_attention`, "
         "`build_mlp` or `forward`), its configuration and parameter counting.",
         (("scalevec_lit.model", ()), ("scalevec_lit.model.spec", ("spec_of",)))),
    Page("lit", "LightningModule, schedules and optimizers",
         "`CausalLM` wraps the model for Lightning; the schedules and `MuonAdamW` are chosen from a recipe.",
         (("scalevec_lit.lit", ()), ("scalevec_lit.lit.optim", ("MuonAdamW",)),
          ("scalevec_lit.lit.progress", ("StepProgressBar",)))),
    Page("callbacks", "Callbacks",
         "Every callback a recipe names; import each as `scalevec_lit.callbacks.<Name>` (a recipe's "
         "`class_path: scalevec_lit.callbacks.ScaleVectorMonitor`).",
         (("scalevec_lit.callbacks", ()),)),
    Page("data", "Data",
         "The data module a recipe's `data:` section configures, and the tokenizer.",
         (("scalevec_lit.data.datamodule", ("TokenDataModule",)),
          ("scalevec_lit.data.tokenizer", ("Tokenizer", "train_bpe")))),
    Page("arch", "Architecture adapters",
         "How a Hugging Face architecture maps onto the native model, for `import`, `export` and `convert`; "
         "`register` adds one.",
         (("scalevec_lit.arch", ()),)),
    Page("export", "Checkpoints, export and import",
         "Reading checkpoints, exporting to the native and Hugging Face formats, importing and converting.",
         (("scalevec_lit.checkpoint", ()), ("scalevec_lit.export", ()), ("scalevec_lit.hub", ()))),
    Page("evaluate", "Generate, evaluate and inspect",
         "Text generation, the lm-eval adapter and the scale-vector inspector, for use from Python; import each "
         "name from `scalevec_lit.generate`, `scalevec_lit.evaluate` or `scalevec_lit.inspect`.",
         (("scalevec_lit.generate", ("generate", "Sampling")), ("scalevec_lit.evaluate", ()),
          ("scalevec_lit.inspect", ()))),
)


def _callback_modules() -> list[str]:
    package = importlib.import_module("scalevec_lit.callbacks")
    return [f"scalevec_lit.callbacks.{m.name}" for m in pkgutil.iter_modules(package.__path__)
            if not m.name.startswith("_")]


def names_of(module: str, names: tuple[str, ...]) -> list[tuple[str, str]]:
    """(defining module as documented, name) for each public name of ``module`` (or the ``names`` given)."""
    if module == "scalevec_lit.callbacks":
        out = []
        for sub in _callback_modules():
            out += [(sub, n) for n in importlib.import_module(sub).__all__]
        return out
    mod = importlib.import_module(module)
    return [(module, n) for n in (names or tuple(mod.__all__))]


def documented(page: Page) -> list[tuple[str, str, object]]:
    """(module, name, object) for every name ``page`` documents, each name once (the first module wins)."""
    seen, out = set(), []
    for module, names in page.modules:
        for where, name in names_of(module, names):
            obj = getattr(importlib.import_module(where), name)
            key = (id(obj), name) if inspect.isclass(obj) or inspect.isfunction(obj) else (where, name)
            if key in seen:
                continue
            seen.add(key)
            out.append((where, name, obj))
    return out


def is_api(obj) -> bool:
    """A class or function gets its own entry (and must have a docstring); anything else is a constant."""
    return inspect.isclass(obj) or inspect.isfunction(obj)


def source_path(module: str, name: str, obj) -> tuple[str, bool]:
    """(the path mkdocstrings reads the object at, whether its heading shows only the bare name).

    A name the module holds itself is read where users import it. A name the module hands out lazily
    (through a module ``__getattr__``, so that importing it stays light) is read where it is defined, and the
    callbacks where their source lives (the repository's top-level ``callbacks/`` folder, which the install
    maps to ``scalevec_lit.callbacks``); those headings show the bare name, the page says the import path."""
    if module.startswith("scalevec_lit.callbacks."):
        return f"{module[len('scalevec_lit.'):]}.{name}", True
    if name in vars(importlib.import_module(module)):
        return f"{module}.{name}", False
    return f"{obj.__module__}.{obj.__qualname__}", True


def anchor(module: str, name: str, obj) -> str:
    """The ``id`` mkdocstrings gives the object's heading on its page."""
    return source_path(module, name, obj)[0]


def page_markdown(page: Page) -> str:
    lines = [f"# {page.title}", "", page.intro, ""]
    constants = []
    for module, name, obj in documented(page):
        if is_api(obj):
            path, bare = source_path(module, name, obj)
            lines += [f"::: {path}", *(["    options:", "      show_root_full_path: false"] if bare else []), ""]
        else:
            constants.append((module, name, obj))
    if constants:
        lines += ["## Constants", "", "| name | value |", "|---|---|"]
        for module, name, obj in constants:
            value = repr(obj).replace("|", "\\|").replace("\n", " ")
            value = value if len(value) <= 90 else value[:87] + "..."
            lines.append(f"| `{module}.{name}` | `{value}` |")
        lines.append("")
    return "\n".join(lines)


def index_markdown() -> str:
    lines = ["# API reference", "",
             "Every public class and function a user calls or subclasses, generated from the docstrings in the "
             "code. Import paths are as shown; a recipe names a class by the same path (`class_path:`).", "",
             "| page | what it holds |", "|---|---|"]
    lines += [f"| [{p.title}]({p.slug}.md) | {p.intro} |" for p in PAGES]
    return "\n".join(lines) + "\n"
