"""The documentation site as a reader gets it: `mkdocs build --strict` into a fresh folder,
then the built recipe reference opened in headless Debian chromium (the same browser and
flags as the Prefect UI test), and the page's navigation followed to another page; and the
site opened from disk with the network off, where search must still answer (its worker shim
and fonts are vendored or left out: nothing is fetched from a CDN)."""

from __future__ import annotations

import re
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


def remote_assets(site: Path) -> list[str]:
    """Every script or stylesheet a built page would fetch from another host."""
    tag = re.compile(r"<(?:script|link)\b[^>]*\b(?:src|href)=\"(https?://[^\"]+)\"")
    return sorted(
        {
            f"{page.name}: {url}"
            for page in site.rglob("*.html")
            for url in tag.findall(page.read_text())
        }
    )


def test_the_built_site_loads_nothing_remote(site: Path) -> None:
    """Before, every page loaded the search worker's shim from unpkg.com and the fonts from
    Google: opened from disk without a network, the search box disappeared."""
    assert remote_assets(site) == []
    shim = site / "assets" / "javascripts" / "iframe-worker" / "shim.js"
    assert (
        shim.is_file()
        and 'src="assets/javascripts/iframe-worker/shim.js"' in (site / "index.html").read_text()
    )


def test_search_works_from_disk_with_the_network_off(site: Path, tmp_path: Path) -> None:
    """site/index.html from file:// in chromium, offline and with every http(s) request
    refused (and recorded): the search box finds the page on the lease."""
    from playwright.sync_api import Route, sync_playwright

    if CHROMIUM is None:
        pytest.skip(
            "SKIPPED the offline docs search test: no chromium found (FAR_CHROMIUM, chromium, "
            "chromium-browser on PATH); `make browser` installs Debian chromium as root"
        )
    fetched: list[str] = []

    def refuse(route: Route) -> None:
        fetched.append(route.request.url)
        route.abort("internetdisconnected")

    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path / "profile"),
            executable_path=CHROMIUM,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 900},
        )
        try:
            context.set_offline(True)
            context.route(re.compile(r"^https?://"), refuse)
            page = context.new_page()
            page.goto((site / "index.html").as_uri())
            page.locator("input.md-search__input").fill("lease")
            results = page.locator(".md-search-result__item")
            results.first.wait_for(timeout=20_000)
            assert results.count() > 0
            meta = page.locator(".md-search-result__meta").inner_text()
            assert "Initializing" not in meta, meta
            assert page.locator(".md-search-result__list").get_by_text("lease").first.is_visible()
        finally:
            context.close()
    assert fetched == [], f"the site asked the network for {fetched}"
