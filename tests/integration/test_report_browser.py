"""report.html (and compare.html) opened in a real headless Chromium, as the person approving a
rollout would: no literal Markdown on the page, every plot decodes and is visible, the verdict
banner is in the first screen on a laptop and on a phone, nothing is fetched from the network,
the page does not scroll sideways on a phone, and printing shows the folded details.

Chromium is Debian's package (``.ci/run`` installs it). Without it the test skips, except in CI
(``CI=true``), where a missing browser is a failure."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import pytest
from chromium_page import CHROMIUM, Chromium

from pipeline.report.builder import make_comparison, make_report

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "run_small"
MARKDOWN = re.compile(r"\*\*|__|`|^\s*#{1,6} |^\s*> |^\s*\|.*\||\|---|\]\(", re.M)
LAPTOP, PHONE = (1280, 800), (390, 844)
pytestmark = pytest.mark.slow  # starts headless Chromium

IMAGES_JS = """(async () => {
  const imgs = [...document.images];
  const decoded = await Promise.all(imgs.map(i => i.decode().then(() => true, () => false)));
  return imgs.map((img, k) => {
    const r = img.getBoundingClientRect();
    return {alt: img.alt, decoded: decoded[k], natural: [img.naturalWidth, img.naturalHeight],
            box: [r.width, r.height], right: r.right + window.scrollX, visible: img.checkVisibility()};
  });
})()"""
BANNER_JS = """(() => {
  const r = document.getElementById('verdict-banner').getBoundingClientRect();
  return {top: r.top, bottom: r.bottom, left: r.left, right: r.right, height: window.innerHeight,
          width: window.innerWidth, text: document.getElementById('verdict-banner').innerText};
})()"""
PAGE_JS = """({text: document.body.innerText, scrollWidth: document.documentElement.scrollWidth,
            width: window.innerWidth})"""


def _need_chromium() -> None:
    if CHROMIUM.is_file():
        pytest.importorskip("websocket", reason="websocket-client (the dev extra) drives Chromium")
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"{CHROMIUM} is missing in CI: .ci/run installs Debian's chromium package")
    pytest.skip(f"{CHROMIUM} not installed (apt-get install chromium); CI installs it and runs this test")


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> dict[str, Path]:
    _need_chromium()
    root = tmp_path_factory.mktemp("browser")
    run_dir = root / "run"
    shutil.copytree(FIXTURE, run_dir)
    report = make_report(run_dir)
    comparison = make_comparison(FIXTURE, FIXTURE, root / "compare")
    return {"report": report.html_path, "compare": comparison.html_path}


@pytest.fixture(scope="module")
def browser(pages):
    with Chromium() as chromium:
        yield chromium


def _open(browser: Chromium, page: Path, size: tuple[int, int], *, mobile: bool = False) -> None:
    browser.call("Emulation.setEmulatedMedia", media="screen")
    browser.viewport(*size, mobile=mobile)
    browser.open(page)


# the report's figures: speedup, latency, acceptance by category, …, and acceptance per request (issue 42)
FIGURES = 7


def _assert_images_shown(images: list[dict], count: int, width: int) -> None:
    assert len(images) == count
    for img in images:
        assert img["decoded"] and img["natural"][0] > 300 and img["natural"][1] > 150, img
        assert img["visible"] and img["box"][0] > 150 and img["box"][1] > 60, img
        assert img["right"] <= width + 1, img  # never wider than the screen


def _assert_banner_in_first_screen(banner: dict) -> None:
    assert 0 <= banner["top"] and banner["bottom"] <= banner["height"], banner
    assert 0 <= banner["left"] and banner["right"] <= banner["width"], banner


def test_report_on_a_laptop_screen(browser: Chromium, pages, tmp_path: Path):
    _open(browser, pages["report"], LAPTOP)
    assert all(url.startswith(("file:", "data:")) for url in browser.requested_urls()), browser.requested_urls()
    page = browser.evaluate(PAGE_JS)
    assert not MARKDOWN.search(page["text"]), MARKDOWN.search(page["text"])
    assert "Recommended rollout" in page["text"]
    _assert_images_shown(browser.evaluate(IMAGES_JS), FIGURES, LAPTOP[0])
    banner = browser.evaluate(BANNER_JS)
    _assert_banner_in_first_screen(banner)
    assert banner["text"].startswith("GO")
    shot = browser.screenshot(tmp_path / "report-laptop.png")
    from PIL import Image

    with Image.open(shot) as img:
        assert img.size == LAPTOP
        assert len(img.convert("RGB").getcolors(maxcolors=1 << 20) or []) > 50  # not a blank page


def test_report_on_a_phone_screen(browser: Chromium, pages, tmp_path: Path):
    _open(browser, pages["report"], PHONE, mobile=True)
    banner = browser.evaluate(BANNER_JS)
    _assert_banner_in_first_screen(banner)
    assert banner["bottom"] - banner["top"] < banner["height"] / 2, banner  # leaves room for the findings
    page = browser.evaluate(PAGE_JS)
    assert page["scrollWidth"] <= page["width"], page["scrollWidth"]  # wide tables scroll inside their box
    _assert_images_shown(browser.evaluate(IMAGES_JS), FIGURES, PHONE[0])
    browser.screenshot(tmp_path / "report-phone.png")


def test_printing_shows_the_folded_details(browser: Chromium, pages):
    _open(browser, pages["report"], LAPTOP)
    folded = "document.querySelector('details .tw').checkVisibility()"
    assert browser.evaluate(folded) is False  # on screen the passing checks are folded
    browser.call("Emulation.setEmulatedMedia", media="print")
    assert browser.evaluate(folded) is True
    pdf = browser.call("Page.printToPDF", printBackground=True)["data"]
    assert len(pdf) > 10_000
    browser.call("Emulation.setEmulatedMedia", media="screen")


def test_compare_page_in_the_browser(browser: Chromium, pages):
    _open(browser, pages["compare"], LAPTOP)
    page = browser.evaluate(PAGE_JS)
    assert not MARKDOWN.search(page["text"]) and "No ratio moved beyond its CI" in page["text"]
    _assert_images_shown(browser.evaluate(IMAGES_JS), 1, LAPTOP[0])
    _assert_banner_in_first_screen(browser.evaluate(BANNER_JS))
