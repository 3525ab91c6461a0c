"""A real headless browser for the dashboard's tests: Debian's chromium driven by Selenium through chromedriver.

Both binaries come from the system (``chromium`` and ``chromium-driver``, which .ci/run installs when absent;
MCAD_CHROMIUM and MCAD_CHROMEDRIVER point elsewhere). The driver's path is always given to Selenium, so Selenium
Manager never runs: left to itself it looks up, and downloads, a browser and a driver from the internet.

``start`` opens a browser whose viewport is exactly the size asked for (``DESKTOP``, or ``PHONE`` with mobile
emulation, so a page's ``<meta name=viewport>`` counts as on a phone). Around the page it keeps what a test asserts
on besides the DOM: the console (accumulated: chromedriver hands each entry out once), every Content-Security-Policy
violation the page reported (a listener installed before any script of the page runs), and the URL of every
request the page made. ``wait`` is the one way to wait: a WebDriverWait with a deadline, never a sleep.

On failure a test's browser leaves a screenshot, the page source and the console in ``ARTIFACTS`` (the e2e
conftest's report hook calls ``save_artifacts``). With MCAD_SCREENSHOTS=<dir> set, ``readme_shot`` writes the
docs' pictures of each view there (``make screenshots``); otherwise it does nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from selenium import webdriver
from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webelement import WebElement
from selenium.webdriver.support.ui import WebDriverWait

from test.support import REPO

CHROMIUM = os.environ.get("MCAD_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("MCAD_CHROMEDRIVER", "/usr/bin/chromedriver")
DESKTOP = (1280, 900)
PHONE = (390, 844)
ARTIFACTS = REPO / "test-artifacts"
# Generous for a 2-core machine shared with an API server and a controller; a wait ends as soon as it holds.
WAIT = 15.0
T = TypeVar("T")

# Installed before any script of every page: CSP violations are events the page itself sees, and a list in the
# page is how a test reads them back (the console says the same, in prose).
_RECORD_CSP = """
window.__mcadCspViolations = [];
document.addEventListener('securitypolicyviolation', (e) => {
  window.__mcadCspViolations.push(`${e.violatedDirective} blocked ${e.blockedURI || 'inline'}`
    + ` at ${e.sourceFile}:${e.lineNumber}`);
});
"""


class Browser:
    """One headless chromium and what its page did."""

    def __init__(self, driver: webdriver.Chrome, size: tuple[int, int], mobile: bool) -> None:
        self.driver = driver
        self.size = size
        self.mobile = mobile
        self._console: list[dict[str, Any]] = []
        self._requests: list[str] = []

    # -- driving -----------------------------------------------------------------------------------------------------

    def get(self, url: str) -> None:
        self.driver.get(url)

    def wait(self, condition: Callable[[webdriver.Chrome], T | None], what: str, timeout: float = WAIT) -> T:
        """Poll ``condition`` until it returns something truthy and return that; fail naming ``what``.
        Selenium's "not there (yet)" and "replaced meanwhile" (the page re-renders a view on every poll) count as
        not yet."""
        try:
            return WebDriverWait(self.driver, timeout, poll_frequency=0.05,  # type: ignore[no-any-return]
                                 ignored_exceptions=(NoSuchElementException, StaleElementReferenceException)
                                 ).until(condition, message="")
        except TimeoutException:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}") from None

    def find(self, css: str) -> WebElement:
        return self.driver.find_element(By.CSS_SELECTOR, css)

    def find_all(self, css: str) -> list[WebElement]:
        return self.driver.find_elements(By.CSS_SELECTOR, css)

    def visible(self, css: str, what: str | None = None, timeout: float = WAIT) -> WebElement:
        """Wait until an element matching ``css`` is displayed and return it."""
        def shown(driver: webdriver.Chrome) -> WebElement | None:
            return next((e for e in driver.find_elements(By.CSS_SELECTOR, css) if e.is_displayed()), None)

        return self.wait(shown, what or f"{css} to be displayed", timeout)

    def script(self, source: str, *args: Any) -> Any:
        return self.driver.execute_script(source, *args)

    # -- what the page did -------------------------------------------------------------------------------------------

    def console(self) -> list[dict[str, Any]]:
        """Every console entry so far (level, message, timestamp)."""
        self._console += self.driver.get_log("browser")
        return list(self._console)

    def console_errors(self) -> list[str]:
        """Errors of the page's own code; a request answered with an error status (chromium logs each one, a 401
        before signing in too) is the page's business to handle, not an error of the page."""
        return [e["message"] for e in self.console() if e["level"] == "SEVERE" and e.get("source") != "network"]

    def csp_violations(self) -> list[str]:
        """Violations the current page reported, plus console lines about the policy (from earlier pages too)."""
        seen = list(self.script("return window.__mcadCspViolations || []"))
        return seen + [e["message"] for e in self.console() if "Content Security Policy" in e["message"]]

    def requests(self) -> list[str]:
        """The URL of every request the page made so far (from the performance log)."""
        for entry in self.driver.get_log("performance"):
            message = json.loads(entry["message"])["message"]
            if message.get("method") == "Network.requestWillBeSent":
                self._requests.append(message["params"]["request"]["url"])
        return list(self._requests)

    # -- pictures ----------------------------------------------------------------------------------------------------

    def save_artifacts(self, directory: Path, stem: str) -> list[Path]:
        """A screenshot, the page source and the console, for a failed test; returns what it wrote. Whatever it
        cannot get (the browser crashed, or has already quit when a fixture's teardown fails) it leaves out."""
        directory.mkdir(parents=True, exist_ok=True)
        written = []
        png, html, log = (directory / f"{stem}{ext}" for ext in (".png", ".html", ".console.txt"))
        with contextlib.suppress(Exception):
            if self.driver.save_screenshot(str(png)):
                written.append(png)
        with contextlib.suppress(Exception):
            html.write_text(f"<!-- {self.driver.current_url} -->\n{self.driver.page_source}")
            written.append(html)
        with contextlib.suppress(Exception):
            log.write_text("".join(f"{e['level']} {e.get('source', '')} {e['message']}\n" for e in self.console()))
            written.append(log)
        return written

    def readme_shot(self, view: str) -> Path | None:
        """With MCAD_SCREENSHOTS=<dir> (relative to the repository), save the viewport as <dir>/dashboard-<view>.png."""
        where = os.environ.get("MCAD_SCREENSHOTS")
        if not where:
            return None
        directory = REPO / where
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"dashboard-{view}.png"
        assert self.driver.save_screenshot(str(path)), f"chromium did not save {path}"
        return path

    def quit(self) -> None:
        self.driver.quit()


