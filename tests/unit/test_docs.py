"""The documentation cannot go stale silently: the generated reference pages equal what the
code generates now, and every repository path a Markdown file names exists."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flows import gen_docs
from tests.conftest import REPO

# A repository path as prose names it: a top-level folder of this repository, then a path.
PATH = re.compile(
    r"(?<![\w./~-])((?:schemas|stages|pipeline|flows|deploy|recipes|bench|experiments|tests|docs)"
    r"/[\w./-]*[\w/])"
)
PLACEHOLDER = re.compile(r"[<>{}*]|\.\.\.|-<|XXXX")


def markdown_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    return [name for name in listed.stdout.split() if (REPO / name).exists()]


@pytest.mark.parametrize("page", sorted(gen_docs.pages()))
def test_generated_page_is_current(page: str) -> None:
    committed = REPO / "docs" / page
    assert committed.exists(), f"{page} is missing: run `python -m flows.gen_docs`"
    assert committed.read_text() == gen_docs.pages()[page], (
        f"docs/{page} differs from what the code generates: run `python -m flows.gen_docs`"
    )


def named_paths(text: str) -> list[str]:
    """Repository paths named in `text` (placeholders and run directories left out)."""
    found = []
    for match in PATH.finditer(text):
        path = match.group(1).split("::")[0].rstrip(".")
        rest = text[match.end() : match.end() + 1]
        if PLACEHOLDER.search(path) or rest in "<{*":
            continue
        found.append(path)
    return found


def exists(path: str) -> bool:
    """The file or folder, or a module's attribute (`flows/far_flow.run_recipe`)."""
    module = path.rsplit(".", 1)[0] + ".py"
    return (REPO / path).exists() or ("." in path and (REPO / module).exists())


def test_paths_named_in_markdown_exist() -> None:
    missing = []
    files = markdown_files()
    assert "README.md" in files and "docs/index.md" in files
    for name in files:
        for path in named_paths((REPO / name).read_text()):
            if not exists(path):
                missing.append(f"{name}: {path}")
    assert not missing, "paths named in Markdown that do not exist:\n" + "\n".join(missing)


def test_the_path_check_finds_a_dead_path() -> None:
    """The check itself: a stale path is found, a placeholder is not taken for one."""
    text = "see `stages/drift.py` and runs in recipes/<name>.yaml or stages/core/drift.py."
    paths = named_paths(text)
    assert paths == ["stages/drift.py", "stages/core/drift.py"]
    assert not exists(paths[0]) and exists(paths[1])
    assert exists("flows/far_flow.run_recipe") and not exists("flows/runs.run_recipe")


def test_the_readme_is_a_front_door() -> None:
    """At most ~200 lines; the long-form text lives in docs/ (the site)."""
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines; move detail into docs/"
    text = "\n".join(lines)
    for command in ("make run", "make test"):
        assert command in text


def test_the_built_site_searches_from_disk(tmp_path: Path) -> None:
    """site/index.html opened from disk (file://, as the README says): a browser refuses to
    fetch search_index.json there, so the search box stayed at "Initializing search" for ever.
    mkdocs-material's offline plugin writes the index as a script, loaded by an iframe worker
    that every page includes. (The build is the one `make docs` runs, into tmp_path.)"""
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", str(site)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        check=True,
        capture_output=True,
    )
    index = (site / "search" / "search_index.js").read_text()
    assert index.startswith("var __index =") and "getting-started.html" in index
    pages = sorted(site.glob("*.html"))
    assert len(pages) > 10
    missing = [p.name for p in pages if "iframe-worker" not in p.read_text()]
    assert not missing, f"pages without the offline search worker: {missing}"
