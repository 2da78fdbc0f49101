"""The checks of a study file, made in full before any run: every key's type and value, every recipe and config
file it names, its variants, claims, secondary endpoints and power. A mistake is one ``UserError`` (exit 2):
``error: <study file>: <key>: <value>: <what is wrong>; <the fix>``.

``validate(raw, path)`` returns the checked values (plain data, no ``Study``); ``spec.load_study`` builds the
study from them. The callbacks' arguments are checked by ``callback_check`` (it imports the callbacks, so it
runs in a subprocess). Plain Python: no torch, no Lightning, nothing of ``study/`` imported here.
"""
from __future__ import annotations

import difflib
import math
from pathlib import Path
from typing import Any, Optional

from ..errors import UserError

STUDY_KEYS = {"name", "base", "args", "seeds", "variants", "callbacks", "decay", "baseline", "out", "claims",
              "dynamics", "keep_checkpoints", "description", "lrs", "lr_arg", "lr_from", "endpoint_evals",
              "primary", "alpha", "preregistration", "secondary", "power"}
VARIANT_KEYS = {"name", "configs", "args", "decay", "lrs"}
CLAIM_KEYS = {"title", "reference", "paper", "note", "expect"}
SECONDARY_KEYS = {"tag", "evals", "expect", "reference", "name", "log"}
POWER_KEYS = {"mde", "pilot_sd", "level", "endpoint", "source"}
LR_ARG = "--model.optimizer.init_args.lr"


