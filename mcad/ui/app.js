// The mcad dashboard: polls the controller's /ui/api views (relative URLs, so it works behind the API server's
// service or pod proxy and behind `mcadctl dashboard`) and renders them. Every value goes into the page with
// textContent or as an attribute value, never as markup: names, labels, annotations and messages come from
// tenants. The Content-Security-Policy allows no inline script, so this module is the only code that runs.

const POLL_MS = 1000; // the issue's bound is 2 s; a page that waits longer shows stale state
const PAGE = 50;
// How often one view may be asked of the Service while standbys answer (mcad.cli.reach.SERVICE_TRIES): the API
// server sends each request to one replica behind it, and without pods/proxy there is no other way to the leader
// from here (opened at the leader's Service, <name>-leader, the page talks to the leader alone).
const SERVICE_TRIES = 8;
const SERVICE_PROXY = /^(.*\/api\/v1\/namespaces\/[^/]+\/)services\/[^/]+\/proxy\/ui\//;
const HOME_API = new URL("api/", window.location.href);
// The pasted bearer token lives in this variable only: never in sessionStorage, localStorage or a cookie. Behind
// the API server's service or pod proxy this page shares its origin with every other service proxied through that
// API server, and storage is per origin: any of their pages could read it. A reload asks for the token again.
let pastedToken = null;

const state = {
  view: "queue",
  namespace: "",
  stateFilter: "",
  offset: 0,
  selected: null, // "ns/name" of the AppWrapper whose explanation is open
  api: HOME_API, // where the views are; moves to the leader's pod when followed
  podsRefused: false, // the API server refused pods/proxy: the Service is the only route
  timer: null,
  busy: false,
};

const $ = (selector, root = document) => root.querySelector(selector);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (name === "class") node.className = value;
    else if (name === "text") node.textContent = value;
    else node.setAttribute(name, String(value));
  }
  for (const child of children) node.append(child); // strings are appended as text nodes
  return node;
}

function setText(node, text) {
  const value = text == null ? "" : String(text);
  if (node.textContent !== value) node.textContent = value;
}

// ---------------------------------------------------------------------------------------------- fetching

class Refused extends Error {
  constructor(status, body, token = null) {
    super((body && body.error) || `HTTP ${status}`);
    this.status = status;
    this.body = body || {};
    this.token = token; // the token the refused request carried (null: none)
  }
}

async function getView(name, params = {}, tries = 1) {
  const url = new URL(name, state.api);
  for (const [key, value] of Object.entries(params)) if (value !== "" && value != null) url.searchParams.set(key, value);
  const headers = { Accept: "application/json" };
  const token = pastedToken;
  if (token) headers["X-Mcad-Authorization"] = `Bearer ${token}`;
  const response = await fetch(url, { headers, credentials: "same-origin", cache: "no-store" });
  let body = null;
  try { body = await response.json(); } catch { body = null; }
  if (!response.ok) {
    if (response.status === 503 && body && body.error === "not the leader") {
      if (follow(body)) return getView(name, params, tries);
      if (tries < SERVICE_TRIES && state.api === HOME_API && SERVICE_PROXY.test(window.location.pathname)) {
        return getView(name, params, tries + 1);
      }
    }
    if (response.status === 403 && body && body.kind === "Status" && state.api.pathname.includes("/pods/")) {
      // The API server's refusal (a Status; the controller's own 403 is {"error": ...}, and passes): no
      // pods/proxy (the chart's debug-client Role grants none, as it would reach every pod there). Back to the
      // Service, for good.
      state.podsRefused = true;
      state.api = HOME_API;
      state.following = null;
      return getView(name, params, tries);
    }
    throw new Refused(response.status, body || { error: proxyRefusal(response.status) }, token);
  }
  return body;
}

function proxyRefusal(status) {
  if (status === 403) return "refused by the API server: you need get on services/proxy for the controller's Service (port http)";
  if (status === 401) return "not authenticated";
  return `HTTP ${status}`;
}