def options(size: tuple[int, int]) -> webdriver.ChromeOptions:
    found = webdriver.ChromeOptions()
    found.binary_location = CHROMIUM
    for arg in ("--headless=new",
                "--no-sandbox",  # the tests run as root, where chromium's sandbox refuses to start
                "--disable-dev-shm-usage",  # containers have a small /dev/shm
                "--disable-gpu", "--no-first-run", "--no-default-browser-check",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                f"--window-size={size[0]},{size[1]}"):
        found.add_argument(arg)
    found.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    # An alert stays open for the test to find (the default dismisses it and fails some later command instead).
    found.unhandled_prompt_behavior = "ignore"
    return found


def start(size: tuple[int, int] = DESKTOP, *, mobile: bool = False) -> Browser:
    """A fresh browser (its own profile) with a viewport of exactly ``size`` CSS pixels."""
    if not Path(CHROMEDRIVER).is_file():
        raise FileNotFoundError(f"{CHROMEDRIVER} is missing: install chromium-driver (.ci/run does) or set "
                                "MCAD_CHROMEDRIVER")
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options(size))
    try:
        # The window's size includes what headless chromium still counts as its frame: fix the viewport itself.
        driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride", {
            "width": size[0], "height": size[1], "deviceScaleFactor": 2 if mobile else 1, "mobile": mobile})
        if mobile:
            driver.execute_cdp_cmd("Emulation.setTouchEmulationEnabled", {"enabled": True, "maxTouchPoints": 5})
        driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": _RECORD_CSP})
    except BaseException:
        driver.quit()
        raise
    return Browser(driver, size, mobile)


@contextlib.contextmanager
def running(size: tuple[int, int] = DESKTOP, *, mobile: bool = False) -> Iterator[Browser]:
    browser = start(size, mobile=mobile)
    try:
        yield browser
    finally:
        browser.quit()


def artifact_stem(nodeid: str, when: str, argname: str) -> str:
    """A file name for a test's artifacts: its node id made safe, the phase and the fixture."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{nodeid}-{when}-{argname}").strip("_")
