"""The dashboard (/ui) in a real browser, headless chromium (test/browser.py), against a real controller on the
test cluster: what docs/dashboard.md promises, as a person at the page would check it.

The controller runs as in production: the data views want a bearer token, so every test signs in through the
page's own form with the session's endpoint reader token (``endpoint_reader``) and the page keeps it in memory
(never in the origin's storage, which the API server's proxy shares with every service behind it).
AppWrappers whose state a test depends on are pinned to a fake node of known size (``fake_node``), so they fit,
wait and move where the test wants on any cluster. Waits are bounded polls of the DOM; the page is never
reloaded, so what a test sees arrived by the page's own polling. A failed test leaves the browser's screenshot,
page source and console in test-artifacts/; MCAD_SCREENSHOTS=docs/images (``make screenshots``) saves the
README's picture of each view.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes.client as k8s
import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.keys import Keys

from mcad.api import faulttolerance as ft
from mcad.api.resources import to_canonical
from mcad.cli.offline import reports as offline_reports
from mcad.k8s import kube
from test.browser import Browser
from test.e2e import quota
from test.e2e.conftest import (
    GROUP,
    LOGS,
    NODE_LABEL,
    PLURAL,
    VERSION,
    AppWrappers,
    Controller,
    appwrapper,
    blocked_on,
    deployment_item,
    fake_node,
    pinned,
    running_controller,
    service_account_token,
)
from test.e2e.dashboard import (
    CONTENT_SECURITY_POLICY,
    SERVICE,
    controller_service,
    dashboard_user,
    host_ip,
    http_get,
    mcadctl_dashboard,
    user_kubeconfig,
)
from test.e2e.dashboard_page import (
    as_user,
    choose,
    detail_of,
    explain,
    headline,
    no_alert,
    origin,
    page_url,
    proxy_url,
    row,
    show,
    sign_in,
    texts,
    wait_node_cpu,
    wait_row,
)
from test.e2e.quota import QuotaTrees, node, subtree
from test.e2e.test_endpoint_access import TENANT_ROLE
from test.support import wait_until

# What a tenant may write where the page shows it: markup that would make an element, run a handler, or both.
PAYLOAD = '<img src=x onerror=alert(1)><b class="mcad-pwned">bold</b>'
# The bound for a change to reach the page without a reload, from the moment the delete returned.
LIVE_WITHIN = 3.0
DASH = "\N{EN DASH}"  # the page writes its ranges with one: "1 (en dash) 50 of 53"


@pytest.fixture(scope="module")
def controller(controller_kubeconfig: str, crd: None, quota_crd: None) -> Iterator[Controller]:
    """The module's controller, started once the QuotaSubtree CRD exists (so its quota trees are on); the data
    views want a token, as in production. It listens on this machine's non-loopback address, where the API
    server's service proxy can reach it (test/e2e/dashboard.py)."""
    with running_controller(controller_kubeconfig, LOGS / "test_dashboard.log",
                            "--http-bind-address", f"{host_ip()}:0") as ctl:
        yield ctl


@pytest.fixture
def small_node(core: k8s.CoreV1Api) -> Iterator[tuple[str, dict[str, str]]]:
    """A fake node of exactly 3 cpu: its name and the nodeSelector that pins pods to it."""
    with fake_node(core, cpu="3", memory="8Gi") as selector:
        yield f"mcad-test-node-{selector[NODE_LABEL]}", selector


@pytest.fixture
def other_tenant(other_namespace: str, kubeconfig: str) -> str:
    """Another tenant's namespace, and the ClusterRole of a tenant's rights (its AppWrappers only)."""
    kube.Client(kube.connect(kubeconfig)).apply({
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": TENANT_ROLE},
        "rules": [{"apiGroups": [GROUP], "resources": [PLURAL],
                   "verbs": ["create", "get", "list", "watch", "delete"]}]}, field_manager="mcad-e2e", force=True)
    return other_namespace


# -- the tests ---------------------------------------------------------------------------------------------------