// A standby answers "not the leader". Behind the API server's service proxy the page can go to the leader's pod
// through the pod proxy, as mcadctl does; anywhere else it can only say who leads.
function follow(body) {
  const match = window.location.pathname.match(SERVICE_PROXY);
  const pod = String(body.leader || "").split("_")[0];
  if (!match || !pod || !body.port || state.podsRefused || state.api.pathname.includes("/pods/")) {
    state.standby = pod ? `this replica is a standby; the leader is pod ${pod}` : "this replica is a standby";
    return false;
  }
  state.api = new URL(`${match[1]}pods/${encodeURIComponent(pod)}:${Number(body.port)}/proxy/ui/api/`, window.location.origin);
  state.following = `following the leader, pod ${pod}`;
  return true;
}

// ---------------------------------------------------------------------------------------------- formatting

function age(seconds) {
  if (seconds == null) return "";
  const s = Math.max(0, Math.round(seconds));
  if (s < 90) return `${s}s`;
  if (s < 5400) return `${Math.round(s / 60)}m`;
  if (s < 172800) return `${Math.floor(s / 3600)}h ${Math.round((s % 3600) / 60)}m`;
  return `${Math.floor(s / 86400)}d`;
}

function since(timestamp) {
  if (!timestamp) return "";
  return age((Date.now() - Date.parse(timestamp)) / 1000);
}

function until(timestamp) {
  if (!timestamp) return "";
  const left = (Date.parse(timestamp) - Date.now()) / 1000;
  return left > 0 ? `in ${age(left)}` : "now";
}

function demand(vector) {
  return Object.entries(vector || {}).map(([name, amount]) => `${name} ${amount}`).join(", ");
}

function seconds(value) {
  if (value == null) return "–";
  if (value < 1) return `${Math.round(value * 1000)} ms`;
  if (value < 120) return `${value.toFixed(1)} s`;
  return age(value);
}

function badge(text) {
  return el("span", { class: `state-badge state-${String(text).replace(/[^A-Za-z]/g, "")}`, text });
}

// ---------------------------------------------------------------------------------------------- status line

function status(message, isError = false) {
  const line = $("#status");
  setText(line, message);
  line.classList.toggle("error", isError);
}

function showLogin(show) {
  $("#login").hidden = !show;
  $("#main").hidden = show;
}

// ---------------------------------------------------------------------------------------------- queue

function fillSelect(select, values, current, label) {
  const wanted = [["", "all"], ...values.map((v) => [v, label ? label(v) : v])];
  if (current && !values.includes(current)) wanted.push([current, label ? label(current) : current]);
  const same = select.options.length === wanted.length &&
    wanted.every(([v, t], i) => select.options[i].value === v && select.options[i].textContent === t);
  if (same) return;
  select.replaceChildren(...wanted.map(([value, text]) => el("option", { value, text })));
  select.value = current;
}

function queueRow(row) {
  const key = `${row.namespace}/${row.name}`;
  const tr = el("tr", { "data-key": key });
  const open = el("button", { type: "button", text: row.name, "aria-label": `explain ${key}` });
  open.addEventListener("click", () => openDetail(key));
  // data-label names the column where a narrow screen shows each row as a card.
  tr.append(el("td", { class: "position", "data-label": "#" }), el("td", { class: "state", "data-label": "State" }),
    el("td", { class: "priority", "data-label": "Priority" }), el("td", { class: "namespace", "data-label": "Namespace" }),
    el("td", { class: "name", "data-label": "Name" }, open), el("td", { class: "demand", "data-label": "Demand" }),
    el("td", { class: "age", "data-label": "Age" }), el("td", { class: "expected", "data-label": "Expected start" }),
    el("td", { class: "why", "data-label": "Why" }));
  return tr;
}

