"""Every link in README.md and the docs pages resolves: a relative link names a file that
exists, and a `#anchor` names a heading (or id) of the page it points to, as the site's
Markdown renders it. mkdocs --strict checks links between docs pages, not README.md's links
into docs/ (a README anchor to performance.md was broken). The site's navigation lists each
page once and keeps the project log out of the user guide."""

from __future__ import annotations

import html
import re
from functools import cache
from pathlib import Path
from typing import Any

import markdown
import yaml

from tests.conftest import REPO

MKDOCS = REPO / "mkdocs.yml"
HREF = re.compile(r'\bhref="([^"]*)"')
ID = re.compile(r'\bid="([^"]*)"')
REMOTE = re.compile(r"^(?:[a-z][a-z0-9+.-]*:|//)", re.IGNORECASE)


def extensions() -> tuple[list[str], dict[str, Any]]:
    """The site's Markdown extensions (mkdocs.yml), so ids are the ones the site has."""
    names, configs = [], {}
    for entry in yaml.safe_load(MKDOCS.read_text())["markdown_extensions"]:
        name, config = next(iter(entry.items())) if isinstance(entry, dict) else (entry, {})
        names.append(name)
        configs[name] = dict(config or {})
    if "pymdownx.snippets" in configs:
        configs["pymdownx.snippets"]["base_path"] = [str(REPO)]
    return names, configs


@cache
def rendered(path: Path) -> tuple[list[str], frozenset[str]]:
    """A page's link targets and element ids."""
    names, configs = extensions()
    page = markdown.markdown(path.read_text(), extensions=names, extension_configs=configs)
    hrefs = [html.unescape(h) for h in HREF.findall(page)]
    return hrefs, frozenset(html.unescape(i) for i in ID.findall(page))


def broken_links(page: Path) -> list[str]:
    problems = []
    hrefs, own_ids = rendered(page)
    for href in hrefs:
        if not href or REMOTE.match(href):
            continue
        target, _, anchor = href.partition("#")
        resolved = (page.parent / target).resolve() if target else page
        if not resolved.exists():
            problems.append(f"{page.name}: {href} (no such file)")
        elif anchor and resolved.suffix == ".md":
            ids = own_ids if resolved == page else rendered(resolved)[1]
            if anchor not in ids:
                problems.append(f"{page.name}: {href} (no heading #{anchor} there)")
    return problems


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def test_every_readme_and_docs_link_resolves() -> None:
    problems = [problem for page in pages() for problem in broken_links(page)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_the_link_check_finds_a_broken_file_and_anchor(tmp_path: Path) -> None:
    """The check itself, on pages written here: a missing file and a heading that is not
    there are found; a good anchor, a reference link, an own-page anchor and a web link pass."""
    (tmp_path / "perf.md").write_text(
        "# Perf\n\n## GRPO on the accuracy recipe, before and after\n"
    )
    page = tmp_path / "index.md"
    page.write_text(
        "# Home\n\n## Here\n\n"
        "[a](perf.md#grpo-on-the-accuracy-recipe-before-and-after) [b][ref] [c](#here) "
        "[d](https://example.org/x#y)\n"
        "[e](perf.md#grpo-on-the-accuracy-recipe) [f](gone.md) [g](#nowhere)\n\n"
        "[ref]: perf.md#perf\n"
    )
    assert broken_links(page) == [
        "index.md: perf.md#grpo-on-the-accuracy-recipe (no heading #grpo-on-the-accuracy-recipe "
        "there)",
        "index.md: gone.md (no such file)",
        "index.md: #nowhere (no heading #nowhere there)",
    ]


def nav_files(entries: list[Any], section: str = "") -> list[tuple[str, str]]:
    """(section, file) for every page in mkdocs.yml's nav."""
    found = []
    for entry in entries:
        if isinstance(entry, str):
            found.append((section, entry))
            continue
        for title, value in entry.items():
            if isinstance(value, list):
                found += nav_files(value, title)
            else:
                found.append((section, value))
    return found


def test_the_nav_lists_each_page_once_and_the_log_outside_the_guide() -> None:
    nav = nav_files(yaml.safe_load(MKDOCS.read_text())["nav"])
    files = [file for _, file in nav]
    assert len(files) == len(set(files)), (
        f"listed twice: {sorted({f for f in files if files.count(f) > 1})}"
    )
    sections = dict((file, section) for section, file in nav)
    assert sections["log.md"] not in ("", "User guide"), sections["log.md"]
    assert "results.md" in sections