def _show(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= 80 else text[:77] + "..."


def bad(path: Path, key: str, value: Any, problem: str, fix: str) -> UserError:
    """``<study file>: <key>: <value>: <problem>; <fix>`` (exit 2)."""
    return UserError(f"{path}: {key}", _show(value), problem, fix)


def _unknown(path: Path, where: str, keys: set, allowed: set) -> None:
    for key in sorted(map(str, keys - allowed)):
        close = difflib.get_close_matches(key, sorted(allowed), n=1, cutoff=0.6)
        fix = f"did you mean `{close[0]}`?" if close else f"the keys are {', '.join(sorted(allowed))}"
        raise bad(path, f"{where}{key}", key, "unknown key", fix)


def _str(path: Path, key: str, value: Any, fix: str = "write it as text") -> str:
    if not isinstance(value, (str, int, float)) or isinstance(value, bool):
        raise bad(path, key, value, "must be text", fix)
    return str(value)


def _list(path: Path, key: str, value: Any, example: str) -> list:
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad(path, key, value, "must be a list", f"write it as {example}")
    return value


def _int(path: Path, key: str, value: Any, least: int, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise bad(path, key, value, f"must be an integer of at least {least}", fix)
    return value


def _number(path: Path, key: str, value: Any, fix: str, positive: bool = True) -> float:
    try:
        x = float(value) if not isinstance(value, bool) else float("nan")
    except (TypeError, ValueError):
        raise bad(path, key, value, "not a number", fix) from None
    if not math.isfinite(x) or (positive and x <= 0):
        raise bad(path, key, value, "must be a finite number above 0" if positive else "must be finite", fix)
    return x


def _args(path: Path, key: str, value: Any) -> list[str]:
    out = []
    for i, a in enumerate(_list(path, key, value, "[--trainer.max_steps=200, ...]")):
        if isinstance(a, (dict, list)) or not str(a).startswith("--"):
            raise bad(path, f"{key}[{i}]", a, "not a command-line option of fit",
                      "write each as --<key>=<value>, e.g. --trainer.max_steps=200")
        out.append(str(a))
    return out


def _files(path: Path, key: str, value: Any) -> list[str]:
    from ..recipe_lookup import recipe_path

    value = [value] if isinstance(value, str) else _list(path, key, value, "[recipes/smoke.yaml]")
    out = []
    for i, f in enumerate(value):
        name = _str(path, f"{key}[{i}]", f, "give the path of a YAML file")
        if not recipe_path(name).is_file():  # recipes/...: a shipped recipe where no such file is here
            raise bad(path, f"{key}[{i}]", name, "no such file (paths are relative to the folder you run from)",
                      "correct the path, e.g. recipes/strategy/baseline.yaml, or run from the repository's root")
        out.append(name)
    return out


def _lrs(path: Path, key: str, value: Any) -> list[float]:
    return [_number(path, f"{key}[{i}]", x, "write learning rates as numbers, e.g. lrs: [1.0e-3, 3.0e-3]")
            for i, x in enumerate(_list(path, key, value, "[1.0e-3, 3.0e-3]"))]


def _variants(path: Path, raw: Any) -> list[dict]:
    items = _list(path, "variants", raw, "a list of {name, configs, args, decay, lrs}")
    if not items:
        raise bad(path, "variants", raw, "no variants", "list at least one, e.g. variants: [{name: baseline}]")
    out = []
    for i, v in enumerate(items):
        key = f"variants[{i}]"
        if not isinstance(v, dict) or "name" not in v:
            raise bad(path, key, v, "a variant needs a name", "write it as {name: baseline, configs: [...]}")
        _unknown(path, f"{key}.", set(v), VARIANT_KEYS)
        name = _str(path, f"{key}.name", v["name"])
        key = f"variants[{name}]"
        out.append({"name": name, "configs": _files(path, f"{key}.configs", v.get("configs")),
                    "args": _args(path, f"{key}.args", v.get("args")),
                    "decay": None if v.get("decay") is None else _str(path, f"{key}.decay", v["decay"]),
                    "lrs": None if v.get("lrs") is None else _lrs(path, f"{key}.lrs", v["lrs"])})
    names = [v["name"] for v in out]
    for n in names:
        if names.count(n) > 1:
            raise bad(path, "variants", n, "two variants with this name", "give every variant its own name")
    return out


def _variant_name(path: Path, key: str, value: Any, names: list[str]) -> str:
    if value not in names:
        close = difflib.get_close_matches(str(value), names, n=1)
        raise bad(path, key, value, "not a variant of this study",
                  f"did you mean {close[0]!r}?" if close else f"name one of {', '.join(names)}")
    return value


def _seeds(path: Path, raw: Any) -> list[int]:
    seeds = _list(path, "seeds", [1] if raw is None else raw, "[1, 2, 3]")
    out = []
    for i, s in enumerate(seeds):
        if isinstance(s, bool) or not isinstance(s, int):
            raise bad(path, f"seeds[{i}]", s, "not an integer seed", "write the seeds as integers, e.g. seeds: [1, 2, 3]")
        out.append(s)
    if not out or len(set(out)) != len(out):
        raise bad(path, "seeds", seeds, "must list at least one seed, each once", "e.g. seeds: [1, 2, 3]")
    return out


def _claims(path: Path, raw: Any, names: list[str], baseline: str) -> list[dict]:
    out = []
    for i, c in enumerate(_list(path, "claims", raw, "a list of {title, expect: {variant: lower}}")):
        if not isinstance(c, dict) or "title" not in c:
            raise bad(path, f"claims[{i}]", c, "a claim needs a title", "write it as {title: ..., expect: {v: lower}}")
        _unknown(path, f"claims[{i}].", set(c), CLAIM_KEYS)
        _variant_name(path, f"claims[{i}].reference", c.get("reference", baseline), names)
        expect = c.get("expect") or {}
        if not isinstance(expect, dict):
            raise bad(path, f"claims[{i}].expect", expect, "must map variants to lower or higher",
                      "e.g. expect: {no_scale: higher}")
        for v, direction in expect.items():
            _variant_name(path, f"claims[{i}].expect", v, names)
            if direction not in ("lower", "higher"):
                raise bad(path, f"claims[{i}].expect.{v}", direction, "must be lower or higher", "write lower or higher")
        out.append(dict(c))
    return out


def check_secondary(raw: object, path: Path, variants: list[str], baseline: str) -> list[dict]:
    """The ``secondary`` list of a study file, checked (unknown keys, variants, directions)."""
    out = []
    for i, item in enumerate(_list(path, "secondary", raw, "a list of {tag, evals, expect}")):
        if not isinstance(item, dict) or "tag" not in item:
            raise bad(path, f"secondary[{i}]", item, "a secondary endpoint needs `tag`",
                      f"write it as {{tag: ..., evals: 2}} with only {', '.join(sorted(SECONDARY_KEYS))}")
        _unknown(path, f"secondary[{i}].", set(item), SECONDARY_KEYS)
        ref = _variant_name(path, f"secondary[{i}].reference", item.get("reference", baseline), variants)
        for name, direction in (item.get("expect") or {}).items():
            _variant_name(path, f"secondary[{i}].expect", name, variants)
            if direction not in ("lower", "higher"):
                raise bad(path, f"secondary[{i}].expect.{name}", direction, "must be lower or higher",
                          "write lower or higher")
        evals = _int(path, f"secondary[{i}].evals", item.get("evals", 3), 1, "e.g. evals: 2")
        out.append({"tag": str(item["tag"]), "evals": evals, "expect": dict(item.get("expect") or {}),
                    "reference": ref, "name": str(item.get("name", item["tag"])), "log": bool(item.get("log", False))})
    return out


def check_power(raw: object, path: Path, tags: list[str]) -> Optional[dict]:
    if raw is None:
        return None
    if not isinstance(raw, dict) or "mde" not in raw:
        raise bad(path, "power", raw, "power needs `mde`", f"write {{mde: 0.03, pilot_sd: 0.02}} with only "
                  f"{', '.join(sorted(POWER_KEYS))}")
    _unknown(path, "power.", set(raw), POWER_KEYS)
    mde = _number(path, "power.mde", raw["mde"], "mde must be > 0: the smallest effect to detect, e.g. 0.03")
    level = _number(path, "power.level", raw.get("level", 0.8), "e.g. level: 0.8")
    if not 0.5 <= level < 1.0:
        raise bad(path, "power.level", level, "must be in [0.5, 1)", "e.g. level: 0.8")
    sd = raw.get("pilot_sd")
    endpoint = raw.get("endpoint", "primary")
    if endpoint != "primary" and endpoint not in tags:
        raise bad(path, "power.endpoint", endpoint, "neither `primary` nor a secondary tag",
                  f"name primary or one of {tags}")
    return {"mde": mde, "pilot_sd": None if sd is None else _number(path, "power.pilot_sd", sd, "e.g. 0.02"),
            "level": level, "endpoint": endpoint, "source": str(raw.get("source", ""))}


def validate(raw: Any, path: Path) -> dict:
    """Every value of a study file, checked; the keyword arguments of ``spec.Study`` (without ``path``)."""
    if not isinstance(raw, dict):
        raise bad(path, "(the file)", type(raw).__name__, "a study file is a YAML mapping",
                  "start from recipes/ablation/claim1_lr_cpu.yaml")
    _unknown(path, "", set(raw), STUDY_KEYS)
    variants = _variants(path, raw.get("variants"))
    names = [v["name"] for v in variants]
    baseline = _variant_name(path, "baseline", raw.get("baseline", "baseline"), names)
    name = _str(path, "name", raw.get("name", path.stem))
    primary = raw.get("primary", "best_lr")
    if primary not in ("best_lr", "pooled"):
        raise bad(path, "primary", primary, "primary must be best_lr or pooled", "write primary: best_lr or pooled")
    lr_from = raw.get("lr_from")
    if lr_from is not None and (not isinstance(lr_from, dict) or "study" not in lr_from or set(lr_from) - {"study", "variant"}):
        raise bad(path, "lr_from", lr_from, "lr_from needs {study: <name>, variant: <name>}",
                  "e.g. lr_from: {study: claim1_lr_cpu, variant: baseline}")
    alpha = _number(path, "alpha", raw.get("alpha", 0.05), "e.g. alpha: 0.05")
    if alpha >= 1:
        raise bad(path, "alpha", alpha, "must be below 1", "e.g. alpha: 0.05")
    callbacks = raw.get("callbacks") or {}
    if not isinstance(callbacks, dict):
        raise bad(path, "callbacks", callbacks, "must map class paths to their arguments",
                  "e.g. callbacks: {scalevec_lit.callbacks.ScaleVectorMonitor: {every_n_steps: 10}}")
    for class_path, init_args in callbacks.items():
        if not isinstance(class_path, str) or "." not in class_path:
            raise bad(path, "callbacks", class_path, "not a class path", "e.g. scalevec_lit.callbacks.SharpnessMonitor")
        if init_args is not None and not isinstance(init_args, dict):
            raise bad(path, f"callbacks.{class_path}", init_args, "must map argument names to values",
                      "e.g. {every_n_steps: 10}")
    secondary = check_secondary(raw.get("secondary"), path, names, baseline)
    dynamics = [_variant_name(path, "dynamics", v, names) for v in _list(path, "dynamics", raw.get("dynamics"), "[baseline]")]
    keep = raw.get("keep_checkpoints", False)
    if not isinstance(keep, bool):
        raise bad(path, "keep_checkpoints", keep, "must be true or false", "write keep_checkpoints: true")
    lr_arg = _str(path, "lr_arg", raw.get("lr_arg", LR_ARG))
    if not lr_arg.startswith("--"):
        raise bad(path, "lr_arg", lr_arg, "not a command-line option", f"e.g. {LR_ARG}")
    return {
        "name": name, "base": _files(path, "base", raw.get("base")), "args": _args(path, "args", raw.get("args")),
        "seeds": _seeds(path, raw.get("seeds")), "variants": variants, "callbacks": {k: dict(v or {}) for k, v in callbacks.items()},
        "decay": _str(path, "decay", raw.get("decay", "iwd")), "baseline": baseline,
        "out": _str(path, "out", raw.get("out") or f"results/{name}/runs"),
        "claims": _claims(path, raw.get("claims"), names, baseline), "dynamics": dynamics, "keep_checkpoints": keep,
        "lrs": _lrs(path, "lrs", raw.get("lrs")), "lr_arg": lr_arg, "lr_from": lr_from,
        "endpoint_evals": _int(path, "endpoint_evals", raw.get("endpoint_evals", 2), 1, "e.g. endpoint_evals: 2"),
        "primary": primary, "alpha": alpha, "preregistration": str(raw.get("preregistration") or ""),
        "description": str(raw.get("description") or ""), "secondary": secondary,
        "power": check_power(raw.get("power"), path, [s["tag"] for s in secondary]),
    }