// A dispatched AppWrapper's health beside its state (Unhealthy, AtRisk), with the reason; none when healthy.
function healthFlag(row) {
  if (row.health !== "Unhealthy" && row.health !== "AtRisk") return null;
  const text = `${row.health === "AtRisk" ? "at risk" : "unhealthy"}${row.healthReason ? `: ${row.healthReason}` : ""}`;
  return el("span", { class: `flag health-flag health-${row.health}`, text });
}

function updateRow(tr, row) {
  setText($(".position", tr), row.position ?? "");
  const stateCell = $(".state", tr);
  const flag = healthFlag(row);
  const shown = `${row.state}${flag ? flag.textContent : ""}`;
  if (stateCell.textContent !== shown) stateCell.replaceChildren(badge(row.state), ...(flag ? [flag] : []));
  tr.classList.toggle("resetting", row.state === "Resetting");
  tr.classList.toggle("unhealthy", row.health === "Unhealthy");
  tr.classList.toggle("at-risk", row.health === "AtRisk");
  setText($(".priority", tr), row.priority);
  setText($(".namespace", tr), row.namespace);
  setText($(".demand", tr), demand(row.demand));
  setText($(".age", tr), row.position != null ? age(row.ageSeconds) : since(row.dispatchedAt));
  // A queued one's estimate (an estimate, not a promise): "in 5m", the time itself on hover; "unknown" when none
  // could be made, with why on hover.
  const expected = $(".expected", tr);
  setText(expected, row.position == null ? "" : (row.estimatedStart ? until(row.estimatedStart) : "unknown"));
  const hover = row.position == null ? "" : (row.estimatedStart || row.estimateWhy || "");
  if (hover) expected.title = hover;
  else expected.removeAttribute("title");
  let why = row.why || "";
  if (row.state === "Resetting") {
    why = `retry pause after reset (${row.resetReason || "unknown cause"}; ${row.resettingCount ?? 0} of ` +
      `retryLimit ${row.retryLimit ?? "?"} counted): queued again ${until(row.pauseEndsAt)}, its room held meanwhile`;
  } else if (row.position == null && row.podPhases) {
    why = Object.entries(row.podPhases).filter(([, n]) => n).map(([p, n]) => `${n} ${p}`).join(", ") || "no pods yet";
  }
  setText($(".why", tr), why);
  tr.classList.toggle("selected", tr.dataset.key === state.selected);
}

// Where the reader stands: what is ahead of its first queued AppWrapper of each namespace (others' only counted)
// and its tenants' fair-share usage against the others'.
function aheadText(a) {
  const named = Object.entries(a.named || {}).map(([ns, n]) => `${n} in ${ns}`);
  const others = a.others || {};
  if (others.appwrappers) {
    const counts = (others.counts || []).join(", ");
    named.push(`${others.appwrappers} of ${others.namespaces} other namespace(s)${counts ? ` (${counts})` : ""}`);
  }
  return `${a.namespace}/${a.name} is at position ${a.position}: ${a.ahead} ahead` +
    (named.length ? ` — ${named.join("; ")}` : "");
}

function percent(fraction) {
  return fraction == null ? "–" : `${(fraction * 100).toFixed(1)}%`;
}