def test_the_queue_says_why_and_where_and_follows_a_delete_live(
        browser: Browser, controller: Controller, endpoint_reader: str, small_node: tuple[str, dict[str, str]],
        aws: AppWrappers, record_property: Any) -> None:
    # (small_node before aws: the namespace and its pods go first, then the node they ran on.)
    node_name, selector = small_node
    aws.create(appwrapper("first", pinned(deployment_item("first", 1, "2"), selector)))
    aws.wait_state("first", "Running")
    aws.create(appwrapper("second", pinned(deployment_item("second", 1, "1500m"), selector)))
    aws.wait_state("second", "Pending")
    first, second = f"{aws.namespace}/first", f"{aws.namespace}/second"

    sign_in(browser, controller, endpoint_reader)
    waiting = wait_row(browser, second, "the waiting AppWrapper at the head of the queue", position="1",
                       state="Queued")
    assert blocked_on(waiting["why"], "cpu"), waiting
    assert "cpu" in waiting["demand"], waiting
    # Its estimated start, from now ("in 5m"), or "unknown" when none can be made.
    assert re.fullmatch(r"in \d+[smhd].*|now|unknown", waiting["expected"]), waiting
    assert browser.find("#fair-share").text.startswith("fair sharing is off"), "this controller runs without it"
    wait_row(browser, first, "the running AppWrapper, after the queued ones", position="", state="Running")
    # The headline numbers come from the controller's metrics, sampled every 10 s (mcad.serve.history).
    browser.wait(lambda _: headline(browser, "queued") >= 1 and headline(browser, "dispatched") >= 1,
                 "the headline numbers to count the queued and the running AppWrapper", timeout=30)
    browser.readme_shot("queue")

    show(browser, "nodes")
    wait_node_cpu(browser, node_name, 2000)

    show(browser, "queue")
    wait_row(browser, second, "the queue again", position="1")
    browser.script("window.__mcadSamePage = true")  # gone if anything reloads the page
    aws.delete("first")
    deleted = time.monotonic()
    wait_row(browser, second, f"the waiting AppWrapper to be Running on the page within {LIVE_WITHIN:.0f} s",
             timeout=LIVE_WITHIN, state="Running", position="")
    record_property("seconds_from_delete_to_running_on_the_page", round(time.monotonic() - deleted, 2))
    browser.wait(lambda _: row(browser, first) is None, "the deleted AppWrapper's row to go")
    assert browser.script("return window.__mcadSamePage") is True, "the page was reloaded"

    show(browser, "nodes")  # the heat map shows what the moved one took, no longer what the deleted one held
    cell = wait_node_cpu(browser, node_name, 1500)
    assert cell["text"].startswith(f"{cell['used']} / {cell['allocatable']}"), cell
    assert to_canonical("cpu", cell["allocatable"]) == 3000, cell
    browser.readme_shot("nodes")


def test_html_from_a_tenant_is_shown_as_text(browser: Browser, controller: Controller, endpoint_reader: str,
                                             aws: AppWrappers) -> None:
    body = appwrapper("markup", deployment_item("markup", 1, "10m"))
    # Label values may not hold markup (the API server refuses '<'); annotations may hold anything.
    body["metadata"]["labels"] = {"team": "img-src-x-onerror"}
    body["metadata"]["annotations"] = {"note": PAYLOAD}
    aws.create(body)
    key = f"{aws.namespace}/markup"

    sign_in(browser, controller, endpoint_reader)
    wait_row(browser, key, "the AppWrapper's row")
    browser.find(f'#queue tr[data-key="{key}"] td.name button').click()
    detail_of(browser, key)
    shown = browser.wait(lambda _: next((li.text for li in browser.find_all("#detail ul.annotations li")
                                         if li.text.startswith("note:")), None), "the annotation in the explanation")
    assert shown == f"note: {PAYLOAD}", "the annotation is not shown as the text it is"
    assert texts(browser, "#detail ul.labels li") == ["team=img-src-x-onerror"]

    assert browser.script("return document.querySelectorAll('img, .mcad-pwned').length") == 0
    no_alert(browser)
    assert browser.csp_violations() == []  # nothing the tenant wrote reached the page as script or markup


