"""Every command the README and docs/*.md show is checked, in process and without running it: the
subcommand exists, its options parse (``--print_config`` for fit/validate/test, the command's own argparse
parser for the others), the recipes, scripts and other repository paths it names exist, ``make`` targets
exist in the Makefile, and relative links between the pages resolve. The Quick start is run for real by
``tests/test_quickstart.py``.

What a page must mark, in the fence's info string (```` ```bash gpu ````):

- ``gpu``: the commands need GPUs (a recipe whose ``trainer.accelerator`` is ``gpu``); a fit/validate/test
  command resolving to a GPU accelerator outside such a block fails here (``--print_plan`` needs none);
- ``placeholder``: the commands name the reader's files (``my_texts/``, ``my.yaml``): ``--config`` files that
  do not exist are left out of the parse and other paths are not checked;
- ``text`` (or any fence whose commands are not meant to be typed, e.g. a usage synopsis with ``[...]``):
  not checked.

A failure names the page, the line and the command.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from helpers import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELLS = {"", "bash", "sh", "shell", "console"}
MARKERS = {"gpu", "placeholder"}
CLI = ("python -m scalevec_lit", ".venv/bin/python -m scalevec_lit", "scalevec-lit ")  # the console script too
TRACKED = ("recipes/", "benchmarks/", "launch/", "scalevec_lit/", "docs/", "tests/", "results/", "callbacks/", "tools/")
LIGHTNING = ("fit", "validate", "test")
ENV = re.compile(r"^[A-Z_][A-Z0-9_]*=\S*$")


@dataclass
class Command:
    page: Path
    line: int
    text: str
    words: list[str]
    marks: frozenset

    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}: {self.text}"


def commands_in(page: Path) -> list[Command]:
    """The commands of ``page``'s shell fences: ``$ `` prompts and leading ``VAR=value`` dropped, ``\\``
    continuations joined, ``#`` comments removed."""
    found, fence, marks, pending = [], None, frozenset(), None
    for number, line in enumerate(page.read_text().splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            if fence is None:
                info = stripped[3:].split()
                fence = info[0] if info else ""
                marks = frozenset(info[1:]) & MARKERS
            else:
                fence = None
            continue
        if fence not in SHELLS:
            continue
        if pending is not None:
            start, text = pending
            text += " " + stripped.rstrip("\\").strip()
            pending = (start, text) if stripped.endswith("\\") else None
        else:
            text = stripped[2:] if stripped.startswith("$ ") else stripped
            if not (text.startswith(CLI) or text.startswith(("make ", "python ", "bash ", "sbatch ")) or
                    re.match(r"^[A-Z_]+=\S* ", text)):
                continue
            start = number
            if text.endswith("\\"):
                pending = (start, text.rstrip("\\").strip())
                continue
        if pending is None:
            words = [w for w in shlex.split(text, comments=True)]
            while words and ENV.match(words[0]):
                words = words[1:]
            if words:
                found.append(Command(page, start, text, words, marks))
    return found


ALL = [c for page in PAGES for c in commands_in(page)]


def _id(c: Command) -> str:
    return f"{c.page.name}:{c.line}"


class _Parsed(BaseException):
    """Raised by the patched ``ArgumentParser.parse_args`` once a command's options parsed."""


@pytest.fixture()
def parse_only(monkeypatch):
    original = argparse.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):
        raise _Parsed(original(self, args, namespace))

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_args)


def _paths(c: Command) -> list[str]:
    values = [w.split("=", 1)[1] if w.startswith("--") and "=" in w else w for w in c.words]
    return [v for v in values if v.startswith(TRACKED)]


def _check_paths(c: Command) -> None:
    if "placeholder" in c.marks:
        return
    for value in _paths(c):
        if not (list(ROOT.glob(value)) if any(ch in value for ch in "*?[") else (ROOT / value).exists()):
            pytest.fail(f"{c.where()}\n  names {value!r}, which is not in the repository "
                        "(fix the path, or mark the block ```bash placeholder``` if it is the reader's file)")