function renderStanding(doc) {
  const ahead = doc.aheadOfYou;
  const fair = doc.fairShare;
  $("#standing").hidden = ahead == null && fair == null;
  const items = (ahead || []).map((a) => el("li", { text: aheadText(a) }));
  if (ahead && !items.length) items.push(el("li", { text: "none of your AppWrappers is queued" }));
  if (ahead == null) items.push(el("li", { text: "pick a namespace to see what is ahead of its AppWrappers" }));
  const list = $("#ahead");
  const texts = items.map((li) => li.textContent);
  if ([...list.children].map((li) => li.textContent).join("\n") !== texts.join("\n")) list.replaceChildren(...items);
  let line = "fair sharing is off: the queue goes by priority, then creation time";
  const tenants = [];
  if (fair && fair.enabled) {
    const others = fair.others || {};
    line = `fair sharing on (half-life ${age(fair.halfLifeSeconds)}; rank 1 used least and goes first among equal ` +
      `priorities), ${fair.tenants} tenant(s) with usage`;
    if (others.tenants) {
      line += `; ${others.tenants} other(s): least ${percent(others.leastFraction)}, median ` +
        `${percent(others.medianFraction)}, most ${percent(others.mostFraction)}`;
    }
    for (const t of fair.named || []) {
      tenants.push(`${t.tenant}: ${percent(t.fraction)} of all usage, rank ${t.rank} of ${fair.tenants}`);
    }
    if (!(fair.named || []).length) tenants.push("no usage recorded for your tenants: they go first");
  }
  setText($("#fair-share"), line);
  const tenantList = $("#fair-share-tenants");
  if ([...tenantList.children].map((li) => li.textContent).join("\n") !== tenants.join("\n")) {
    tenantList.replaceChildren(...tenants.map((text) => el("li", { text })));
  }
}

function renderQueue(doc) {
  renderStanding(doc);
  fillSelect($("#filter-namespace"), doc.namespaces, state.namespace);
  const counts = doc.counts || {};
  fillSelect($("#filter-state"), Object.keys(counts), state.stateFilter, (s) => `${s} (${counts[s] ?? 0})`);
  const tbody = $("#queue tbody");
  const existing = new Map([...tbody.children].map((tr) => [tr.dataset.key, tr]));
  const keep = new Set();
  doc.rows.forEach((row, i) => {
    const key = `${row.namespace}/${row.name}`;
    let tr = existing.get(key);
    if (!tr) tr = queueRow(row);
    updateRow(tr, row);
    keep.add(key);
    // Moved only when out of place: moving the row that holds keyboard focus would drop the focus.
    if (tbody.children[i] !== tr) tbody.insertBefore(tr, tbody.children[i] || null);
  });
  for (const [key, tr] of existing) if (!keep.has(key)) tr.remove();
  const first = doc.total ? doc.offset + 1 : 0;
  const last = Math.min(doc.offset + doc.rows.length, doc.total);
  setText($("#queue-range"), `${first}–${last} of ${doc.total}`);
  $("#page-prev").disabled = doc.offset <= 0;
  $("#page-next").disabled = last >= doc.total;
  $("#queue-empty").hidden = doc.total > 0;
}

// ---------------------------------------------------------------------------------------------- detail

function openDetail(key) {
  state.selected = key;
  $("#detail").hidden = false;
  $("#main").classList.add("with-detail");
  setText($("#detail-heading"), key);
  for (const tr of $("#queue tbody").children) tr.classList.toggle("selected", tr.dataset.key === key);
  $("#detail-heading").focus();
  refreshDetail();
}

function closeDetail() {
  const key = state.selected;
  state.selected = null;
  $("#detail").hidden = true;
  $("#main").classList.remove("with-detail");
  const row = key && $(`#queue tbody tr[data-key="${CSS.escape(key)}"] button`);
  if (row) row.focus();
}

function listItems(list, entries) {
  const items = entries.map((text) => el("li", { text }));
  if (!items.length) items.push(el("li", { class: "note", text: "none" }));
  list.replaceChildren(...items);
}