def test_a_row_opens_its_explanation_from_the_keyboard(browser: Browser, controller: Controller,
                                                       endpoint_reader: str, aws: AppWrappers) -> None:
    aws.create(appwrapper("too-big", deployment_item("too-big", 1, "100000")))  # fits on no node, ever
    aws.wait_state("too-big", "Pending")
    key = f"{aws.namespace}/too-big"
    sign_in(browser, controller, endpoint_reader)
    wait_row(browser, key, "the waiting AppWrapper's row", state="Queued")

    button = browser.find(f'#queue tr[data-key="{key}"] td.name button')
    keys = ActionChains(browser.driver)
    for _ in range(60):  # the nav links, the filters and the paging buttons come first
        if browser.script("return document.activeElement === arguments[0]", button):
            break
        keys.send_keys(Keys.TAB).perform()
    else:
        raise AssertionError("Tab never reached the row's name button")
    keys.send_keys(Keys.ENTER).perform()

    detail_of(browser, key)
    assert browser.script("return document.activeElement.id") == "detail-heading"  # focus follows, for readers
    summary = explain(controller, aws.namespace, "too-big")["summary"]
    browser.wait(lambda _: browser.find("#detail .summary").text == summary,
                 f"the explanation to read as mcadctl explain's: {summary!r}")
    browser.wait(lambda _: any(li.text.startswith("position 1 of") for li in browser.find_all("#detail ul.details li")),
                 "the details to say where it stands")
    browser.readme_shot("explanation")

    keys.send_keys(Keys.ESCAPE).perform()
    browser.wait(lambda _: not browser.find("#detail").is_displayed(), "Escape to close the explanation")
    assert browser.script("return document.activeElement === arguments[0]", button), "focus is back on the row"


def test_a_phone_sized_screen_can_use_the_queue(phone: Browser, controller: Controller, endpoint_reader: str,
                                                aws: AppWrappers) -> None:
    aws.create(appwrapper("too-big", deployment_item("too-big", 1, "100000")))
    aws.create(appwrapper("small", deployment_item("small", 1, "10m")))
    key = f"{aws.namespace}/too-big"
    sign_in(phone, controller, endpoint_reader)
    wait_row(phone, key, "the waiting AppWrapper's row", state="Queued")
    wait_row(phone, f"{aws.namespace}/small", "the running AppWrapper's row", state="Running")

    # The page lays out at the phone's width (its viewport meta works), and only the table's own container may
    # scroll sideways: the page itself does not.
    assert phone.script("return window.innerWidth") == 390
    widths = phone.script("return [document.documentElement.scrollWidth, document.body.scrollWidth]")
    assert max(widths) <= 390, f"the page is wider than the phone: {widths}"
    assert phone.script(LOW_CONTRAST) == [], "the cards' text is hard to read"
    phone.script("document.querySelector('#view-queue').scrollIntoView()")
    phone.readme_shot("phone")

    button = phone.find(f'#queue tr[data-key="{key}"] td.name button')
    phone.script("arguments[0].scrollIntoView({block: 'center', inline: 'center'})", button)
    button.click()
    detail_of(phone, key)
    # The explanation opens in view (the page moves focus to its heading) and reads in full.
    summary = phone.wait(lambda _: (p := phone.find("#detail .summary")).is_displayed() and p.text,
                         "the explanation's summary")
    assert summary.startswith("It is queued"), summary
    assert phone.script("""const r = document.querySelector('#detail-heading').getBoundingClientRect();
                           return r.top >= 0 && r.bottom <= window.innerHeight;"""), "the explanation is out of view"
    widths = phone.script("return [document.documentElement.scrollWidth, document.body.scrollWidth]")
    assert max(widths) <= 390, f"with the explanation open, the page is wider than the phone: {widths}"


def test_the_quota_trees_show_use_against_limits(browser: Browser, controller: Controller, endpoint_reader: str,
                                                 small_node: tuple[str, dict[str, str]], aws: AppWrappers,
                                                 custom: k8s.CustomObjectsApi) -> None:
    _, selector = small_node
    tree = f"team_{quota.suffix()}"
    with quota.trees_in(custom, aws) as trees:
        make_trees(trees, tree)
        quota.wait_tree(controller, tree, 3)
        aws.create(quota.aw("training", {tree: "research"}, selector, "1500m"))
        aws.create(quota.aw("serving", {tree: "production"}, selector, "500m"))
        aws.wait_state("training", "Running")
        aws.wait_state("serving", "Running")

        sign_in(browser, controller, endpoint_reader, view="quota")
        section = f'#quota .tree[data-tree="{tree}"]'

        def used(name: str) -> int | None:
            cell = browser.script(f"""
                const td = document.querySelector('{section} .quota-node[data-node="{name}"] td[data-resource="cpu"]');
                return td && td.dataset.used;""")
            return to_canonical("cpu", cell) if cell else None

        browser.wait(lambda _: (used("research"), used("production"), used("root")) == (1500, 500, 2000),
                     "the quota tree's bars to show each node's cpu in use")
        browser.readme_shot("quota")


