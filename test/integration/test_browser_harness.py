"""The browser harness of the dashboard tests (test/browser.py) against a page served on loopback: it starts the
system's chromium without Selenium Manager, sizes the viewport exactly, and sees what the dashboard tests assert
on (CSP violations, an alert, the requests made), so a dashboard test that passes has looked."""

from __future__ import annotations

import http.server
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.selenium_manager import SeleniumManager

from test import browser as chromium
from test.support import serving

# An inline handler: it runs without a policy (/open) and is refused under this one (everywhere else).
PAGE = b"<meta name=viewport content='width=device-width'><p id=x>hi</p><img src=nothing onerror=alert(1)>"
POLICY = "default-src 'none'; script-src 'self'"


class _Page(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        if not self.path.startswith("/open"):
            self.send_header("Content-Security-Policy", POLICY)
        self.send_header("Content-Type", "text/html")
        self.end_headers()
        self.wfile.write(PAGE)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def origin() -> Iterator[str]:
    with serving(http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Page)) as url:
        yield url


@pytest.fixture
def no_selenium_manager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Selenium Manager would fetch a browser and a driver from the internet: fail loudly if anything calls it."""
    def refuse(*args: object) -> None:
        raise AssertionError("Selenium Manager was called")

    monkeypatch.setattr(SeleniumManager, "binary_paths", refuse)


@pytest.mark.parametrize("size, mobile", [(chromium.DESKTOP, False), (chromium.PHONE, True)])
def test_the_system_chromium_starts_with_the_asked_viewport(no_selenium_manager: None, origin: str,
                                                            size: tuple[int, int], mobile: bool) -> None:
    with chromium.running(size, mobile=mobile) as browser:
        browser.get(f"{origin}/")
        width, height = browser.script("return [window.innerWidth, window.innerHeight]")
        assert (width, height) == size
        assert browser.find("#x").text == "hi"
        assert browser.requests()[0] == f"{origin}/"


def test_the_harness_sees_an_alert_without_a_policy_and_violations_with_one(origin: str) -> None:
    with chromium.running() as browser:
        browser.get(f"{origin}/open")
        alert = browser.wait(lambda driver: driver.switch_to.alert, "the inline handler's alert")
        assert alert.text == "1"
        alert.dismiss()
        assert browser.csp_violations() == []

        browser.get(f"{origin}/")
        violations = browser.wait(lambda driver: browser.csp_violations(), "a CSP violation")
        assert any(v.startswith("script-src-attr blocked inline") for v in violations), violations
        with pytest.raises(NoAlertPresentException):
            browser.driver.switch_to.alert  # noqa: B018 - the property raises when no alert is open


def test_artifacts_of_a_failure(origin: str, tmp_path: Path) -> None:
    with chromium.running() as browser:
        browser.get(f"{origin}/")
        saved = browser.save_artifacts(tmp_path, chromium.artifact_stem("test/e2e/x.py::t[a b]", "call", "browser"))
    stem = "test_e2e_x.py_t_a_b_-call-browser"
    assert [p.name for p in saved] == [f"{stem}.png", f"{stem}.html", f"{stem}.console.txt"]
    assert saved[0].read_bytes().startswith(b"\x89PNG")
    assert 'id="x"' in saved[1].read_text()


def test_readme_shots_only_when_asked(origin: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with chromium.running() as browser:
        browser.get(f"{origin}/")
        monkeypatch.delenv("MCAD_SCREENSHOTS", raising=False)
        assert browser.readme_shot("queue") is None
        monkeypatch.setenv("MCAD_SCREENSHOTS", str(tmp_path / "images"))  # absolute: REPO / it is itself
        shot = browser.readme_shot("queue")
    assert shot == tmp_path / "images" / "dashboard-queue.png"
    assert shot.read_bytes().startswith(b"\x89PNG")