// Fault tolerance in the explanation: health and what is due when, the retry pause, the resets, the policy.
// Absent from a controller without fault tolerance (no "health" in /debug/explain): the section stays hidden.
function renderHealth(aside, doc) {
  const section = $(".health", aside);
  const health = doc.health;
  section.hidden = !health;
  if (!health) return;
  // What is due, as the controller worded it when it built the document (at most a poll old).
  const next = health.next && health.next.text ? ` ${health.next.text}` : "";
  $(".health-state", section).replaceChildren(badge(health.state), next);
  const said = new Set(); // Unhealthy and Resetting usually carry one message: say it once
  const lines = (health.conditions || []).filter((c) => c.status === "True").map((c) => {
    const message = c.message && !said.has(c.message) ? `: ${c.message}` : "";
    said.add(c.message);
    return `${c.type}${c.reason ? ` (${c.reason})` : ""}${c.since ? `, since ${since(c.since)} ago` : ""}${message}`;
  });
  if (doc.pause) {
    const where = (doc.pause.heldOn || []).length ? `on node(s) ${doc.pause.heldOn.join(", ")}` : `in aggregate (${demand(doc.pause.held)})`;
    lines.push(`retry pause until ${doc.pause.until} (${until(doc.pause.until)}); its room is held ${where}`);
  }
  listItems($(".health-conditions", section), lines);
  const resets = doc.resets || { count: 0, history: [] };
  setText($(".resets-count", section), `${resets.count ?? 0} of retryLimit ${resets.retryLimit ?? "?"}`);
  // Newest first; a list, not a table: the messages are long and the panel is narrow.
  const items = (resets.history || []).slice().reverse().map((r) => el("li", {},
    el("strong", { text: `${r.time ? `${since(r.time)} ago` : "at an unknown time"}, ${r.reason || "unknown cause"}` }),
    ` (${r.counted ? "counted" : "not counted"}): ${r.message || ""}`));
  if (!items.length) items.push(el("li", { class: "note", text: "none" }));
  $(".resets", section).replaceChildren(...items);
  const p = doc.faultTolerance || {};
  const policy = [
    `grace periods: admission ${p.admissionGracePeriod}, warmup ${p.warmupGracePeriod}, failure ${p.failureGracePeriod}`,
    `retry pause ${p.retryPausePeriod}, retryLimit ${p.retryLimit}, forceful deletion after ${p.forcefulDeletionGracePeriod}`,
    `terminal exit codes: ${(p.terminalExitCodes || []).join(", ") || "none"}; retryable: ` +
      `${(p.retryableExitCodes || []).length ? `only ${p.retryableExitCodes.join(", ")}` : "every other"}`,
    `${p.deletionOnFailureGracePeriod === "0s" ? "objects deleted at once after a failure" :
      `objects kept ${p.deletionOnFailureGracePeriod} after a failure`}, ${p.successTTL} after success` +
      `${p.deleteWhenFinished ? ", then the AppWrapper is deleted too" : ""}`,
    `set by its annotations: ${(p.fromAnnotations || []).join(", ") || "none (the cluster's defaults)"}`,
    ...(p.ignored || []).map((entry) => `ignored (refused value, the default stands): ${entry}`),
  ];
  listItems($(".policy", section), policy);
}

async function refreshDetail() {
  const key = state.selected;
  if (!key) return;
  const [namespace, ...rest] = key.split("/");
  const aside = $("#detail");
  try {
    const doc = await getView("explain", { namespace, name: rest.join("/") });
    if (state.selected !== key) return;
    $(".state", aside).replaceChildren(badge(doc.state));
    setText($(".summary", aside), doc.summary);
    listItems($(".details", aside), doc.details || []);
    renderHealth(aside, doc);
    listItems($(".labels", aside), Object.entries(doc.labels || {}).map(([k, v]) => `${k}=${v}`));
    listItems($(".annotations", aside), Object.entries(doc.annotations || {}).map(([k, v]) => `${k}: ${v}`));
    const rows = (doc.events || []).map((e) => el("tr", {}, el("td", { text: e.type }), el("td", { text: e.reason }),
      el("td", { text: e.message }), el("td", { text: e.count }), el("td", { text: `${since(e.lastSeen)} ago` })));
    if (!rows.length) rows.push(el("tr", {}, el("td", { colspan: 5, class: "note", text: "none recorded by this controller" })));
    $(".events tbody", aside).replaceChildren(...rows);
  } catch (err) {
    if (state.selected !== key) return;
    setText($(".summary", aside), err.status === 404 ? "It is gone, or you may not see it." : err.message);
  }
}

