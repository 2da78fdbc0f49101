"""build_corpus: an English corpus of ~10M+ tokens from permissively licensed Debian documentation packages.

``python -m scalevec_lit.data.build_corpus --out data/corpus/docs``

Downloads each package below with ``apt-get download`` (Debian's main archive: nothing to install, no
root), unpacks it with ``dpkg-deb -x``, turns its documentation into plain text (Sphinx ``_sources``
reStructuredText and Markdown as they are; HTML through ``html_to_text``), cleans it (``clean``) and writes
one ``.txt`` per document under ``<out>/train/<source>/`` or ``<out>/val/<source>/``. The validation text
comes from OTHER sources than the training text (``SOURCES``: the split is by package). ``manifest.json``
records every source: package, version, the .deb's SHA-256, licence, files, characters (and tokens, added
by ``--count-tokens <tokenizer.json>``). ``prepare_heldout.py`` makes the prepared data from the two folders.

Plain Python (stdlib); ``--count-tokens`` uses the tokenizer class of this package.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Iterator, Optional

from ..errors import CommandLineParser, run_guarded


@dataclass(frozen=True)
class Source:
    name: str           # folder name under train/ or val/
    package: str        # Debian package (bookworm, main)
    split: str          # "train" or "val"
    licence: str        # the licence of the documentation text, from the package's copyright file
    include: str        # glob (relative to the unpacked package) of the documents
    exclude: tuple[str, ...] = ()  # path fragments to leave out (generated API stubs)


SOURCES = (
    Source("python", "python3.11-doc", "train", "PSF-2.0", "usr/share/doc/python3.11/html/_sources/**/*.rst.txt"),
    Source("postgresql", "postgresql-doc-15", "train", "PostgreSQL", "usr/share/doc/postgresql-doc-15/html/*.html"),
    Source("django", "python-django-doc", "train", "BSD-3-Clause", "usr/share/doc/python-django-doc/html/**/*.html",
           ("/_modules/", "genindex", "py-modindex", "/search.html")),
    Source("sqlalchemy", "python-sqlalchemy-doc", "train", "Expat (MIT)", "usr/share/doc/python-sqlalchemy-doc/html/**/*.html",
           ("/_modules/", "genindex", "py-modindex", "/search.html")),
    Source("pandas", "python-pandas-doc", "train", "BSD-3-Clause", "usr/share/doc/python-pandas-doc/html/_sources/**/*.txt",
           ("/reference/api/",)),
    Source("sphinx", "sphinx-doc", "train", "BSD-2-Clause", "usr/share/doc/sphinx-doc/html/_sources/**/*.txt"),
    Source("nodejs", "nodejs-doc", "train", "Expat (MIT)", "usr/share/doc/nodejs/api/*.md.gz"),
    Source("sqlite", "sqlite3-doc", "val", "public domain", "usr/share/doc/sqlite3/**/*.html"),
)
MIN_CHARS = 200  # shorter documents (navigation pages, empty stubs) are dropped

_SKIP = {"script", "style", "nav", "head", "footer", "header", "noscript", "svg", "form"}
_BLOCK = {"p", "div", "br", "li", "ul", "ol", "tr", "table", "pre", "h1", "h2", "h3", "h4", "h5", "h6",
          "dt", "dd", "dl", "blockquote", "section", "article", "hr", "td", "th", "title", "caption"}


class _Text(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skip = 0

    def handle_starttag(self, tag: str, attrs) -> None:
        if tag in _SKIP:
            self.skip += 1
        elif tag in _BLOCK:
            self.parts.append("\n\n" if tag in ("p", "pre", "h1", "h2", "h3", "h4", "div", "section") else "\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in _SKIP:
            self.skip = max(0, self.skip - 1)
        elif tag in _BLOCK:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if not self.skip:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    """The visible text of an HTML page: scripts, styles, navigation, headers and footers left out; block
    elements start new lines, paragraphs and headings new paragraphs."""
    parser = _Text()
    parser.feed(html)
    parser.close()
    return "".join(parser.parts)


_PILCROW = re.compile(r"[¶\u00b6]")


def clean(text: str) -> str:
    """Plain text: Unicode NFC line endings, no trailing spaces, runs of spaces inside a line collapsed unless
    the line is indented code, at most one blank line in a row, headerlink pilcrows and lines of only
    punctuation (reST underlines, table rules) removed."""
    out: list[str] = []
    for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"):
        line = _PILCROW.sub("", line).rstrip().replace("\t", "    ")
        if line and not line.startswith(" "):
            line = re.sub(r" {2,}", " ", line)
        if line and not re.search(r"[A-Za-z0-9]", line):
            continue
        if not line and (not out or not out[-1]):
            continue
        out.append(line)
    return "\n".join(out).strip() + "\n"


def read_document(path: Path) -> str:
    """The text of one document file (``.html``, ``.gz`` or plain text), before ``clean``."""
    data = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
    text = data.decode("utf-8", errors="replace")
    return html_to_text(text) if ".htm" in path.name else text


def documents(root: Path, source: Source) -> Iterator[tuple[str, str]]:
    """``(relative name, cleaned text)`` of each document of ``source`` unpacked under ``root``, sorted,
    shorter than ``MIN_CHARS`` left out."""
    for path in sorted(root.glob(source.include)):
        rel = path.relative_to(root).as_posix()
        if not path.is_file() or any(x in "/" + rel for x in source.exclude):
            continue
        text = clean(read_document(path))
        if len(text) >= MIN_CHARS:
            yield rel, text


def _download(package: str, where: Path) -> Path:
    subprocess.run(["apt-get", "download", package], cwd=where, check=True, capture_output=True)
    debs = sorted(where.glob(f"{package}_*.deb"))
    if not debs:
        raise FileNotFoundError(f"apt-get download {package}: no {package}_*.deb written in {where}")
    return debs[-1]


def build(out: Path, debs: Optional[Path] = None, sources=SOURCES) -> dict:
    """Write ``<out>/{train,val}/<source>/*.txt`` and ``<out>/manifest.json``; ``debs``: a folder that holds
    the .deb files already (else they are downloaded into a temporary one)."""
    manifest = {"sources": []}
    with tempfile.TemporaryDirectory(prefix="scalevec-corpus-") as tmp:
        for source in sources:
            deb = next(iter(sorted(debs.glob(f"{source.package}_*.deb"))), None) if debs else None
            deb = deb or _download(source.package, Path(tmp))
            unpacked = Path(tmp) / source.package
            subprocess.run(["dpkg-deb", "-x", str(deb), str(unpacked)], check=True)
            version = subprocess.run(["dpkg-deb", "-f", str(deb), "Version"], check=True, capture_output=True,
                                     text=True).stdout.strip()
            dest = out / source.split / source.name
            dest.mkdir(parents=True, exist_ok=True)
            files = chars = 0
            for rel, text in documents(unpacked, source):
                name = re.sub(r"[^A-Za-z0-9._-]+", "_", rel.split("/", 4)[-1])
                (dest / (name + ".txt")).write_text(text, encoding="utf-8")
                files, chars = files + 1, chars + len(text)
            manifest["sources"].append({
                "name": source.name, "split": source.split, "package": source.package, "version": version,
                "deb": deb.name, "deb_sha256": hashlib.sha256(deb.read_bytes()).hexdigest(),
                "licence": source.licence, "copyright_file": f"/usr/share/doc/{source.package}/copyright",
                "files": files, "chars": chars,
            })
            print(f"{source.split:5s} {source.name:12s} {files:5d} files {chars:12,d} chars", file=sys.stderr)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def count_tokens(out: Path, tokenizer: str) -> dict:
    """Add each source's token count (``tokens``: its documents encoded one by one, an end-of-text id each, as
    prepare does) and the tokenizer's identity to ``<out>/manifest.json``."""
    from .tokenizer import Tokenizer

    tok = Tokenizer(tokenizer)
    manifest = json.loads((out / "manifest.json").read_text())
    for entry in manifest["sources"]:
        files = sorted((out / entry["split"] / entry["name"]).glob("*.txt"))
        entry["tokens"] = sum(len(tok.encode(f.read_text(encoding="utf-8"))) for f in files)
    manifest["tokenizer"] = {"vocab_size": tok.vocab_size, "content": tok.content_hash()}
    manifest["tokens"] = {s: sum(e["tokens"] for e in manifest["sources"] if e["split"] == s) for s in ("train", "val")}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def main(argv: Optional[list[str]] = None) -> None:
    p = CommandLineParser(prog="python -m scalevec_lit.data.build_corpus", description=__doc__.split("\n")[0])
    p.add_argument("--out", default="data/corpus/docs")
    p.add_argument("--debs", default=None, help="a folder holding the .deb files already (default: download)")
    p.add_argument("--count-tokens", default=None, metavar="TOKENIZER_JSON",
                   help="only add the token counts of an existing build to its manifest.json")
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.count_tokens:
        m = count_tokens(out, args.count_tokens)
        print(f"{out}: {m['tokens']['train']:,} train / {m['tokens']['val']:,} val tokens")
        return
    if any(out.glob("*/*/*.txt")):
        raise SystemExit(f"--out: {str(out)!r} already holds a corpus; remove it or choose another folder")
    build(out, Path(args.debs) if args.debs else None)


if __name__ == "__main__":
    run_guarded(main, sys.argv[1:])
