"""The documentation site: it builds with ``mkdocs build --strict``; its generated
reference pages hold every command, option and setting of the code; and, served over HTTP
and opened in a headless Chromium, its pages show their content and its search finds
things, with nothing fetched from anywhere but the site itself. One build for the module."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import bs4
import pytest

from tests.docs.blocks import ROOT, all_blocks


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout[-4000:]}{done.stderr[-6000:]}"
    return out


def soup(site: Path, page: str) -> Any:
    return bs4.BeautifulSoup((site / page / "index.html").read_text(), "html.parser")


def section_text(page: Any, anchor: str | None) -> str:
    """The text of a page's section: from the heading with id ``anchor`` (None: the page's
    title) to the next heading of the same level or above."""
    content = page.select_one("article.md-content__inner")
    heading = content.find("h1") if anchor is None else content.find(id=anchor)
    assert heading is not None and re.fullmatch(r"h[1-6]", heading.name), f"no heading #{anchor}"
    level = int(heading.name[1])
    parts = [heading.get_text(" ")]
    for node in heading.find_next_siblings():
        if re.fullmatch(r"h[1-6]", node.name) and int(node.name[1]) <= max(level, 2):
            break
        parts.append(node.get_text(" "))
    return " ".join(" ".join(parts).split())


def test_the_site_builds_with_every_page_and_chart(site: Path) -> None:
    for page in ("index.html", "getting-started/index.html", "guides/windows/index.html", "design/index.html"):
        assert (site / page).is_file(), page
    for chart in ("throughput", "windows", "failover"):
        svg = (site / "charts" / f"{chart}.svg").read_text()
        assert svg.lstrip().startswith("<?xml") and "<svg" in svg and "streamkit" in svg, chart
    # the generated pages exist only in the build, never as files of docs/
    assert not (ROOT / "docs/reference/cli.md").exists() and not (ROOT / "docs/reference/settings.md").exists()


def mentions(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(word)}(?![\w-])", text) is not None


def test_every_command_and_option_is_in_the_cli_reference(site: Path) -> None:
    import typer

    from streamkit.cli import app

    page = soup(site, "reference/cli")
    missing: list[str] = []

    def walk(command: Any, path: list[str], parent: Any) -> None:
        ctx = command.context_class(command, info_name=path[-1], parent=parent)
        text = section_text(page, None if len(path) == 1 else "-".join(path))
        if len(path) > 1 and f"{' '.join(path)}" not in text:
            missing.append(f"{' '.join(path)}: no section")
        for param in command.get_params(ctx):
            if getattr(param, "hidden", False):
                continue
            names = [*param.opts, *param.secondary_opts] if param.param_type_name == "option" else []
            names = names or [param.get_help_record(ctx)[0].split()[0]]  # an argument: its metavar
            missing.extend(f"{' '.join(path)} {n}" for n in names if not mentions(text, n))
        for name, sub in sorted(getattr(command, "commands", {}).items()):
            if not sub.hidden:
                walk(sub, [*path, name], ctx)

    walk(typer.main.get_command(app), ["streamkit"], None)
    assert missing == [], f"missing from the built CLI reference: {missing}"


def test_every_setting_is_in_the_settings_reference(site: Path) -> None:
    from streamkit.settings import Settings

    page = soup(site, "reference/settings")
    missing = []
    for name, field in Settings.model_fields.items():
        text = section_text(page, name)
        wanted = [name, f"STREAMKIT_{name.upper()}"]
        if field.description:
            wanted.append(" ".join(field.description.replace("`", "").split()))
        missing += [f"{name}: {w!r}" for w in wanted if w not in text]
    assert missing == [], "missing from the built settings reference:\n" + "\n".join(missing)


def test_the_reference_checks_can_fail(site: Path) -> None:
    page = soup(site, "reference/cli")
    assert "--partitions" in section_text(page, "streamkit-topics-create")
    assert "--partitions" not in section_text(page, "streamkit-reset")  # sections do not run into each other
    with pytest.raises(AssertionError):
        section_text(page, "streamkit-no-such-command")


def test_not_run_blocks_show_their_title(site: Path) -> None:
    titles: dict[str, set[str]] = {}
    for block in all_blocks():
        if block.not_run and block.page.startswith("docs/"):
            titles.setdefault(block.page, set()).add(block.title or "")
    assert titles
    for page, wanted in titles.items():
        url = page.removeprefix("docs/").removesuffix(".md").removesuffix("index")
        shown = {t.get_text(" ").strip() for t in soup(site, url).select(".highlight .filename")}
        assert wanted <= shown, f"{page}: titles not shown: {wanted - shown}"


# -- in a browser ----------------------------------------------------------------------------


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def served(site: Path) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


def open_page(browser: Any, url: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(url)
    WebDriverWait(browser, 30).until(ec.presence_of_element_located((By.CSS_SELECTOR, "article.md-content__inner h1")))


def fetched_elsewhere(browser: Any, served: str) -> list[str]:
    urls = browser.execute_script("return performance.getEntriesByType('resource').map(e => e.name)")
    return [u for u in urls if not u.startswith(served) and not u.startswith("data:")]


def test_the_pages_render_in_a_browser(browser: Any, served: str) -> None:
    from selenium.webdriver.common.by import By

    open_page(browser, served)
    article = browser.find_element(By.CSS_SELECTOR, "article.md-content__inner")
    assert browser.find_element(By.CSS_SELECTOR, "article h1").text == "streamkit"
    assert "What sets it apart" in article.text and "TestDriver(app)" in article.text
    nav = browser.find_element(By.CSS_SELECTOR, "nav.md-nav--primary").get_attribute("textContent")
    assert all(s in nav for s in ("Getting started", "Concepts", "Guides", "Reference", "Benchmarks"))
    assert fetched_elsewhere(browser, served) == []

    open_page(browser, served + "guides/windows/")
    article = browser.find_element(By.CSS_SELECTOR, "article.md-content__inner")
    assert browser.find_element(By.CSS_SELECTOR, "article h1").text == "Windows"
    cells = [td.text for td in article.find_elements(By.CSS_SELECTOR, "table td")]
    assert "Tumbling(size)" in cells and "Session(gap, merge=...)" in cells
    assert "@app.on_window_close(per_minute)" in article.text
    assert fetched_elsewhere(browser, served) == []

    open_page(browser, served + "reference/api/")
    app = browser.find_element(By.ID, "streamkit.App")
    assert "streamkit.App" in app.text
    driver_doc = browser.find_element(By.ID, "streamkit.testing.TestDriver")
    assert "TestDriver" in driver_doc.text
    signatures = browser.find_elements(By.CSS_SELECTOR, "article .doc-signature")
    assert any("processor(" in s.text for s in signatures), "no signature of App.processor"
    assert fetched_elsewhere(browser, served) == []

    open_page(browser, served + "benchmarks/")
    charts = browser.find_elements(By.CSS_SELECTOR, "article img[src$='.svg']")
    assert len(charts) == 3 and all(
        browser.execute_script("return arguments[0].complete && arguments[0].naturalWidth > 0", c) for c in charts
    )


def test_search_finds_standby(browser: Any, served: str) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    open_page(browser, served)
    box = WebDriverWait(browser, 30).until(ec.element_to_be_clickable((By.CSS_SELECTOR, "input.md-search__input")))
    box.click()
    box.send_keys("standby")
    from selenium.common.exceptions import StaleElementReferenceException

    results = WebDriverWait(browser, 30, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda b: [r for r in b.find_elements(By.CSS_SELECTOR, ".md-search-result__item") if r.text.strip()]
    )  # (the results are drawn again as the index answers: an element read in between is stale)
    texts = " ".join(r.text for r in results).lower()
    assert "standby" in texts, texts[:2000]
    links = [a.get_attribute("href") for a in browser.find_elements(By.CSS_SELECTOR, ".md-search-result__link")]
    assert any("guides/standby-replicas/" in (href or "") for href in links), links
    assert fetched_elsewhere(browser, served) == []