// ---------------------------------------------------------------------------------------------- nodes

function heat(cell) {
  const taken = (cell.usedFraction || 0) + (cell.reservedFraction || 0);
  return `heat${Math.min(5, Math.max(0, Math.round(taken * 5)))}`;
}

function bar(parts) {
  const outer = el("div", { class: "bar", "aria-hidden": "true" });
  for (const [cls, fraction] of parts) {
    const inner = el("div", { class: cls });
    inner.style.width = `${Math.max(0, Math.min(1, fraction || 0)) * 100}%`; // CSSOM: allowed by the policy
    outer.append(inner);
  }
  return outer;
}

function nodeRow(node, resources) {
  const classes = [!node.schedulable && "cordoned", !node.ready && "not-ready"].filter(Boolean).join(" ");
  const name = el("th", { scope: "row", text: node.name });
  if (!node.schedulable) name.append(el("span", { class: "flag", text: "cordoned" }));
  if (!node.ready) name.append(el("span", { class: "flag", text: "not ready" }));
  // --placement=binding: pods mcad pinned here that the scheduler has not bound yet (their room is "reserved").
  if (node.pinned) name.append(el("span", { class: "flag pinned", text: `${node.pinned} pinned` }));
  const tr = el("tr", { "data-node": node.name, class: classes }, name);
  for (const resource of resources) {
    const cell = node.cells[resource];
    if (!cell) { tr.append(el("td", { class: "cell note", "data-resource": resource, text: "–" })); continue; }
    const td = el("td", {
      class: `cell ${heat(cell)}`, "data-resource": resource, "data-used": cell.used,
      "data-reserved": cell.reserved, "data-allocatable": cell.allocatable, "data-free": cell.free,
      title: `${resource}: ${cell.used} used, ${cell.reserved} reserved, ${cell.free} free of ${cell.allocatable}`,
    }, `${cell.used} / ${cell.allocatable}`);
    if (cell.reserved && cell.reserved !== "0") td.append(el("span", { class: "note", text: ` (+${cell.reserved} reserved)` }));
    td.append(bar([["used", cell.usedFraction], ["reserved", cell.reservedFraction]]));
    tr.append(td);
  }
  return tr;
}

// With topology levels (the controller's --topology-level) the nodes sit under a heading per domain of the
// largest level, then of the next, indented; those in no domain of a level under "no <level>". The tree comes
// built (mcad.serve.dashboard.domain_tree): this only writes it down.
function levelName(level) {
  return String(level).split("/").pop();
}

function domainRows(tbody, branches, byName, resources, depth) {
  for (const branch of branches) {
    const none = branch.value == null;
    const th = el("th", {
      scope: "rowgroup", colspan: resources.length + 1, class: `domain depth${Math.min(depth, 3)}${none ? " none" : ""}`,
      "data-level": branch.level, "data-domain": none ? "" : branch.value, title: branch.level,
    }, none ? `no ${levelName(branch.level)}` : `${levelName(branch.level)} ${branch.value}`);
    tbody.append(el("tr", { class: "domain" }, th));
    if (branch.domains) domainRows(tbody, branch.domains, byName, resources, depth + 1);
    for (const name of branch.nodes || []) {
      const node = byName.get(name);
      if (node) tbody.append(nodeRow(node, resources));
    }
  }
}

