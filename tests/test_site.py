"""The documentation site: it builds with ``--strict`` (a broken link or anchor, or a page outside the
navigation, fails it), every public name has a documented contract on its API page, and a headless Chromium,
served the site over HTTP on 127.0.0.1, shows the front page and a guide as their Markdown says and finds a
guide through the site's search."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from browser import Browser, group_alive
from helpers import ROOT

sys.path.insert(0, str(ROOT / "tools"))
import api_pages  # noqa: E402
import build_docs  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    base = tmp_path_factory.mktemp("site")
    res = build_docs.build(base / "site", src=base / "src")
    assert res.returncode == 0 and "WARNING" not in res.stderr, res.stdout[-3000:] + res.stderr[-6000:]
    return base / "site"


@pytest.fixture(scope="module")
def served(site):
    """``python -m http.server`` on a free port of 127.0.0.1, serving the built site; its base URL."""
    proc = subprocess.Popen([sys.executable, "-u", "-m", "http.server", "--bind", "127.0.0.1", "--directory",
                             str(site), "0"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline()  # "Serving HTTP on 127.0.0.1 port 40123 (http://127.0.0.1:40123/) ..."
        port = int(re.search(r" port (\d+)", line).group(1))
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(scope="module")
def browser():
    with Browser() as b:
        yield b
    assert not group_alive(b.group), "the browser left processes behind"


def _nav_pages(nav) -> list[str]:
    out = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        out += _nav_pages(value) if isinstance(value, list) else [value]
    return out


def _plain(markdown: str) -> str:
    """The text a reader sees of one Markdown paragraph: links by their words, no emphasis or code marks."""
    text = re.sub(r"\[([^\]]+)\]\([^)]+\)", r"\1", markdown)
    text = re.sub(r"[*`]", "", text)
    return " ".join(text.split())


def _text(browser, selector: str) -> list[str]:
    return browser.js(f"Array.from(document.querySelectorAll({selector!r})).map(e => e.textContent)")


def test_every_page_is_built_and_in_the_navigation(site):
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    nav = _nav_pages(config["nav"])
    guides = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    api = ["api/index.md", *(f"api/{p.slug}.md" for p in api_pages.PAGES)]
    assert sorted(nav) == sorted(["index.md", "changelog.md", *guides, *api])
    for page in nav:
        assert (site / page.replace(".md", ".html")).is_file(), page
    assert (site / "search" / "search_index.json").is_file()


def test_a_broken_link_a_missing_anchor_and_a_page_outside_the_navigation_fail_the_build(tmp_path):
    def spoil(src):
        page = src / "train.md"
        page.write_text(page.read_text() + "\n\nSee [the gone page](gone.md) and [a heading](moe.md#no-such-one).\n")
        (src / "orphan.md").write_text("# Orphan\n\nNo page links here and the navigation leaves it out.\n")

    res = build_docs.build(tmp_path / "site", src=tmp_path / "src", edit=spoil)
    out = res.stdout + res.stderr
    assert res.returncode != 0, out[-3000:]
    assert "Aborted with 3 warnings in strict mode" in out, out[-3000:]
    assert "'train.md' contains a link 'gone.md', but the target is not found" in out
    assert "'train.md' contains a link 'moe.md#no-such-one', but the doc 'moe.md' does not contain an anchor" in out
    assert re.search(r"not included in the \"nav\" configuration:\s+- orphan\.md", out)


def _undocumented_methods(cls) -> list[str]:
    """Public methods ``cls`` defines without a docstring and without overriding a documented base method."""
    def doc(value):
        func = value.__func__ if isinstance(value, (classmethod, staticmethod)) else value
        func = func.fget if isinstance(func, property) else func
        return (getattr(func, "__doc__", None) or "").strip()

    missing = []
    for name, value in vars(cls).items():
        if name.startswith("_") or not (callable(value) or isinstance(value, (property, classmethod, staticmethod))):
            continue
        if not doc(value) and not any(name in vars(base) and doc(vars(base)[name]) for base in cls.__mro__[1:]):
            missing.append(f"{cls.__module__}.{cls.__qualname__}.{name}")
    return missing


def test_every_public_name_has_a_documented_contract_on_its_api_page(site):
    missing, absent, count = [], [], 0
    for page in api_pages.PAGES:
        html = (site / "api" / f"{page.slug}.html").read_text()
        for module, name, obj in api_pages.documented(page):
            if not api_pages.is_api(obj):
                assert f"<code>{module}.{name}</code>" in html, f"{module}.{name} (a constant) not on api/{page.slug}"
                continue
            count += 1
            if not (obj.__doc__ or "").strip():
                missing.append(f"{module}.{name}")
            if isinstance(obj, type) and obj.__module__.startswith("scalevec_lit"):
                missing += _undocumented_methods(obj)
            if f'id="{api_pages.anchor(module, name, obj)}"' not in html:
                absent.append(f"{module}.{name} (api/{page.slug}.html)")
    assert count > 100
    assert not missing, "public names without a docstring:\n" + "\n".join(missing)
    assert not absent, "public names the built API reference does not show:\n" + "\n".join(absent)


def test_every_fence_of_every_page_is_a_code_block_on_the_site(site):
    """A fence with our markers (```bash gpu, ```bash placeholder) must still render as a block, and nothing
    after it be swallowed: each page's built HTML holds one <pre> per fence of its Markdown, with its text."""
    import html as html_lib

    pages = {"index.html": ROOT / "README.md", "changelog.html": ROOT / "CHANGELOG.md"}
    pages.update({p.relative_to(ROOT / "docs").with_suffix(".html").as_posix(): p for p in (ROOT / "docs").rglob("*.md")})
    for built, source in pages.items():
        fences = re.findall(r"^```[^\n]*\n(.*?)^```", source.read_text(), re.M | re.S)
        page = (site / built).read_text()
        shown = [html_lib.unescape(re.sub(r"<[^>]+>", "", b)) for b in re.findall(r"<pre[^>]*>(.*?)</pre>", page, re.S)]
        assert len(shown) == len(fences), f"{built}: {len(fences)} fences in {source.name}, {len(shown)} blocks built"
        for fence, block in zip(fences, shown):
            assert " ".join(fence.split()) == " ".join(block.split()), (built, fence[:200], block[:200])