def make_trees(trees: QuotaTrees, tree: str) -> None:
    """A root of 2 cpu with a research node (1 cpu, may borrow) and a production node (1 cpu, hard)."""
    trees.create(subtree("root", tree, node("root", cpu="2", memory="8Gi")),
                 subtree("children", tree, node("research", hard=False, cpu="1", memory="4Gi"),
                         node("production", hard=True, cpu="1", memory="4Gi"), parent="root"))


def test_the_page_keeps_to_its_policy_and_its_host(browser: Browser, controller: Controller, endpoint_reader: str,
                                                   small_node: tuple[str, dict[str, str]], aws: AppWrappers) -> None:
    for path in ("/ui/", "/ui/app.js", "/ui/app.css"):
        reply = http_get(f"{origin(controller)}{path}")
        assert reply.status == 200, (path, reply.status)
        assert reply.headers["content-security-policy"] == CONTENT_SECURITY_POLICY, path
        assert reply.headers["x-content-type-options"] == "nosniff", path
        assert reply.headers["referrer-policy"] == "no-referrer", path

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any) -> None:
            return None

    with pytest.raises(urllib.error.HTTPError) as redirect:
        urllib.request.build_opener(NoRedirect).open(f"{origin(controller)}/ui", timeout=10)
    # Relative, so that it also works behind the API server's proxy, which prefixes every path.
    assert (redirect.value.code, redirect.value.headers["Location"]) == (302, "ui/")

    _, selector = small_node
    aws.create(appwrapper("running", pinned(deployment_item("running", 1, "1"), selector)))
    aws.create(appwrapper("waiting", pinned(deployment_item("waiting", 1, "3"), selector)))
    aws.wait_state("waiting", "Pending")
    sign_in(browser, controller, endpoint_reader)
    key = f"{aws.namespace}/waiting"
    wait_row(browser, key, "the waiting AppWrapper's row", state="Queued")
    browser.find(f'#queue tr[data-key="{key}"] td.name button').click()
    detail_of(browser, key)
    for view in ("nodes", "quota", "queue"):
        show(browser, view)

    assert browser.csp_violations() == []
    assert browser.console_errors() == []
    home = f"{origin(controller)}/"
    assert [url for url in browser.requests() if not url.startswith(home)] == [], "the page left its host"


# -- through the API server ---------------------------------------------------------------------------------------


@pytest.fixture
def site(core: k8s.CoreV1Api, aws: AppWrappers, controller: Controller) -> Iterator[str]:
    """The test namespace with the controller's Service in it (a stand-in Pod at this machine's address) and an
    AppWrapper there that waits forever."""
    controller_service(core, aws.namespace, host_ip(), controller.port)
    aws.create(appwrapper("waiting", deployment_item("waiting", 1, "100000")))
    yield aws.namespace
    # The stand-in Pod is on no node, so nothing would ever finish it: aws waits for every pod to go.
    core.delete_namespaced_pod(f"{SERVICE}-0", aws.namespace, grace_period_seconds=0)


def test_through_the_service_proxy_the_page_loads_for_a_user_with_services_proxy(
        browser: Browser, site: str, kubeconfig: str, api: k8s.ApiClient) -> None:
    token = dashboard_user(kubeconfig, site, "viewer", service_proxy=True)
    as_user(browser, token)
    # The API server keeps the Authorization it checked to itself: the controller asks for a token, and the page
    # sends it in its own header, which the proxy passes on.
    browser.get(proxy_url(api, site))
    field = browser.visible("form#login input#token", "the sign-in form, behind the API server's proxy")
    field.send_keys(token, Keys.ENTER)
    key = f"{site}/waiting"
    wait_row(browser, key, "the user's waiting AppWrapper, through the service proxy", state="Queued")
    assert browser.script("return [...document.querySelectorAll('#filter-namespace option')].map(o => o.value)") == \
        ["", site], "a tenant sees its own namespace only"
    assert browser.csp_violations() == []
    assert browser.console_errors() == []
    # This origin is the API server's, shared by every service proxied through it; none of its storage
    # may hold the token, so no other proxied page can read it. The page keeps it in memory: a reload asks again.
    assert_token_nowhere_in_the_origin(browser, token)
    browser.driver.refresh()
    browser.visible("form#login input#token", "the sign-in form again after a reload (the token was not stored)")


