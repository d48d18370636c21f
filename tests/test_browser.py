"""Notebook 4 in a real JupyterLab, driven by headless Chromium: run all cells, change a widget, press Run,
and check that the Gantt chart changed. Saves screenshots (out/browser-*.png).

Needs Debian's chromium (/usr/bin/chromium; .ci/run installs it) and Playwright for Python (which drives
it; Playwright's own browser download is not used). Where either is missing, the test is skipped with a
loud reason rather than passing quietly."""

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = ROOT / "out"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def jupyterlab(tmp_path):
    # A copy of the notebook: JupyterLab saves outputs into the file it has open.
    shutil.copy(ROOT / "notebooks" / "04_tile_explorer.ipynb", tmp_path)
    port, token = _free_port(), secrets.token_hex(16)
    log = open(tmp_path / "jupyterlab.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root", f"--port={port}",
                             "--ip=127.0.0.1", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}",
                             "--ServerApp.open_browser=False"], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while True:
        try:
            urllib.request.urlopen(f"{url}/api/status?token={token}", timeout=2)
            break
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                pytest.fail("JupyterLab did not start within 90 s: " + (tmp_path / "jupyterlab.log").read_text()[-2000:])
            time.sleep(0.5)
    yield url, token
    proc.terminate()
    try:
        proc.wait(20)
    except subprocess.TimeoutExpired:
        proc.kill()
    log.close()


def test_explorer_in_jupyterlab_redraws_after_run(jupyterlab):
    if not os.path.exists(CHROMIUM):
        pytest.skip("!!! BROWSER TEST NOT RUN: no Chromium at /usr/bin/chromium (apt-get install chromium) !!!")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("!!! BROWSER TEST NOT RUN: Playwright for Python is not installed (pip install playwright) !!!")
    url, token = jupyterlab
    SHOTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=[
            "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync"])
        page = browser.new_page(viewport={"width": 1500, "height": 1800})
        page.goto(f"{url}/lab/tree/04_tile_explorer.ipynb?token={token}")
        page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
        # The kernel must be up before Run All; on a cold start (fresh venv) that takes a while.
        page.get_by_text("| Idle").first.wait_for(timeout=180_000)
        for attempt in range(2):
            page.locator(".jp-Notebook").first.click()   # focus the notebook, so Run All applies to it
            page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
            page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
            try:   # the first cell shows an execution count once Run All took effect
                page.locator(".jp-InputPrompt", has_text="[1]").first.wait_for(timeout=60_000)
                break
            except Exception:
                if attempt:
                    page.screenshot(path=str(SHOTS / "browser-explorer-failed.png"), full_page=True)
                    raise
        status = page.locator(".widget-html-content", has_text="run 1:")
        try:
            status.wait_for(timeout=240_000)
        except Exception:
            page.screenshot(path=str(SHOTS / "browser-explorer-failed.png"), full_page=True)
            raise
        gantt = page.locator(".widget-output img").first
        gantt.wait_for(timeout=60_000)
        first_src = gantt.get_attribute("src")
        assert "correct on every rank" in status.inner_text()
        page.screenshot(path=str(SHOTS / "browser-explorer-run1.png"), full_page=True)

        # Change one widget (the algorithm) and press the explorer's Run button.
        page.locator(".widget-dropdown", has_text="algorithm").locator("select").select_option("atomics")
        page.locator("button.jupyter-button", has_text="Run").click()
        page.locator(".widget-html-content", has_text="run 2: atomics").wait_for(timeout=180_000)
        page.wait_for_function("(src) => { const i = document.querySelector('.widget-output img');"
                               " return i && i.src !== src; }", arg=first_src, timeout=60_000)
        second_src = page.locator(".widget-output img").first.get_attribute("src")
        page.screenshot(path=str(SHOTS / "browser-explorer-run2.png"), full_page=True)
        browser.close()
    assert second_src and second_src != first_src