def _drop_missing_configs(c: Command, args: list[str]) -> list[str]:
    if "placeholder" not in c.marks:
        return args
    out, skip = [], False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg == "--config" and i + 1 < len(args) and not (ROOT / args[i + 1]).exists():
            skip = True
            continue
        out.append(arg)
    return out


def _fit_like(c: Command, sub: str, args: list[str], monkeypatch) -> None:
    from scalevec_lit.cli import main

    monkeypatch.chdir(ROOT)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), pytest.raises(SystemExit) as ex:
        main([sub, *_drop_missing_configs(c, args), "--print_config"])
    if ex.value.code not in (0, None):
        pytest.fail(f"{c.where()}\n  does not parse (exit {ex.value.code}): {err.getvalue()[-1500:]}")
    accelerator = str((yaml.safe_load(out.getvalue()) or {}).get("trainer", {}).get("accelerator"))
    if accelerator in ("gpu", "cuda") and "gpu" not in c.marks and "--print_plan" not in args:
        pytest.fail(f"{c.where()}\n  runs on GPUs only (trainer.accelerator: {accelerator}): mark its block "
                    "```bash gpu```")


def _argparse_command(c: Command, module: str, args: list[str]) -> None:
    from scalevec_lit.errors import UserError

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            importlib.import_module(module).main(args)
        except _Parsed:
            return
        except SystemExit as ex:
            pytest.fail(f"{c.where()}\n  its options do not parse (exit {ex.code}): {err.getvalue()[-1500:]}")
        except UserError as ex:  # errors.CommandLineParser's one line
            pytest.fail(f"{c.where()}\n  its options do not parse: {ex}")
    pytest.fail(f"{c.where()}\n  {module}.main returned without parsing its options")


@pytest.mark.parametrize("c", ALL, ids=_id)
def test_documented_command(c: Command, parse_only, monkeypatch):
    from scalevec_lit.checks import check_command
    from scalevec_lit.cli import EXTRA_COMMANDS
    from scalevec_lit.errors import UserError

    _check_paths(c)
    words = c.words
    if words[0] == "scalevec-lit":  # the console script is python -m scalevec_lit
        words = ["python", "-m", "scalevec_lit", *words[1:]]
    if words[0] == "make":
        targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
        for target in [w for w in words[1:] if "=" not in w]:
            assert target in targets, f"{c.where()}\n  the Makefile has no target {target!r} ({sorted(targets)})"
        return
    if words[:3] in (["python", "-m", "scalevec_lit"], [".venv/bin/python", "-m", "scalevec_lit"]):
        argv = words[3:]
        try:
            check_command(argv, EXTRA_COMMANDS)
        except UserError as err:
            pytest.fail(f"{c.where()}\n  {err}")
        sub, args = argv[0], argv[1:]
        if sub in LIGHTNING:
            return _fit_like(c, sub, args, monkeypatch)
        return _argparse_command(c, EXTRA_COMMANDS[sub], args)
    if words[:2] == ["python", "-m"]:
        return _argparse_command(c, words[2], words[3:])
    if words[0] in ("python", ".venv/bin/python", "bash", "sbatch") and "placeholder" not in c.marks:
        script = next((w for w in words[1:] if not w.startswith("-")), None)
        assert script and (ROOT / script).is_file(), f"{c.where()}\n  the script {script!r} is not in the repository"


def test_every_page_is_checked_and_names_its_commands():
    """The README and the task pages show commands, and the parser above finds them (a fence it cannot read
    would silently check nothing)."""
    pages = {c.page.name for c in ALL}
    for name in ("README.md", "train.md", "strategies.md", "moe.md", "scale-out.md", "export.md", "studies.md"):
        assert name in pages, f"no command found in {name}"
    readme = [c.text for c in ALL if c.page.name == "README.md"]
    assert readme[:2] == ["make fit     # venv + install + prepare the embedded corpus + train the smoke model "
                          "(CPU, ~3 min)", "make test    # venv + install + the whole test suite (CPU)"]