def assert_token_nowhere_in_the_origin(browser: Browser, token: str) -> None:
    """Neither Web Storage nor any cookie of the page's origin (HttpOnly ones included) holds ``token``."""
    stored = browser.script("""
        const all = [];
        for (const storage of [sessionStorage, localStorage])
          for (let i = 0; i < storage.length; i++) all.push(storage.key(i), storage.getItem(storage.key(i)));
        return all;""")
    assert not [item for item in stored if token in item], "the token is in the origin's Web Storage"
    assert browser.script("return sessionStorage.length + localStorage.length") == 0, stored
    cookies = browser.driver.get_cookies()
    assert not [c for c in cookies if token in str(c.get("value", ""))], "the token is in a cookie"
    assert token not in browser.script("return document.cookie")


def test_through_the_service_proxy_a_user_without_services_proxy_is_refused(
        browser: Browser, site: str, kubeconfig: str, api: k8s.ApiClient) -> None:
    as_user(browser, dashboard_user(kubeconfig, site, "tenant", service_proxy=False))
    browser.get(proxy_url(api, site))
    text = browser.wait(lambda _: browser.find("body").text, "the API server's answer")
    assert 'cannot get resource \\"services/proxy\\"' in text or 'cannot get resource "services/proxy"' in text, text
    assert browser.find_all("#queue, form#login") == [], "the page itself was served"


def test_mcadctl_dashboard_opens_the_page_for_a_user_with_services_proxy_only(
        browser: Browser, site: str, kubeconfig: str, tmp_path: Path) -> None:
    viewer = user_kubeconfig(kubeconfig, dashboard_user(kubeconfig, site, "viewer", service_proxy=True), tmp_path,
                             "viewer")
    with mcadctl_dashboard(viewer, site) as dashboard:
        browser.get(dashboard.url)
        # No sign-in: mcadctl shows the controller the token of its kubeconfig.
        wait_row(browser, f"{site}/waiting", "the user's waiting AppWrapper, through mcadctl dashboard",
                 state="Queued")
        assert not browser.find("form#login").is_displayed()
        assert browser.csp_violations() == []

    tenant = user_kubeconfig(kubeconfig, dashboard_user(kubeconfig, site, "tenant", service_proxy=False), tmp_path,
                             "tenant")
    with mcadctl_dashboard(tenant, site) as dashboard:
        browser.get(dashboard.url)
        text = browser.wait(lambda _: browser.find("body").text, "mcadctl's page saying what is missing")
        assert "services/proxy" in text, text
        assert browser.find_all("#queue, form#login") == [], "the page itself was served"


def test_the_queue_is_served_a_page_at_a_time_and_filtered(browser: Browser, controller: Controller,
                                                           endpoint_reader: str, aws: AppWrappers) -> None:
    waiting = [f"waiting-{i:02}" for i in range(52)]
    for name in waiting:  # fit on no node, ever: they stay queued in creation order
        aws.create(appwrapper(name, deployment_item(name, 1, "100000")))
    aws.create(appwrapper("small", deployment_item("small", 1, "10m")))
    aws.wait_state("small", "Running")
    aws.wait_state(waiting[-1], "Pending")

    sign_in(browser, controller, endpoint_reader)
    choose(browser, "select#filter-namespace", aws.namespace)  # whatever else the cluster holds
    browser.wait(lambda _: browser.find("#queue-range").text == f"1{DASH}50 of 53", "the first page of 53")
    assert len(browser.find_all("#queue tbody tr")) == 50, "the page holds one page of rows, not the backlog"
    assert row(browser, f"{aws.namespace}/{waiting[0]}") is not None
    assert browser.find("button#page-prev").get_attribute("disabled") is not None

    browser.find("button#page-next").click()
    browser.wait(lambda _: browser.find("#queue-range").text == f"51{DASH}53 of 53", "the second page")
    wait_row(browser, f"{aws.namespace}/{waiting[-1]}", "the last queued AppWrapper on the second page")
    wait_row(browser, f"{aws.namespace}/small", "the running one, after every queued one", state="Running")
    assert len(browser.find_all("#queue tbody tr")) == 3

    choose(browser, "select#filter-state", "Running")
    browser.wait(lambda _: [tr.get_attribute("data-key") for tr in browser.find_all("#queue tbody tr")]
                 == [f"{aws.namespace}/small"], "the Running filter to leave the running AppWrapper alone")
    assert browser.find("#queue-range").text == f"1{DASH}1 of 1"