function renderNodes(doc) {
  const table = $("#nodes");
  const present = doc.resources.filter((r) => doc.groups.some((g) => g.nodes.some((n) => n.cells[r])));
  const resources = present.length ? present : ["cpu"];
  const head = el("tr", {}, el("th", { scope: "col", text: "Node" }),
    ...resources.map((r) => el("th", { scope: "col", text: r })));
  const bodies = doc.groups.map((group) => {
    const tbody = el("tbody", group.cluster ? { "data-cluster": group.cluster } : {});
    if (group.cluster) {
      const th = el("th", { scope: "rowgroup", colspan: resources.length + 1, class: "cluster" }, `cluster ${group.cluster} `);
      th.append(el("span", { class: `health-${String(group.state).replace(/[^A-Za-z]/g, "")}`, text: group.state }));
      if (group.message) th.append(el("span", { class: "note", text: ` ${group.message}` }));
      tbody.append(el("tr", {}, th));
    }
    if (group.domains && group.domains.length) {
      domainRows(tbody, group.domains, new Map(group.nodes.map((node) => [node.name, node])), resources, 0);
    } else {
      for (const node of group.nodes) tbody.append(nodeRow(node, resources));
    }
    if (!group.nodes.length) tbody.append(el("tr", {}, el("td", { colspan: resources.length + 1, class: "note", text: "no nodes" })));
    return tbody;
  });
  table.replaceChildren(table.caption || "", el("thead", {}, head), ...bodies);
}

// ---------------------------------------------------------------------------------------------- quota

function renderQuota(doc) {
  const root = $("#quota");
  const note = $("#quota-note");
  note.hidden = doc.enabled && doc.trees.length > 0;
  setText(note, doc.enabled ? "No quota trees are defined." : "Quota trees are off in this controller (--quota-trees).");
  root.replaceChildren(...doc.trees.map((tree) => {
    const head = el("tr", {}, el("th", { scope: "col", text: "Node" }), el("th", { scope: "col", text: "AppWrappers" }),
      ...tree.resources.map((r) => el("th", { scope: "col", text: r })));
    const rows = tree.nodes.map((node) => {
      const name = el("th", { scope: "row", class: "node" }, `${"\u00a0\u00a0".repeat(node.depth)}${node.name}`);
      if (node.hardLimit) name.append(el("span", { class: "note", text: " hard" }));
      if (node.disabled) name.append(el("span", { class: "flag", text: "disabled" }));
      const cells = tree.resources.map((r) => {
        const b = node.bars[r];
        const borrowed = b.borrowed && b.borrowed !== "0" ? ` (+${b.borrowed} borrowed)` : "";
        const td = el("td", { class: "bars", "data-resource": r, "data-used": b.used, "data-limit": b.limit },
          `${b.used} / ${b.limit}${borrowed}`);
        const own = Math.max(0, (b.usedFraction || 0) - (b.borrowedFraction || 0));
        td.append(bar([["used", own], ["borrowed", b.borrowedFraction]]));
        return td;
      });
      return el("tr", { class: "quota-node", "data-node": node.name }, name, el("td", { text: node.appwrappers }), ...cells);
    });
    const section = el("section", { class: "tree", "data-tree": tree.name }, el("h3", { text: `tree ${tree.name}` }));
    for (const error of tree.errors) section.append(el("p", { class: "note error", text: error }));
    section.append(el("div", { class: "scroll" }, el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows))));
    return section;
  }));
}

// ---------------------------------------------------------------------------------------------- summary

function renderSummary(doc) {
  const states = doc.states || {};
  for (const name of ["queued", "dispatched", "completed", "failed"]) setText($(`[data-stat="${name}"]`), states[name] ?? "–");
  setText($('[data-stat="rate"]'), doc.dispatchesPerMinute != null ? Math.round(doc.dispatchesPerMinute) : "–");
  const times = doc.timeToDispatch || {};
  setText($('[data-stat="p50"]'), seconds(times.p50));
  setText($('[data-stat="p99"]'), seconds(times.p99));
  const series = doc.sparkline || [];
  const top = Math.max(1, ...series);
  const step = series.length > 1 ? 120 / (series.length - 1) : 0;
  const points = series.map((v, i) => `${(i * step).toFixed(1)},${(23 - (v / top) * 22).toFixed(1)}`).join(" ");
  $("#sparkline polyline").setAttribute("points", points);
}

