"""Build the documentation site: ``make docs`` (or ``python tools/build_docs.py [--out build/site]``).

The site's pages are the repository's own Markdown, unchanged in content: the README is the front page,
docs/*.md the guides, CHANGELOG.md the changelog, and the API reference is written from the code
(``tools/api_pages.py``) and rendered from its docstrings by mkdocstrings. They are staged under
``build/docs-src`` (the README's links ``docs/x.md`` become ``x.md`` there, nothing else is rewritten) and
built by MkDocs with ``--strict``: a broken link or anchor, a page left out of the navigation or a
docstring mkdocstrings cannot render fails the build.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import api_pages  # noqa: E402  (a sibling module; tools/ is not a package)

ROOT = Path(__file__).resolve().parents[1]
STAGE = ROOT / "build" / "docs-src"
LINK = re.compile(r"(\]\()([^)\s#]*)(#[^)\s]*)?(\))")


def _relink(text: str, mapping: dict[str, str]) -> str:
    """Rewrite the targets of Markdown links found in ``mapping``; every other link is left as written."""
    def one(m: re.Match) -> str:
        target = mapping.get(m.group(2), m.group(2))
        return f"{m.group(1)}{target}{m.group(3) or ''}{m.group(4)}"
    return LINK.sub(one, text)


def stage(dest: Path = STAGE) -> Path:
    """Copy the pages into ``dest`` as MkDocs reads them, and write the API reference pages."""
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(ROOT / "docs", dest)
    guides = {f"docs/{p.relative_to(ROOT / 'docs').as_posix()}": p.relative_to(ROOT / "docs").as_posix()
              for p in (ROOT / "docs").rglob("*") if p.is_file()}
    (dest / "index.md").write_text(_relink((ROOT / "README.md").read_text(),
                                           {**guides, "CHANGELOG.md": "changelog.md"}))
    (dest / "changelog.md").write_text(_relink((ROOT / "CHANGELOG.md").read_text(),
                                               {**guides, "README.md": "index.md"}))
    for page in dest.rglob("*.md"):
        if page.name in ("index.md", "changelog.md") and page.parent == dest:
            continue
        up = "../" * (len(page.relative_to(dest).parts) - 1)
        page.write_text(_relink(page.read_text(), {f"{up}../README.md": f"{up}index.md",
                                                   f"{up}../CHANGELOG.md": f"{up}changelog.md"}))
    api = dest / "api"
    api.mkdir(exist_ok=True)
    (api / "index.md").write_text(api_pages.index_markdown())
    for page in api_pages.PAGES:
        (api / f"{page.slug}.md").write_text(api_pages.page_markdown(page))
    return dest


def config_for(src: Path, out: Path) -> Path:
    """mkdocs.yml with the staged pages ``src``, the site ``out`` and the code's folder as absolute paths,
    written beside ``src`` (so that a build can stage anywhere, e.g. a test's temporary folder)."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    config["docs_dir"], config["site_dir"] = str(src.resolve()), str(out.resolve())
    for plugin in config["plugins"]:
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            plugin["mkdocstrings"]["handlers"]["python"]["paths"] = [str(ROOT)]
    path = src.parent / f"{src.name}.mkdocs.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def build(out: Path, src: Path = STAGE, edit=None) -> subprocess.CompletedProcess:
    """Stage the pages into ``src`` (then ``edit(src)``, if given) and run ``mkdocs build --strict`` into
    ``out``; the completed process, its output captured."""
    stage(src)
    if edit is not None:
        edit(src)
    cmd = [sys.executable, "-m", "mkdocs", "build", "--strict", "--clean", "-f", str(config_for(src, out))]
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's notice about its successor, not about our pages
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tools/build_docs.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "build" / "site"), help="the site's folder (build/site)")
    args = parser.parse_args(argv)
    res = build(Path(args.out))
    sys.stdout.write(res.stdout)
    sys.stderr.write(res.stderr)
    if res.returncode == 0:
        print(f"site built: {Path(args.out).resolve() / 'index.html'} "
              f"(serve it: python -m http.server -d {args.out} 8000)")
    return res.returncode


if __name__ == "__main__":
    sys.exit(main())