def test_a_cordoned_node_is_marked(browser: Browser, controller: Controller, endpoint_reader: str,
                                   small_node: tuple[str, dict[str, str]], core: k8s.CoreV1Api) -> None:
    node_name, _ = small_node
    sign_in(browser, controller, endpoint_reader, view="nodes")

    def node_row() -> dict[str, Any] | None:
        # Read at once: the page rebuilds the table on every poll.
        return browser.script("""
            const tr = document.querySelector(`#nodes tr[data-node="${CSS.escape(arguments[0])}"]`);
            return tr && {classes: [...tr.classList], text: tr.querySelector("th").textContent};""", node_name)

    shown = browser.wait(lambda _: node_row(), "the fake node in the heat map")
    assert "cordoned" not in shown["classes"], shown
    core.patch_node(node_name, {"spec": {"unschedulable": True}})
    marked = browser.wait(lambda _: (found := node_row()) and "cordoned" in found["classes"] and found,
                          "the cordoned node to be marked")
    assert "cordoned" in marked["text"], marked


# Installed before the page's script: holds the answers to requests sent without a token while __mcadHold is set,
# until __mcadRelease(), so a test can put an answer in flight across the moment the user signs in.
HOLD_UNAUTHENTICATED = """
(() => {
  const real = window.fetch.bind(window);
  window.__mcadHold = false;
  window.__mcadHeld = [];
  window.fetch = (url, init = {}) => {
    if (!window.__mcadHold || (init.headers || {})["X-Mcad-Authorization"]) return real(url, init);
    return real(url, init).then((answer) => new Promise((resolve) => window.__mcadHeld.push(() => resolve(answer))));
  };
  window.__mcadRelease = () => {
    window.__mcadHold = false;
    for (const go of window.__mcadHeld.splice(0)) go();
  };
})();
"""


def test_a_token_entered_while_a_refused_request_is_out_is_kept(browser: Browser, controller: Controller,
                                                                 endpoint_reader: str, aws: AppWrappers) -> None:
    aws.create(appwrapper("small", deployment_item("small", 1, "10m")))
    browser.driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": HOLD_UNAUTHENTICATED})
    browser.get(page_url(controller))
    field = browser.visible("form#login input#token", "the sign-in form")
    browser.script("window.__mcadHold = true")
    browser.wait(lambda _: browser.script("return window.__mcadHeld.length") > 0,
                 "the page's next poll, sent without a token, to be out")
    field.send_keys(endpoint_reader, Keys.ENTER)
    browser.script("window.__mcadRelease()")  # its 401 arrives after the token was entered
    browser.wait(lambda _: not browser.find("form#login").is_displayed()
                 and browser.find("#status").text.startswith("updated"),
                 "the page to sign in with the token entered (the late 401 was about no token)")
    wait_row(browser, f"{aws.namespace}/small", "the AppWrapper's row")


def test_a_refused_token_brings_the_form_back(browser: Browser, controller: Controller) -> None:
    browser.get(page_url(controller))
    browser.visible("form#login input#token", "the sign-in form").send_keys("not-a-token", Keys.ENTER)
    browser.wait(lambda _: browser.find("#status").text.startswith("the bearer token was not accepted")
                 and browser.find("form#login").is_displayed() and browser.script("return sessionStorage.length") == 0,
                 "the controller's refusal of that token said, the token forgotten and the form still there")


