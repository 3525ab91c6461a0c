"""The dashboard page as its browser tests drive it (test_dashboard.py, test_dashboard_standby.py): where it is,
signing in, reading rows and cells (in one script call each: the page re-renders every second), waiting for
views, and browsing as a user through the API server's service proxy."""

from __future__ import annotations

import json
from typing import Any

import kubernetes.client as k8s
import pytest
from selenium.common.exceptions import NoAlertPresentException
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select

from mcad.api.resources import to_canonical
from test.browser import Browser
from test.e2e.conftest import Controller
from test.e2e.dashboard import SERVICE


def origin(ctl: Controller) -> str:
    return f"http://{ctl.host}:{ctl.port}"


def page_url(ctl: Controller) -> str:
    return f"{origin(ctl)}/ui/"


def sign_in(browser: Browser, ctl: Controller, token: str, view: str = "queue") -> None:
    """Open the page at ``view``; it finds out it needs a token (401), shows its form; sign in there."""
    browser.get(f"{page_url(ctl)}#{view}")
    field = browser.visible("form#login input#token", "the sign-in form (the data views answer 401 without a token)")
    field.send_keys(token, Keys.ENTER)
    browser.wait(lambda _: not browser.find("form#login").is_displayed()
                 and browser.find("#status").text.startswith("updated"), "the page's first update after signing in")


def row(browser: Browser, key: str) -> dict[str, str] | None:
    """The queue row of AppWrapper ``key`` ("ns/name") as cell class -> text, None while the page has none."""
    return browser.script("""
        const tr = document.querySelector(`#queue tbody tr[data-key="${CSS.escape(arguments[0])}"]`);
        if (!tr) return null;
        const cells = {};
        for (const td of tr.querySelectorAll("td")) cells[td.className] = td.textContent.trim();
        return cells;""", key)


def wait_row(browser: Browser, key: str, what: str, timeout: float = 30, **want: str) -> dict[str, str]:
    """Wait until the row of ``key`` shows each cell of ``want`` (class=text) and return its cells."""
    def shown(_: Any) -> dict[str, str] | None:
        cells = row(browser, key)
        return cells if cells and all(cells.get(k) == v for k, v in want.items()) else None

    try:
        return browser.wait(shown, what, timeout)
    except AssertionError as err:
        raise AssertionError(f"{err}; the row shows {row(browser, key)}") from None


def node_cell(browser: Browser, node_name: str, resource: str = "cpu") -> dict[str, str] | None:
    """The heat map cell of ``node_name``: its data attributes and text."""
    return browser.script("""
        const td = document.querySelector(
            `#nodes tr[data-node="${CSS.escape(arguments[0])}"] td[data-resource="${CSS.escape(arguments[1])}"]`);
        return td && {...td.dataset, text: td.textContent};""", node_name, resource)


def wait_node_cpu(browser: Browser, node_name: str, used_millis: int) -> dict[str, str]:
    def shown(_: Any) -> dict[str, str] | None:
        cell = node_cell(browser, node_name)
        return cell if cell and to_canonical("cpu", cell["used"]) == used_millis and \
            to_canonical("cpu", cell["reserved"]) == 0 else None

    try:
        return browser.wait(shown, f"node {node_name} to show {used_millis}m cpu used, none reserved", 30)
    except AssertionError as err:
        raise AssertionError(f"{err}; its cell: {node_cell(browser, node_name)}") from None


def texts(browser: Browser, css: str) -> list[str]:
    """The rendered text of every element ``css`` matches, read at once (the page re-renders while a test reads)."""
    return browser.script("return [...document.querySelectorAll(arguments[0])].map(e => e.innerText)", css)


def choose(browser: Browser, css: str, value: str) -> None:
    """Pick ``value`` in the select ``css`` once the page offers it (its options follow the data)."""
    def chosen(_: Any) -> bool:
        Select(browser.find(css)).select_by_value(value)
        return True

    browser.wait(chosen, f"{css} to offer {value!r}")


def headline(browser: Browser, stat: str) -> int:
    """A headline number; -1 while the page shows none."""
    text = browser.find(f'#summary [data-stat="{stat}"]').text.strip()
    return int(text) if text.isdigit() else -1


def show(browser: Browser, view: str) -> None:
    """Go to a view through its nav link, as a person would, and wait until the page has updated it."""
    before = browser.find("#status").text
    browser.find(f"a#tab-{view}").click()
    browser.visible(f"#view-{view}", f"the {view} view")
    browser.wait(lambda _: (now := browser.find("#status").text) != before and now.startswith("updated"),
                 f"the page to update the {view} view")


def detail_of(browser: Browser, key: str) -> None:
    browser.wait(lambda _: browser.find("#detail-heading").text == key and browser.find("#detail").is_displayed(),
                 f"the explanation of {key} to open")


def explain(ctl: Controller, namespace: str, name: str) -> dict[str, Any]:
    """/debug/explain's document, as the endpoint reader (what `mcadctl explain` prints)."""
    code, text = ctl.get(f"/debug/explain?namespace={namespace}&name={name}")
    assert code == 200, (code, text)
    return json.loads(text)  # type: ignore[no-any-return]


def no_alert(browser: Browser) -> None:
    with pytest.raises(NoAlertPresentException):
        browser.driver.switch_to.alert  # noqa: B018 - the property raises when no alert is open


def as_user(browser: Browser, token: str) -> None:
    """Every request of the browser carries ``token`` to the API server, as `kubectl proxy` would add it; the
    local API server's certificate is self-signed."""
    browser.driver.execute_cdp_cmd("Network.enable", {})
    browser.driver.execute_cdp_cmd("Network.setExtraHTTPHeaders", {"headers": {"Authorization": f"Bearer {token}"}})
    browser.driver.execute_cdp_cmd("Security.setIgnoreCertificateErrors", {"ignore": True})


def proxy_url(api: k8s.ApiClient, namespace: str) -> str:
    return f"{api.configuration.host}/api/v1/namespaces/{namespace}/services/{SERVICE}:http/proxy/ui/"
