"""build_corpus: HTML to text, cleaning, which documents of a package are taken, and a build from a local .deb."""
from __future__ import annotations

import gzip
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from scalevec_lit.data import build_corpus as bc
from scalevec_lit.data.tokenizer import DEFAULT_TOKENIZER, Tokenizer

PAGE = ("<html><head><title>T</title><style>p {color: red}</style></head><body><nav>Home | Next</nav>"
        "<h1>Heading¶</h1><p>First  paragraph with <b>bold</b> text.</p><script>var x = 1;</script>"
        "<pre>    indented  code</pre><p>Second &amp; last.</p><footer>Copyright</footer></body></html>")


def test_html_to_text_keeps_visible_text_and_breaks_blocks():
    text = bc.html_to_text(PAGE)
    for gone in ("color: red", "var x", "Home | Next", "Copyright", "<b>", "&amp;"):
        assert gone not in text
    assert bc.clean(text) == "Heading\n\nFirst paragraph with bold text.\n\n    indented  code\n\nSecond & last.\n"


def test_clean_drops_rules_and_extra_blank_lines_and_keeps_indentation():
    raw = "Title\r\n=====\r\n\n\n\nA  line\twith   spaces   \n    code  stays\n----\n+--+--+\nend"
    assert bc.clean(raw) == "Title\n\nA line with spaces\n    code  stays\nend\n"


def _package(root: Path) -> None:
    docs = root / "usr/share/doc/pkg"
    (docs / "html/sub").mkdir(parents=True)
    (docs / "html/a.html").write_text(PAGE.replace("First", "First " + "word " * 60))
    (docs / "html/sub/b.html").write_text("<p>" + "long text " * 40 + "</p>")
    (docs / "html/short.html").write_text("<p>too short</p>")  # under MIN_CHARS: dropped
    (docs / "html/genindex.html").write_text("<p>" + "index entry " * 40 + "</p>")  # excluded by name
    (docs / "api").mkdir()
    (docs / "api/c.md.gz").write_bytes(gzip.compress(("# C\n\n" + "markdown text " * 30).encode()))


def test_documents_follow_include_exclude_and_min_chars(tmp_path):
    _package(tmp_path)
    src = bc.Source("pkg", "pkg", "train", "MIT", "usr/share/doc/pkg/html/**/*.html", ("genindex",))
    docs = dict(bc.documents(tmp_path, src))
    assert sorted(docs) == ["usr/share/doc/pkg/html/a.html", "usr/share/doc/pkg/html/sub/b.html"]
    assert docs["usr/share/doc/pkg/html/sub/b.html"] == ("long text " * 40).strip() + "\n"
    md = dict(bc.documents(tmp_path, bc.Source("md", "pkg", "val", "MIT", "usr/share/doc/pkg/api/*.md.gz")))
    assert list(md.values()) == ["# C\n\n" + ("markdown text " * 30).strip() + "\n"]


@pytest.mark.skipif(shutil.which("dpkg-deb") is None, reason="needs dpkg-deb (Debian/Ubuntu)")
def test_build_from_a_local_deb_writes_the_split_folders_and_the_manifest(tmp_path):
    pkg = tmp_path / "pkgroot"
    _package(pkg)
    (pkg / "DEBIAN").mkdir()
    (pkg / "DEBIAN/control").write_text("Package: pkg\nVersion: 1.2-3\nArchitecture: all\nMaintainer: t <t@t>\n"
                                        "Description: test\n")
    debs = tmp_path / "debs"
    debs.mkdir()
    subprocess.run(["dpkg-deb", "--root-owner-group", "-b", str(pkg), str(debs / "pkg_1.2-3_all.deb")],
                   check=True, capture_output=True)
    sources = (bc.Source("html", "pkg", "train", "MIT", "usr/share/doc/pkg/html/**/*.html", ("genindex",)),
               bc.Source("md", "pkg", "val", "public domain", "usr/share/doc/pkg/api/*.md.gz"))
    out = tmp_path / "corpus"
    manifest = bc.build(out, debs, sources)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.txt")) == [
        "train/html/html_a.html.txt", "train/html/html_sub_b.html.txt", "val/md/api_c.md.gz.txt"]
    (train, val) = manifest["sources"]
    assert (train["version"], train["files"], train["licence"], val["split"]) == ("1.2-3", 2, "MIT", "val")
    assert train["chars"] == sum(len(p.read_text()) for p in (out / "train/html").glob("*.txt"))
    counted = bc.count_tokens(out, str(DEFAULT_TOKENIZER))
    tok = Tokenizer(DEFAULT_TOKENIZER)
    assert counted["tokens"]["val"] == len(tok.encode((out / "val/md/api_c.md.gz.txt").read_text()))
    assert json.loads((out / "manifest.json").read_text())["tokens"] == counted["tokens"]
