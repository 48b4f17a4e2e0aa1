"""The docs site: mkdocs.yml builds docs/*.md as ``mkdocs build --strict`` does (a broken link
or anchor, a page missing from the nav, a reference object that does not resolve: any warning
fails it), with the network refused, into pages that load nothing from another host; its API
reference holds every public name of ``nearsight`` with its docstring."""

from __future__ import annotations

import html
import inspect
import re
import socket
from pathlib import Path

from mkdocs.commands.build import build
from mkdocs.config import load_config

import nearsight

ROOT = Path(__file__).resolve().parents[2]


def _words(text: str) -> str:
    """Words only: backticks and colons dropped, spaces collapsed."""
    return " ".join(re.sub(r"[`:]", " ", text).split())


def _page_words(page: Path) -> str:
    """A built page's words, its tags dropped."""
    return _words(html.unescape(re.sub(r"<[^>]+>", " ", page.read_text())))


def test_the_site_builds_strict_offline_with_the_api_reference(tmp_path, monkeypatch):
    def no_network(*args, **kwargs):
        raise OSError("the docs build reached for the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "getaddrinfo", no_network)
    monkeypatch.chdir(ROOT)  # mkdocs.yml names the griffe extension by its path from here
    site = tmp_path / "site"
    build(load_config(str(ROOT / "mkdocs.yml"), site_dir=str(site), strict=True))

    reference = (site / "api" / "index.html").read_text()
    words = _page_words(site / "api" / "index.html")
    for name in nearsight.__all__:
        assert f'id="nearsight.{name}"' in reference, f"docs/api.md lacks nearsight.{name}"
        summary = inspect.getdoc(getattr(nearsight, name)).split(".")[0]
        summary = re.sub(r":\w+:`~?([^`]+)`", r"\1", summary)  # a role shows as its name
        first_words = " ".join(_words(summary).split()[:6])
        assert first_words in words, f"nearsight.{name}: {first_words!r} not in the reference"
    assert not re.search(r":(class|meth|func|attr):", reference)  # roles became code spans
    for page in sorted((ROOT / "docs").glob("*.md")):
        built = site / ("" if page.stem == "index" else page.stem) / "index.html"
        assert built.is_file(), f"{page.name} was not built"
        # the doc tests' hidden checks stay hidden: inside HTML comments, never shown as text
        shown = re.sub(r"<!--.*?-->", "", built.read_text(), flags=re.S)
        assert "docs_workspace" not in shown, page.name
        # browsable offline: no script, stylesheet or font from another host
        assert not re.search(r"<(script|link)\b[^>]*(src|href)=\"(https?:)?//", shown), page.name