def test_links_between_pages_resolve():
    """Every relative link (and ``#anchor``) of the README and docs/ points at a file and heading that exist;
    no link leaves the repository."""
    def anchors(page: Path) -> set[str]:
        out, fence = set(), False
        for line in page.read_text().splitlines():
            fence = fence != line.startswith("```")
            if not fence and line.startswith("#"):
                title = line.lstrip("#").strip().lower()
                out.add(re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", title)))
        return out

    # the API reference's pages are written from the code when the site is built (tools/api_pages.py)
    sys.path.insert(0, str(ROOT / "tools"))
    import api_pages

    generated = {ROOT / "docs" / "api" / "index.md", *(ROOT / "docs" / "api" / f"{p.slug}.md" for p in api_pages.PAGES)}
    problems = []
    for page in PAGES:
        for number, line in enumerate(page.read_text().splitlines(), 1):
            for target in re.findall(r"\]\(([^)\s]+)\)", line):
                if re.match(r"^[a-z]+://", target):
                    problems.append(f"{page.relative_to(ROOT)}:{number}: {target} leaves the repository")
                    continue
                path, _, anchor = target.partition("#")
                dest = (page.parent / path).resolve() if path else page
                if dest in generated:
                    continue
                if not dest.exists():
                    problems.append(f"{page.relative_to(ROOT)}:{number}: {target}: no such file")
                elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                    problems.append(f"{page.relative_to(ROOT)}:{number}: {target}: no such heading in {dest.name}")
    assert not problems, "\n".join(problems)


USER_PAGES = [ROOT / "README.md", *sorted(p for p in (ROOT / "docs").glob("*.md") if p.name != "development.md")]
PRIVATE = re.compile(r"(?:^|[./\s(])(_[A-Za-z]\w*)")  # a name or path component with one leading underscore
WORDS_PER_PAGE, WORDS_IN_ALL = 1_600, 20_000


def _code_spans(text: str) -> list[str]:
    text = re.sub(r"^```.*?^```", lambda m: "`" + m.group(0).replace("`", "") + "`", text, flags=re.M | re.S)
    return re.findall(r"`([^`]+)`", text)


def test_user_pages_name_no_test_and_no_private_name():
    """The README and the guides name what a user types, imports or sees: no test file or test function,
    no private module or attribute (those belong to docs/development.md, docs/internals/ and the code)."""
    tests = set()
    for path in (ROOT / "tests").glob("*.py"):
        tests |= set(re.findall(r"^def (test_\w+)", path.read_text(), flags=re.M))
    problems = []
    for page in USER_PAGES:
        text = page.read_text()
        for number, line in enumerate(text.splitlines(), 1):
            for hit in re.findall(r"\btests/[\w/.]*|\btest_\w+", line):
                if hit.startswith("tests/") or hit in tests:  # lm-eval's own keys (test_split) are the user's
                    problems.append(f"{page.relative_to(ROOT)}:{number}: names the test {hit!r}")
        for span in _code_spans(text):
            if re.fullmatch(r"_[\w.-]*\.(png|csv|json|txt|md)", span):  # a file name's suffix: `<name>_B.png`
                continue
            for name in PRIVATE.findall(span):
                if not name.startswith("__"):
                    problems.append(f"{page.relative_to(ROOT)}: names the private {name!r} (in `{span[:80]}`)")
    assert not problems, "\n".join(problems)


def test_each_guide_is_short_and_all_of_them_half_of_what_they_were():
    """About 1,500 words at most a page; the README and the guides together at most 20,000 words (half of
    the 40,000 the pages held before they were rewritten task-first)."""
    words = {p.relative_to(ROOT).as_posix(): len(p.read_text().split()) for p in USER_PAGES}
    assert {p: n for p, n in words.items() if n > WORDS_PER_PAGE} == {}
    assert sum(words.values()) <= WORDS_IN_ALL, words