def test_the_front_page_shows_the_readme(served, browser):
    readme = (ROOT / "README.md").read_text()
    title = re.search(r"^# (.+)$", readme, re.M).group(1)
    first_paragraph = _plain(readme.split("\n\n")[1])
    browser.goto(f"{served}/index.html")
    assert browser.js("document.title") == title
    assert [h.rstrip("¶").strip() for h in _text(browser, "article h1")] == [title]
    assert _plain(_text(browser, "article p")[0]) == first_paragraph
    sections = [h.rstrip("¶").strip() for h in _text(browser, "article h2")]
    assert sections == re.findall(r"^## (.+)$", readme, re.M)
    labels = {" ".join(t.split()) for t in _text(browser, "nav.md-nav a")}
    guides = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"][1]["Guides"]
    assert {next(iter(g)) for g in guides} <= labels


def test_a_guide_shows_its_commands(served, browser):
    page = (ROOT / "docs" / "train.md").read_text()
    title = re.search(r"^# (.+)$", page, re.M).group(1)
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", page, re.M | re.S)
    browser.goto(f"{served}/train.html")
    assert [h.rstrip("¶").strip() for h in _text(browser, "article h1")] == [title]
    shown = [" ".join(t.split()) for t in _text(browser, "article pre code")]
    assert blocks and [" ".join(b.split()) for b in blocks] == shown


def test_search_finds_a_guide(served, browser):
    browser.goto(f"{served}/index.html")
    browser.js("""(() => { const box = document.querySelector('[data-md-component=search-query]');
        box.focus(); box.value = 'tensorboard';
        box.dispatchEvent(new Event('input', {bubbles: true}));
        box.dispatchEvent(new KeyboardEvent('keyup', {key: 'd', bubbles: true})); })()""")
    browser.wait_for("document.querySelectorAll('.md-search-result__item').length > 0")
    hrefs = browser.js("Array.from(document.querySelectorAll('.md-search-result__item a'))"
                       ".map(a => a.getAttribute('href'))")
    assert any(h.split("?")[0].endswith("/monitoring.html") for h in hrefs), hrefs


def test_every_name_the_guides_import_is_in_the_api_reference():
    """A ``from scalevec_lit... import X`` on a user page (in an example or in the prose) names something the
    API reference documents, so the reader can look up its contract."""
    import importlib

    documented = {id(obj) for page in api_pages.PAGES for _, _, obj in api_pages.documented(page)}
    pages = [ROOT / "README.md", *(p for p in (ROOT / "docs").glob("*.md") if p.name != "development.md")]
    imports, missing = 0, []
    for page in pages:
        for module, names in re.findall(r"from (scalevec_lit[\w.]*) import ([\w, ]+)", page.read_text()):
            for name in (n.strip() for n in names.split(",") if n.strip()):
                imports += 1
                if id(getattr(importlib.import_module(module), name)) not in documented:
                    missing.append(f"{page.name}: from {module} import {name}")
    assert imports >= 10 and not missing, missing