# WCAG 2 contrast of every visible text against what is behind it (the colours of the element's ancestors blended
# down to the page's white): 4.5:1, 3:1 for large text. Returns the texts that fall short.
LOW_CONTRAST = r"""
const rgba = (css) => {
  const [r, g, b, a = 1] = css.match(/rgba?\(([^)]+)\)/)[1].split(/[ ,\/]+/).filter(Boolean).map(Number);
  return {r, g, b, a};
};
const over = (top, under) => ({r: top.r * top.a + under.r * (1 - top.a), g: top.g * top.a + under.g * (1 - top.a),
                               b: top.b * top.a + under.b * (1 - top.a), a: 1});
const luminance = ({r, g, b}) => {
  const linear = (v) => ((v /= 255) <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4);
  return 0.2126 * linear(r) + 0.7152 * linear(g) + 0.0722 * linear(b);
};
const behind = (el) => {
  const layers = [];
  for (let n = el; n; n = n.parentElement) {
    const c = rgba(getComputedStyle(n).backgroundColor);
    if (c.a > 0) layers.push(c);
    if (c.a === 1) break;
  }
  return layers.reverse().reduce((under, top) => over(top, under), {r: 255, g: 255, b: 255, a: 1});
};
const short = [];
for (const el of document.querySelectorAll("body *")) {
  const style = getComputedStyle(el);
  const box = el.getBoundingClientRect();
  if (![...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim())) continue;
  if (!box.width || !box.height || style.visibility !== "visible" || Number(style.opacity) === 0) continue;
  const back = behind(el);
  const [light, dark] = [luminance(over(rgba(style.color), back)), luminance(back)].sort((x, y) => y - x);
  const ratio = (light + 0.05) / (dark + 0.05);
  const size = parseFloat(style.fontSize);
  const large = size >= 24 || (size >= 18.66 && Number(style.fontWeight) >= 700);
  if (ratio < (large ? 3 : 4.5)) {
    short.push(`${el.tagName.toLowerCase()}${el.id ? "#" + el.id : ""}${[...el.classList].map((c) => "." + c).join("")}`
               + ` "${el.textContent.trim().slice(0, 30)}" ${ratio.toFixed(2)}:1`);
  }
}
return short;
"""


def test_text_is_readable_against_its_background(browser: Browser, controller: Controller, endpoint_reader: str,
                                                 small_node: tuple[str, dict[str, str]], aws: AppWrappers) -> None:
    _, selector = small_node
    aws.create(appwrapper("first", pinned(deployment_item("first", 1, "2"), selector)))
    aws.wait_state("first", "Running")
    aws.create(appwrapper("second", pinned(deployment_item("second", 1, "2"), selector)))
    key = f"{aws.namespace}/second"
    browser.get(page_url(controller))
    field = browser.visible("form#login input#token", "the sign-in form")
    faults = {"sign-in": browser.script(LOW_CONTRAST)}
    field.send_keys(endpoint_reader, Keys.ENTER)
    wait_row(browser, key, "the waiting AppWrapper's row", state="Queued")
    wait_row(browser, f"{aws.namespace}/first", "the running AppWrapper's row", state="Running")
    faults["queue"] = browser.script(LOW_CONTRAST)
    browser.find(f'#queue tr[data-key="{key}"] td.name button').click()
    detail_of(browser, key)
    browser.wait(lambda _: browser.find("#detail .summary").text, "the explanation")
    faults["explanation"] = browser.script(LOW_CONTRAST)
    for view in ("nodes", "quota"):
        show(browser, view)
        faults[view] = browser.script(LOW_CONTRAST)
    assert {view: found for view, found in faults.items() if found} == {}


