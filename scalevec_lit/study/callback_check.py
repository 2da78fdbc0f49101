"""The callbacks' arguments of every run of a study, checked before the first run: each class is imported and
built from its arguments (types by jsonargparse, as ``fit`` does, then the class's own checks), once per
distinct callback of the grid. Importing the callbacks imports torch and Lightning, so the check runs in one
subprocess (``python -m scalevec_lit.study.callback_check``, JSON on stdin and stdout) and the study process
stays small.

``check_callbacks(study)`` raises one ``UserError`` (exit 2) naming the study file, the key the argument came
from (``callbacks.<class>.<arg>``, a variant's ``decay``, or the base recipe) and the fix.
"""
from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys

from .checks import bad
from .spec import RWD, Study, run_callbacks


def _where(study: Study, variant, class_path: str, arg: str) -> str:
    if class_path == RWD and arg == "preset" and "preset" not in (study.callbacks.get(RWD) or {}):
        return f"variants[{variant.name}].decay" if variant.decay else "decay"
    if arg in (study.callbacks.get(class_path) or {}) or (class_path in study.callbacks and not arg):
        return f"callbacks.{class_path}" + (f".{arg}" if arg else "")
    return f"the callbacks of {', '.join(study.base)} ({class_path}{'.' + arg if arg else ''})"


def check_callbacks(study: Study) -> None:
    """Build every distinct callback of the study's runs in a subprocess; the first problem as a ``UserError``."""
    items, seen = [], set()
    for variant in study.variants:
        for cb in run_callbacks(study, variant):
            key = json.dumps(cb, sort_keys=True, default=str)
            if key not in seen:
                seen.add(key)
                items.append({"variant": variant.name, "class_path": cb.get("class_path"),
                              "init_args": cb.get("init_args") or {}})
    if not items:
        return
    proc = subprocess.run([sys.executable, "-m", "scalevec_lit.study.callback_check"], input=json.dumps(items),
                          capture_output=True, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    lines = proc.stdout.strip().splitlines()
    try:
        problems = json.loads(lines[-1])
    except (IndexError, ValueError):
        tail = " / ".join((proc.stderr or proc.stdout).strip().splitlines()[-3:])
        raise bad(study.path, "callbacks", "", f"the check of the callbacks failed (exit {proc.returncode}): {tail}",
                  "run the check with --debug, or run one run's fit command by hand") from None
    for p in problems:
        variant = study.variant(p["variant"])
        raise bad(study.path, _where(study, variant, p["class_path"], p.get("arg", "")), p["value"], p["problem"],
                  p["fix"])


def _check_one(item: dict) -> dict | None:
    """The first problem of building one callback from its arguments (``None``: it builds)."""
    import importlib
    import inspect

    class_path, init_args = item["class_path"], item["init_args"]
    module, _, name = str(class_path).rpartition(".")
    try:
        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError) as err:
        return {**item, "value": class_path, "problem": f"no such callback class ({type(err).__name__}: {err})",
                "fix": "give its full class path, e.g. scalevec_lit.callbacks.SharpnessMonitor"}
    params = inspect.signature(cls).parameters
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    for arg in init_args:
        if arg not in params and not takes_any:
            close = difflib.get_close_matches(arg, list(params), n=1, cutoff=0.6)
            return {**item, "arg": arg, "value": arg, "problem": f"not an argument of {name}",
                    "fix": f"did you mean {close[0]!r}?" if close else f"its arguments are {', '.join(params)}"}
    from jsonargparse import ArgumentParser

    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(cls, "cb", fail_untyped=False)
    try:
        cfg = parser.parse_object({"cb": dict(init_args)})
        parser.instantiate_classes(cfg)
    except Exception as err:  # noqa: BLE001 - any refusal is reported with the argument it names
        text = " ".join(str(err).split())
        arg = next((a for a in init_args if f"cb.{a}" in text or f"'{a}'" in text or f"{name}.{a}" in text), "")
        text = text.replace('"cb.', f'"{name}.').replace("'cb.", f"'{name}.")
        first = text.split(". ")[0]
        problem, _, fix = first.partition("; ")  # the library's own sentence, and its fix when it gives one
        return {**item, "arg": arg, "value": init_args.get(arg, "") if arg else "",
                "problem": problem if len(problem) <= 300 else problem[:297] + "...",
                "fix": fix or f"give {name} a valid value" + (f" for {arg}" if arg else "") + " (see its docstring)"}
    return None


def main() -> None:
    items = json.loads(sys.stdin.read())
    problems = [p for p in (_check_one(item) for item in items) if p is not None]
    print(json.dumps(problems, default=str))


if __name__ == "__main__":
    main()