// ---------------------------------------------------------------------------------------------- the loop

function showView(view) {
  state.view = ["queue", "nodes", "quota"].includes(view) ? view : "queue";
  for (const name of ["queue", "nodes", "quota"]) {
    $(`#view-${name}`).hidden = name !== state.view;
    const tab = $(`#tab-${name}`);
    if (name === state.view) tab.setAttribute("aria-current", "page"); else tab.removeAttribute("aria-current");
  }
  if (state.view !== "queue") { $("#detail").hidden = true; $("#main").classList.remove("with-detail"); }
  else if (state.selected) { $("#detail").hidden = false; $("#main").classList.add("with-detail"); }
}

async function poll() {
  if (state.busy) return;
  state.busy = true;
  state.standby = null;
  const note = { nodes: $("#nodes-note"), quota: $("#quota-note") };
  try {
    // Not awaited yet (it runs alongside the view), so it never rejects: a 401 is handed back and thrown below.
    const summary = getView("summary").then((doc) => { renderSummary(doc); $("#summary-note").hidden = true; }, (err) => {
      if (err.status === 401) return err;
      $("#summary-note").hidden = false;
      setText($("#summary-note"), `Headline numbers: ${err.message}`);
      return null;
    });
    if (state.view === "queue") {
      const doc = await getView("queue", { namespace: state.namespace, state: state.stateFilter, offset: state.offset, limit: PAGE });
      renderQueue(doc);
      await refreshDetail();
    } else {
      try {
        const doc = await getView(state.view);
        (state.view === "nodes" ? renderNodes : renderQuota)(doc);
        if (state.view === "nodes") note.nodes.hidden = true;
      } catch (err) {
        if (err.status === 401 || err.status === 503) throw err;
        note[state.view].hidden = false;
        note[state.view].classList.add("error");
        setText(note[state.view], err.message);
      }
    }
    const refused = await summary;
    if (refused) throw refused;
    showLogin(false);
    status(`${state.following ? `${state.following}; ` : ""}updated ${new Date().toLocaleTimeString()}`);
  } catch (err) {
    if (err.status === 401) {
      // Only about the token the refused request carried: one entered while it was out gets the next poll.
      if (pastedToken === err.token) {
        pastedToken = null;
        showLogin(true);
        status(err.message, true);
      }
    } else {
      status(state.standby || err.message, true);
    }
  } finally {
    state.busy = false;
  }
}

function schedule() {
  clearTimeout(state.timer);
  if (document.hidden) return; // a tab in the background costs the controller nothing
  state.timer = setTimeout(async () => { await poll(); schedule(); }, POLL_MS);
}

function now() {
  clearTimeout(state.timer);
  poll().then(schedule);
}

function start() {
  showView(window.location.hash.slice(1));
  window.addEventListener("hashchange", () => { showView(window.location.hash.slice(1)); now(); });
  $("#filter-namespace").addEventListener("change", (e) => { state.namespace = e.target.value; state.offset = 0; now(); });
  $("#filter-state").addEventListener("change", (e) => { state.stateFilter = e.target.value; state.offset = 0; now(); });
  $("#page-prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - PAGE); now(); });
  $("#page-next").addEventListener("click", () => { state.offset += PAGE; now(); });
  $("#detail-close").addEventListener("click", closeDetail);
  document.addEventListener("keydown", (e) => { if (e.key === "Escape" && state.selected) closeDetail(); });
  document.addEventListener("visibilitychange", () => { if (!document.hidden) now(); });
  $("#login").addEventListener("submit", (e) => {
    e.preventDefault();
    const token = $("#token").value.trim();
    if (token) pastedToken = token;
    $("#token").value = "";
    now();
  });
  now();
}

start();
