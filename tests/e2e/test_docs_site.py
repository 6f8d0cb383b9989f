"""The documentation site as a reader gets it: `mkdocs build --strict` into a fresh folder,
then the built recipe reference opened in headless Debian chromium (the same browser and
flags as the Prefect UI test), and the page's navigation followed to another page."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.conftest import BIN, REPO
from tests.e2e.test_prefect_ui import CHROMIUM, CHROMIUM_FLAGS


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        # not --quiet: it hides the warnings that --strict counts
        [str(BIN / "mkdocs"), "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"PATH": str(BIN), "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, built.stderr
    return out


def test_the_built_site_opens_in_chromium(site: Path, tmp_path: Path) -> None:
    from playwright.sync_api import sync_playwright

    if CHROMIUM is None:
        pytest.skip(
            "SKIPPED the docs browser test: no chromium found (FAR_CHROMIUM, chromium, "
            "chromium-browser on PATH); `make browser` installs Debian chromium as root"
        )
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, args=CHROMIUM_FLAGS
        )
        try:
            page = context.new_page()
            page.goto((site / "reference" / "recipe.html").as_uri())
            assert page.locator("h1").first.inner_text().startswith("Recipe reference")
            row = page.locator("td", has_text="train_micro_batch_size").first
            assert row.is_visible()  # a schema field, with its docstring beside it
            assert page.get_by_text("prompts per backward pass").first.is_visible()
            page.get_by_role("link", name="Getting started").first.click()
            page.wait_for_load_state()
            assert page.locator("h1").first.inner_text().startswith("Getting started")
        finally:
            context.close()