def test_an_unhealthy_then_resetting_appwrapper_is_marked_and_explained(
        browser: Browser, controller: Controller, endpoint_reader: str, core: k8s.CoreV1Api,
        aws: AppWrappers, kubeconfig: str, other_tenant: str) -> None:
    # Its wrapped Pod deleted by hand: MissingComponent (the pods' informer sees it go), Unhealthy for the failure
    # grace period, then a reset and a retry pause long enough to look at.
    body = appwrapper("flaky", {"generictemplate": {"apiVersion": "v1", "kind": "Pod",
                                                    "metadata": {"name": "flaky-worker"}, "spec": {
        "containers": [{"name": "main", "image": "busybox",
                        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}}})
    body["metadata"]["annotations"] = {ft.FAILURE_GRACE: "30s", ft.RETRY_PAUSE: "10m", ft.RETRY_LIMIT: "2"}
    aws.create(body)
    aws.wait_state("flaky", "Running")
    wait_until(lambda: core.read_namespaced_pod("flaky-worker", aws.namespace).status.phase == "Running", 60,
               "the wrapped pod to run")
    key = f"{aws.namespace}/flaky"
    sign_in(browser, controller, endpoint_reader)
    wait_row(browser, key, "the running AppWrapper, healthy", state="Running")
    assert not browser.script(f'return document.querySelector(\'#queue tr[data-key="{key}"]\')'
                              ".classList.contains('unhealthy')")

    core.delete_namespaced_pod("flaky-worker", aws.namespace, grace_period_seconds=0)
    wait_row(browser, key, "the row to be marked unhealthy", state="Runningunhealthy: MissingComponent")
    browser.find(f'#queue tr[data-key="{key}"] td.name button').click()
    detail_of(browser, key)
    browser.wait(lambda _: "reset (1 of 2) in" in browser.find("#detail .health-state").text
                 and "unless it recovers" in browser.find("#detail .health-state").text,
                 "the explanation to say the reset is due unless it recovers")
    assert browser.find("#detail .health-state .state-badge").text == "Unhealthy"

    resetting = wait_row(browser, key, "the row in its retry pause", timeout=90, state="Resetting")
    assert resetting["why"].startswith("retry pause after reset (MissingComponent; 1 of retryLimit 2 counted): "
                                       "queued again in "), resetting
    assert browser.script(f'return document.querySelector(\'#queue tr[data-key="{key}"]\')'
                          ".classList.contains('resetting')")
    browser.wait(lambda _: browser.find("#detail .resets-count").text == "1 of retryLimit 2",
                 "the explanation to count the reset")
    history = browser.wait(lambda _: [r for r in texts(browser, "#detail ol.resets li")
                                      if "MissingComponent" in r] or None, "the reset in the history")
    assert "MissingComponent (counted): Resetting (reset 1 of 2): wrapped object(s) Pod flaky-worker no longer exist" \
        in history[0], history
    assert browser.find("#detail .health-state .state-badge").text == "Resetting"
    assert any(li.startswith("retry pause 10m, retryLimit 2") for li in texts(browser, "#detail ul.policy li"))

    # /debug/explain (mcadctl explain) says the same from the same controller.
    doc = explain(controller, aws.namespace, "flaky")
    assert doc["health"]["state"] == "Resetting" and doc["resets"]["count"] == 1, doc
    assert doc["resets"]["history"][0]["reason"] == "MissingComponent" and doc["pause"]["inSeconds"] > 0, doc
    assert doc["summary"].startswith("It is in its retry pause after a reset (MissingComponent; reset 1 of 2 so "
                                     "far): it is queued again at its place in "), doc["summary"]
    assert doc["faultTolerance"]["fromAnnotations"] == ["failureGracePeriodDuration", "retryPausePeriodDuration",
                                                        "retryLimit"]
    assert browser.csp_violations() == [] and browser.console_errors() == []

    # As tenants holding only AppWrapper rights: its owner's namespace sees it; another namespace's tenant sees
    # neither it in /debug/queue's list of those resetting nor its explanation (404, as for none at all).
    team_b = other_tenant
    alice = service_account_token(kubeconfig, aws.namespace, "alice", roles=((TENANT_ROLE, aws.namespace),))
    bob = service_account_token(kubeconfig, team_b, "bob", roles=((TENANT_ROLE, team_b),))
    aws.custom.create_namespaced_custom_object(GROUP, VERSION, team_b, PLURAL, appwrapper(
        "theirs", deployment_item("theirs", 1, "100000")))  # fits nowhere: bob's namespace holds one, queued
    code, body = controller.get("/debug/queue", token=alice)
    assert code == 200 and [r["name"] for r in json.loads(body)["resetting"]] == ["flaky"], body
    code, body = controller.get(f"/debug/explain?namespace={aws.namespace}&name=flaky", token=alice)
    assert code == 200 and json.loads(body)["health"]["state"] == "Resetting", body
    wait_until(lambda: controller.get("/debug/queue", token=bob)[0] == 200, 30, "bob's AppWrapper to be known")
    code, body = controller.get("/debug/queue", token=bob)
    assert json.loads(body)["resetting"] == [] and {aw["namespace"] for aw in json.loads(body)["queued"]} == {
        team_b}, body
    code, body = controller.get(f"/debug/explain?namespace={aws.namespace}&name=flaky", token=bob)
    assert code == 404 and json.loads(body) == {"error": f"AppWrapper {aws.namespace}/flaky not found"}, body

    # mcadctl --offline explain reads the same from its status, with the built-in defaults for the cluster's.
    offline = offline_reports(kube.connect(kubeconfig)).explain(aws.namespace, "flaky")
    assert offline is not None and offline["health"]["state"] == "Resetting", offline
    assert offline["summary"].startswith("It is in its retry pause after a reset (MissingComponent; reset 1 of 2 "), \
        offline["summary"]
    assert offline["resets"] == doc["resets"] and offline["pause"]["until"] == doc["pause"]["until"]
    assert offline["faultTolerance"]["defaults"] == "built-in" and offline["faultTolerance"]["retryLimit"] == 2
