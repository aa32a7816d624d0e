// Pulse console: reads and acts through the sidecar's own /v1 API, nothing else. The API token, when the
// sidecar needs one, is typed by the operator, kept in this tab's sessionStorage (or memory) and sent only as
// "Authorization: Bearer"; it never goes into a URL. Every value from the API is written with textContent.
// Every time is shown in UTC and says so ("2026-12-01 12:32:14 UTC"). A delivery's page has its own URL,
// #/deliveries/<id>, which opens it when loaded, at the top of the page (its view comes before the lists).
// Endpoints are created, edited and deleted here through PUT and DELETE /v1/endpoints/{consumerGroup}, the
// API's validation errors shown beside the field they name; deleting and pausing ask for a confirmation.
"use strict";

(() => {
  const TOKEN_KEY = "pulse.apiToken";
  const PAGE_SIZE = 50;
  const REFRESH_MS = 5000;

  const $ = (id) => document.getElementById(id);

  let token = readToken();
  const view = {
    groups: [],
    filters: { group: "", topic: "", status: "" },
    cursors: [""], // cursors[i] is the "after" of page i
    page: 0,
    next: "",
    open: "", // the delivery whose timeline is shown (the one #/deliveries/<id> names)
    scrollTo: "", // a delivery opened by its URL, to scroll to once shown
    watch: null, // {id, attempt, until}: a retried delivery being followed
    loading: false,
    activity: new Map(), // the last answer of GET /v1/activity, by consumer group
    activityLoading: false, // a GET /v1/activity is in flight: a refresh starts no other
    attemptCounts: new Map(), // pending delivery id -> {updatedAt, n}: its attempts, as its page counts them
    editing: null, // the endpoint form: {group, read} (read: the endpoint as GET showed it; null: a new one)
  };

  // ---- token ------------------------------------------------------------------------------------------

  function readToken() {
    try {
      return sessionStorage.getItem(TOKEN_KEY) || "";
    } catch {
      return "";
    }
  }

  function keepToken(t) {
    token = t;
    try {
      if (t) sessionStorage.setItem(TOKEN_KEY, t);
      else sessionStorage.removeItem(TOKEN_KEY);
    } catch {
      // sessionStorage unavailable: the token lives in memory only
    }
  }

  function askToken(refused) {
    $("data").hidden = true;
    $("login").hidden = false;
    $("forget").hidden = true;
    clearTable("groups");
    clearTable("deliveries");
    clearTable("attempts");
    $("timeline").hidden = true;
    view.open = "";
    say(refused ? "The token was refused (401): enter a valid API token." : "This sidecar needs an API token.", refused);
    $("token").focus();
  }

  // ---- API --------------------------------------------------------------------------------------------

  class APIError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  // api calls the sidecar's API at path (relative to /ui/, so "../v1/..."), with the token when there is
  // one, and returns the decoded JSON answer. A 401 shows the token form and throws.
  async function api(method, path, body) {
    const headers = { Accept: "application/json" };
    if (token) headers.Authorization = "Bearer " + token;
    const init = { method, headers, cache: "no-store", credentials: "omit", referrerPolicy: "no-referrer" };
    if (body !== undefined) {
      headers["Content-Type"] = "application/json";
      init.body = JSON.stringify(body);
    }
    let resp;
    try {
      resp = await fetch(path, init);
    } catch (e) {
      throw new APIError(0, "network", "the sidecar did not answer: " + e.message);
    }
    const text = await resp.text();
    let data = null;
    if (text) {
      try {
        data = JSON.parse(text);
      } catch {
        data = null;
      }
    }
    if (resp.status === 401) {
      const refused = token !== "";
      askToken(refused);
      throw new APIError(401, "unauthorized", "an API token is needed");
    }
    if (!resp.ok) {
      const e = (data && data.error) || {};
      throw new APIError(resp.status, e.code || "http_" + resp.status, e.message || resp.statusText || "HTTP " + resp.status);
    }
    return data;
  }

  const v1 = (path) => "../v1" + path;
  // seg encodes one path segment: encodeURIComponent, and dots too, so that no id or group name is a "." or
  // ".." segment the browser would resolve (RFC 3986 §5.2.4) before the request leaves; the API decodes
  // each segment once.
  const seg = (s) => encodeURIComponent(s).replace(/\./g, "%2E");

  // ---- formatting -------------------------------------------------------------------------------------

  function el(tag, props, ...children) {
    const n = document.createElement(tag);
    for (const [k, v] of Object.entries(props || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") n.className = v;
      else if (k === "text") n.textContent = v;
      else if (k.startsWith("data-")) n.setAttribute(k, v);
      else if (k === "onclick") n.addEventListener("click", v);
      else n[k] = v;
    }
    for (const c of children) {
      if (c === undefined || c === null) continue;
      n.append(typeof c === "string" || typeof c === "number" ? String(c) : c);
    }
    return n;
  }

  const SVG = "http://www.w3.org/2000/svg";
  function svg(tag, attrs, ...children) {
    const n = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) n.setAttribute(k, String(v));
    for (const c of children) if (c) n.append(c);
    return n;
  }

  function clearTable(id) {
    $(id).tBodies[0].replaceChildren();
  }

  // fmtTime shows an RFC 3339 time of the API in UTC, to the second, marked: "2026-12-01 12:32:14 UTC".
  function fmtTime(s) {
    if (!s) return "";
    const d = new Date(s);
    if (isNaN(d)) return String(s);
    return d.toISOString().slice(0, 19).replace("T", " ") + " UTC";
  }

  // fmtClock shows the time of day of a Date in UTC: "12:32:14 UTC".
  function fmtClock(d) {
    return d.toISOString().slice(11, 19) + " UTC";
  }

  function fmtAge(ms) {
    if (ms === undefined || ms === null) return "";
    let s = Math.floor(ms / 1000);
    if (s < 60) return s + "s";
    const d = Math.floor(s / 86400);
    s -= d * 86400;
    const h = Math.floor(s / 3600);
    s -= h * 3600;
    const m = Math.floor(s / 60);
    s -= m * 60;
    if (d > 0) return d + "d " + h + "h";
    if (h > 0) return h + "h " + m + "m";
    return m + "m " + s + "s";
  }

  function fmtMs(ms) {
    if (ms === undefined || ms === null) return "";
    if (ms === 0) return "< 1 ms"; // answered within the millisecond (durations are whole milliseconds)
    return ms < 1000 ? ms + " ms" : (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + " s";
  }

  // Query parameter names that carry credentials, and values that look like one (long, letters and digits).
  const SECRET_NAME = /(token|secret|key|sig|signature|pass|pwd|auth|credential|session|code|jwt|bearer)/i;
  function looksSecret(v) {
    return v.length >= 16 && /[A-Za-z]/.test(v) && /[0-9]/.test(v) && /^[A-Za-z0-9+/=_.~%-]+$/.test(v);
  }

  // redactURL returns the endpoint URL with its credentials replaced by "…": userinfo, the values of query
  // parameters whose name or value looks secret, path segments and a fragment that look secret.
  function redactURL(raw) {
    let u;
    try {
      u = new URL(raw);
    } catch {
      return "(not a valid URL)";
    }
    let out = u.protocol + "//" + (u.username || u.password ? "…@" : "") + u.host;
    out += u.pathname.split("/").map((p) => (looksSecret(p) ? "…" : p)).join("/");
    const params = [];
    for (const [k, v] of u.searchParams) {
      params.push(k + "=" + (v && (SECRET_NAME.test(k) || looksSecret(v)) ? "…" : v));
    }
    if (params.length) out += "?" + params.join("&");
    if (u.hash) out += "#…";
    return out;
  }

  // wrappable returns text as nodes with a <wbr> after every URL separator (/ ? & = . : - _ #), so that a long
  // URL wraps between its parts rather than inside one.
  function wrappable(text) {
    const nodes = [];
    for (const part of text.split(/(?<=[/?&=.:_#-])/)) {
      if (nodes.length) nodes.push(document.createElement("wbr"));
      nodes.push(document.createTextNode(part));
    }
    return nodes;
  }

  // ---- messages ---------------------------------------------------------------------------------------

  function say(text, isError) {
    const m = $("message");
    m.textContent = text;
    m.classList.toggle("error", !!isError);
    m.hidden = !text;
  }

  function sayError(what, e) {
    if (e instanceof APIError && e.status === 401) return; // the token form says it
    const detail = e instanceof APIError ? e.status + " " + e.code + ": " + e.message : String(e);
    say(what + " failed: " + detail, true);
  }

  // ---- consumer groups --------------------------------------------------------------------------------

  async function loadGroups() {
    const [eps, stats] = await Promise.all([
      api("GET", v1("/endpoints")),
      api("GET", v1("/stats")).catch((e) => {
        if (e instanceof APIError && e.status !== 401) return { error: e };
        throw e;
      }),
    ]);
    const byGroup = new Map();
    if (stats && stats.groups) for (const g of stats.groups) byGroup.set(g.consumerGroup, g);
    $("stats-note").textContent = stats && stats.error
      ? "Figures unavailable: " + stats.error.message
      : "Succeeded and failed count attempts that ended in the last hour; p50 is the median duration of its latest answered POSTs (— when none got an HTTP answer). The chart shows each minute's succeeded (green) and failed (red) attempts, and the deliveries pending now (amber, right).";
    const list = eps.endpoints || [];
    view.groups = list.map((ep) => ({ ep, st: byGroup.get(ep.consumerGroup) }));
    // The table first, with the charts of the last answer; the charts' data follows from one call.
    renderGroups();
    renderGroupFilter();
    loadActivity().catch((e) => sayError("loading the charts", e));
  }

  // loadActivity reads every group's last hour with one bounded call (GET /v1/activity) and draws the
  // charts into the groups table. While a call is in flight a refresh starts no other, so the page never
  // asks faster than the call answers; a failed call keeps the charts drawn (a 401 is the caller's).
  async function loadActivity() {
    if (view.activityLoading) return;
    view.activityLoading = true;
    try {
      const r = await api("GET", v1("/activity"));
      view.activity = new Map((r.groups || []).map((a) => [a.consumerGroup, a]));
      drawCharts();
    } catch (e) {
      if (!(e instanceof APIError) || e.status === 401) throw e;
    } finally {
      view.activityLoading = false;
    }
  }

  // drawCharts draws each row's chart from view.activity (none for a group it lacks).
  function drawCharts() {
    for (const row of $("groups").tBodies[0].rows) {
      const cell = row.querySelector("td.activity");
      if (!cell) continue;
      const act = view.activity.get(row.dataset.group);
      cell.replaceChildren(...(act ? [chart(act)] : []));
    }
  }

  // chart draws a group's last hour as SVG: one column per minute (oldest left), succeeded attempts in
  // green under failed ones in red, on a common scale; after a gap, the deliveries pending now in amber on
  // the same scale, capped at the busiest minute's height. Every bar carries its count in data-count and a title.
  function chart(act) {
    const W = 3, GAP = 1, H = 36, n = act.buckets.length;
    const width = n * W + 10 + W * 2;
    const top = Math.max(1, ...act.buckets.map((b) => b.succeeded + b.failed));
    const scale = (v) => Math.max(1, Math.round((v / top) * (H - 2)));
    const g = svg("svg", { class: "chart", width, height: H + 12, viewBox: "0 0 " + width + " " + (H + 12), role: "img",
      "aria-label": "last hour of " + act.consumerGroup });
    g.append(svg("title", {}, document.createTextNode(act.consumerGroup + ": attempts per minute, " + fmtTime(act.from) + " to " + fmtTime(act.to))));
    g.append(svg("line", { class: "axis", x1: 0, y1: H, x2: n * W, y2: H }));
    act.buckets.forEach((b, i) => {
      const x = i * W, minute = fmtClock(new Date(b.start)).slice(0, 5) + " UTC";
      let y = H;
      for (const [cls, v, what] of [["ok", b.succeeded, "succeeded"], ["bad", b.failed, "failed"]]) {
        if (!v) continue;
        const h = scale(v);
        y -= h;
        g.append(svg("rect", { class: cls, x, y, width: W - GAP, height: h, "data-minute": i, "data-count": v },
          svg("title", {}, document.createTextNode(minute + ": " + v + " " + what))));
      }
    });
    if (act.pending > 0) {
      const h = scale(Math.min(act.pending, top));
      g.append(svg("rect", { class: "pend", x: n * W + 10, y: H - h, width: W * 2, height: h, "data-count": act.pending },
        svg("title", {}, document.createTextNode(act.pending + " pending now" + (act.oldestPendingAt ? ", the oldest since " + fmtTime(act.oldestPendingAt) : "")))));
    }
    g.append(svg("text", { x: 0, y: H + 10 }, document.createTextNode(fmtClock(new Date(act.from)).slice(0, 5))));
    g.append(svg("text", { x: n * W - 22, y: H + 10 }, document.createTextNode(fmtClock(new Date(act.buckets[n - 1].start)).slice(0, 5))));
    return g;
  }

  function renderGroups() {
    const rows = view.groups.map(({ ep, st }) => {
      const act = view.activity.get(ep.consumerGroup);
      const state = ep.state || "active";
      let stateText = state;
      // "paused" says it once: the reason is shown only when it adds to the state (disabled (gone)).
      if (state !== "active" && ep.stateReason && ep.stateReason !== state) stateText += " (" + ep.stateReason + ")";
      if (state !== "active" && ep.stateSince) stateText += " since " + fmtTime(ep.stateSince);
      const paused = state !== "active";
      const g = ep.consumerGroup;
      return el("tr", { "data-group": g },
        el("td", { class: "group" }, el("button", { class: "link", type: "button", text: g, title: "show this group's deliveries", onclick: () => filterGroup(g) })),
        el("td", { class: "url mono", title: redactURL(ep.url) }, ...wrappable(redactURL(ep.url))),
        el("td", { class: "state state-" + state, text: stateText }),
        el("td", { class: "num pending", text: st ? String(st.pending) : "" }),
        el("td", { class: "num oldest", text: st && st.pending > 0 ? fmtAge(st.oldestPendingAgeMs) : st ? "—" : "" }),
        el("td", { class: "num succeeded", text: st ? String(st.succeeded1h) : "" }),
        el("td", { class: "num failed" + (st && st.failed1h > 0 ? " bad" : ""), text: st ? String(st.failed1h) : "" }),
        el("td", { class: "num p50", text: st && st.latencyP50Ms !== null && st.latencyP50Ms !== undefined ? fmtMs(st.latencyP50Ms) : st ? "—" : "" }),
        el("td", { class: "activity" }, act ? chart(act) : null),
        el("td", {},
          el("button", { type: "button", text: paused ? "Resume" : "Pause…", "data-action": paused ? "resume" : "pause", "data-group": g,
            onclick: () => paused ? setState(g, "resume")
              : confirmThen("Pause " + g + "? Its deliveries wait, on every replica, until it is resumed.", "Pause " + g, () => setState(g, "pause")) }),
          " ",
          el("button", { type: "button", text: "Replay…", "data-action": "replay", "data-group": g, onclick: () => openReplay(g) }),
          " ",
          el("button", { type: "button", text: "Edit…", "data-action": "edit", "data-group": g, onclick: () => openEndpoint(g) }),
          " ",
          el("button", { type: "button", text: "Delete…", "data-action": "delete", "data-group": g,
            onclick: () => confirmThen("Delete " + g + "? Its registration goes and its pending deliveries end as errors (endpoint_deleted); this cannot be undone.", "Delete " + g, () => deleteEndpoint(g)) })));
    });
    $("groups").tBodies[0].replaceChildren(...rows);
    if (!rows.length) {
      $("groups").tBodies[0].append(el("tr", {}, el("td", { colSpan: 10, class: "muted", text: "No consumer group is registered (PUT /v1/endpoints/{consumerGroup})." })));
    }
  }

  function renderGroupFilter() {
    const sel = $("f-group");
    const keep = view.filters.group;
    const names = view.groups.map(({ ep }) => ep.consumerGroup).join("\n");
    if (sel.dataset.names === names) return; // unchanged: an open drop-down stays open
    sel.dataset.names = names;
    const opts = [el("option", { value: "", text: "all" })];
    for (const { ep } of view.groups) opts.push(el("option", { value: ep.consumerGroup, text: ep.consumerGroup }));
    if (keep && !view.groups.some(({ ep }) => ep.consumerGroup === keep)) opts.push(el("option", { value: keep, text: keep }));
    sel.replaceChildren(...opts);
    sel.value = keep;
  }

  async function setState(group, action) {
    try {
      await api("POST", v1("/endpoints/" + seg(group) + "/" + action));
      say((action === "pause" ? "Paused " : "Resumed ") + group + ".");
      await loadGroups();
    } catch (e) {
      sayError(action + " " + group, e);
    }
  }

  function openReplay(group) {
    const f = $("replay-form");
    f.dataset.group = group;
    $("replay-group").textContent = group;
    f.hidden = false;
    $("replay-status").focus();
  }

  async function submitReplay(ev) {
    ev.preventDefault();
    const f = $("replay-form");
    const group = f.dataset.group;
    const body = { status: $("replay-status").value };
    for (const k of ["from", "to"]) {
      const v = $("replay-" + k).value;
      if (v) body[k] = new Date(v + (v.length === 16 ? ":00" : "") + "Z").toISOString(); // the fields are UTC
    }
    try {
      const r = await api("POST", v1("/endpoints/" + seg(group) + "/replay"), body);
      say("Replay of " + group + ": " + r.replayed + " deliveries re-opened.");
      f.hidden = true;
      await refresh();
    } catch (e) {
      sayError("replay " + group, e);
    }
  }

  // ---- confirmation -----------------------------------------------------------------------------------

  // confirmThen shows text with a button yes (and Cancel) above the groups table; yes runs action once.
  function confirmThen(text, yes, action) {
    const box = $("confirm");
    $("confirm-text").textContent = text;
    $("confirm-yes").textContent = yes;
    box.onconfirm = action;
    box.hidden = false;
    $("confirm-yes").focus();
  }

  function closeConfirm() {
    $("confirm").hidden = true;
    $("confirm").onconfirm = null;
  }

  // ---- creating, editing and deleting endpoints -------------------------------------------------------

  // The form's fields by the API's field names; the other members of an edited endpoint are sent back as read.
  const EP_FIELDS = ["consumerGroup", "url", "topics", "filter", "format", "maxRetries", "retryDelay", "retryBackoffMultiplier", "maxRetryDelay", "headers", "secret"];
  // Members of a read that a PUT does not take back (read-only, or shown redacted).
  const EP_READ_ONLY = ["state", "stateReason", "stateSince", "createdAt", "updatedAt", "previousSecretExpiresAt"];

  function clearFieldErrors() {
    for (const f of [...EP_FIELDS, "form"]) {
      const e = $("err-" + f);
      e.textContent = "";
      e.hidden = true;
      const input = $("ep-" + f);
      if (input) input.classList.remove("invalid");
    }
  }

  // fieldError shows message beside the field the API named (the form's own line for a field it lacks).
  function fieldError(field, message) {
    const known = EP_FIELDS.includes(field);
    const e = $("err-" + (known ? field : "form"));
    e.textContent = known ? message : (field ? field + ": " : "") + message;
    e.hidden = false;
    if (known) $("ep-" + field).classList.add("invalid");
  }

  // apiFieldOf returns the field an API error names and the rest of its message: invalid_endpoint says
  // "field: message", a JSON type error 'field "name": ...'.
  function apiFieldOf(e) {
    let m = /^([A-Za-z]+): ([\s\S]*)$/.exec(e.message);
    if (e.code === "invalid_endpoint" && m) return [m[1], m[2]];
    m = /field "([A-Za-z]+)"/.exec(e.message);
    if (m) return [m[1], e.message];
    return ["", e.code + ": " + e.message];
  }

  async function openEndpoint(group) {
    closeConfirm();
    clearFieldErrors();
    let read = null;
    if (group) {
      try {
        read = await api("GET", v1("/endpoints/" + seg(group)));
      } catch (e) {
        sayError("reading endpoint " + group, e);
        return;
      }
    }
    view.editing = { group, read };
    const r = read || {};
    $("ep-title").textContent = group ? "Edit " + group : "New endpoint";
    $("ep-consumerGroup").value = group || "";
    $("ep-consumerGroup").disabled = !!group;
    $("ep-url").value = r.url || "";
    $("ep-topics").value = (r.topics || []).join(", ");
    $("ep-filter").value = r.filter || "";
    $("ep-format").value = r.format || "envelope";
    for (const k of ["maxRetries", "retryDelay", "retryBackoffMultiplier", "maxRetryDelay"]) $("ep-" + k).value = r[k] === undefined || r[k] === null ? "" : String(r[k]);
    $("ep-headers").value = Object.entries(r.headers || {}).map(([k, v]) => k + ": " + v).join("\n");
    $("ep-secret").value = "";
    $("ep-secret-note").textContent = r.secret ? "it has one (" + r.secret + "): reads never show it, so type it again to keep it, or a new one" : "";
    $("endpoint-form").hidden = false;
    $(group ? "ep-url" : "ep-consumerGroup").focus();
  }

  // endpointBody returns the PUT body of the form: the endpoint as read (when editing) with the form's fields
  // put in, empty ones left out; or null after showing an error beside a field the console itself can check.
  function endpointBody() {
    const read = view.editing && view.editing.read;
    const body = {};
    if (read) for (const [k, v] of Object.entries(read)) if (!EP_READ_ONLY.includes(k)) body[k] = v;
    for (const k of EP_FIELDS) delete body[k];
    const val = (k) => $("ep-" + k).value.trim();
    body.url = val("url");
    body.topics = val("topics").split(/[\s,]+/).filter((t) => t);
    if (val("filter")) body.filter = $("ep-filter").value;
    body.format = val("format");
    for (const k of ["maxRetries", "retryBackoffMultiplier"]) {
      const v = val(k);
      if (v) body[k] = /^-?[0-9]+(\.[0-9]+)?([eE][+-]?[0-9]+)?$/.test(v) ? Number(v) : v; // not a number: the API names it
    }
    for (const k of ["retryDelay", "maxRetryDelay"]) if (val(k)) body[k] = val(k);
    const lines = $("ep-headers").value.split("\n").map((l) => l.trim()).filter((l) => l);
    if (lines.length) {
      body.headers = {};
      for (const [i, line] of lines.entries()) {
        const at = line.indexOf(":");
        if (at <= 0) {
          fieldError("headers", "line " + (i + 1) + " is not \"Name: value\"");
          return null;
        }
        body.headers[line.slice(0, at).trim()] = line.slice(at + 1).trim();
      }
    }
    if (val("secret")) body.secret = val("secret");
    else if (read && read.secret) {
      fieldError("secret", "the endpoint signs with a secret that reads never show: type it (or a new one) to keep signing; a PUT without it would stop");
      return null;
    }
    return body;
  }

  async function saveEndpoint(ev) {
    ev.preventDefault();
    clearFieldErrors();
    const editing = view.editing || { group: "", read: null };
    const group = editing.group || $("ep-consumerGroup").value.trim();
    if (!group) {
      fieldError("consumerGroup", "a consumer group name is required");
      return;
    }
    const body = endpointBody();
    if (!body) return;
    try {
      if (!editing.group) {
        // A PUT replaces: a new endpoint must not overwrite a registered one.
        const exists = await api("GET", v1("/endpoints/" + seg(group))).then(() => true, (e) => {
          if (e instanceof APIError && e.status === 404) return false;
          throw e;
        });
        if (exists) {
          fieldError("consumerGroup", "consumer group " + group + " is registered already: use its Edit button");
          return;
        }
      }
      await api("PUT", v1("/endpoints/" + seg(group)), body);
      $("endpoint-form").hidden = true;
      view.editing = null;
      say((editing.group ? "Saved " : "Created ") + group + ".");
      await loadGroups();
    } catch (e) {
      if (e instanceof APIError && e.status === 400) {
        const [field, message] = apiFieldOf(e);
        fieldError(field, message);
        return;
      }
      if (e instanceof APIError && e.status === 401) return;
      fieldError("", (e instanceof APIError ? e.status + " " + e.code + ": " : "") + e.message);
    }
  }

  async function deleteEndpoint(group) {
    try {
      await api("DELETE", v1("/endpoints/" + seg(group)));
      say("Deleted " + group + ".");
      if (view.editing && view.editing.group === group) $("endpoint-form").hidden = true;
      await loadGroups();
    } catch (e) {
      sayError("delete " + group, e);
    }
  }

  // ---- deliveries -------------------------------------------------------------------------------------

  function filterGroup(g) {
    view.filters.group = g;
    $("f-group").value = g;
    resetPages();
    loadDeliveries().catch((e) => sayError("loading deliveries", e));
  }

  function resetPages() {
    view.cursors = [""];
    view.page = 0;
  }

  async function loadDeliveries() {
    const q = new URLSearchParams({ limit: String(PAGE_SIZE) });
    const f = view.filters;
    if (f.group) q.set("consumerGroup", f.group);
    if (f.topic) q.set("topic", f.topic);
    if (f.status) q.set("status", f.status);
    const after = view.cursors[view.page];
    if (after) q.set("after", after);
    const r = await api("GET", v1("/deliveries?" + q.toString()));
    view.next = r.next || "";
    renderDeliveries(r.deliveries || []);
  }

  function renderDeliveries(list) {
    const rows = list.map((d) => el("tr", { "data-id": d.id, "data-status": d.status, class: d.id === view.open ? "selected" : "" },
      el("td", { class: "mono", text: fmtTime(d.createdAt) }),
      el("td", {}, el("button", { class: "link", type: "button", text: d.id, "data-open": d.id, title: "show its attempts", onclick: () => go(d.id) })),
      el("td", { class: "group", text: d.consumerGroup }),
      el("td", { class: "group", text: d.topic }),
      el("td", { class: "status status-" + d.status, text: d.status }),
      el("td", { class: "num attempts", text: d.finalAttempt ? String(d.finalAttempt) : attemptsKnown(d) }),
      el("td", { text: d.error ? d.error.code + ": " + d.error.message : "" })));
    $("deliveries").tBodies[0].replaceChildren(...rows);
    if (!rows.length) {
      $("deliveries").tBodies[0].append(el("tr", {}, el("td", { colSpan: 7, class: "muted", text: "No delivery matches." })));
    }
    countAttempts(list.filter((d) => !d.finalAttempt && d.status === "pending")).catch(() => {});
    $("page-label").textContent = "page " + (view.page + 1);
    $("page-first").disabled = view.page === 0;
    $("page-prev").disabled = view.page === 0;
    $("page-next").disabled = !view.next;
  }

  // attemptsKnown is the counted attempts of a pending delivery d when its count is still current.
  function attemptsKnown(d) {
    const c = view.attemptCounts.get(d.id);
    return c && c.updatedAt === d.updatedAt ? String(c.n) : "";
  }

  // countAttempts fills the attempts cell of pending deliveries, which the list does not count: each one's
  // page (GET /v1/deliveries/{id}) is read, four at a time, once per change of the delivery (updatedAt).
  async function countAttempts(list) {
    const todo = list.filter((d) => attemptsKnown(d) === "");
    const one = async (d) => {
      const r = await api("GET", v1("/deliveries/" + seg(d.id)));
      view.attemptCounts.set(d.id, { updatedAt: d.updatedAt, n: (r.attempts || []).length });
      const row = [...$("deliveries").tBodies[0].rows].find((tr) => tr.dataset.id === d.id);
      if (row) row.querySelector("td.attempts").textContent = attemptsKnown(d);
    };
    const workers = [];
    for (let w = 0; w < Math.min(4, todo.length); w++) {
      workers.push((async () => {
        for (let d = todo.shift(); d; d = todo.shift()) await one(d).catch(() => {});
      })());
    }
    await Promise.all(workers);
    if (view.attemptCounts.size > 1000) view.attemptCounts.clear(); // a bound; the page counts again
  }

  function applyFilters(ev) {
    if (ev) ev.preventDefault();
    view.filters = { group: $("f-group").value, topic: $("f-topic").value.trim(), status: $("f-status").value };
    resetPages();
    loadDeliveries().catch((e) => sayError("loading deliveries", e));
  }

  function turnPage(to) {
    if (to === "next") {
      if (!view.next) return;
      view.cursors[view.page + 1] = view.next;
      view.page++;
    } else if (to === "prev") {
      view.page = Math.max(0, view.page - 1);
    } else {
      view.page = 0;
    }
    loadDeliveries().catch((e) => sayError("loading deliveries", e));
  }

  // ---- one delivery's attempt timeline ----------------------------------------------------------------

  // deliveryHash is the URL fragment of a delivery's page; openFromHash opens the delivery it names.
  const deliveryHash = (id) => "#/deliveries/" + seg(id);

  function hashDelivery() {
    const m = /^#\/deliveries\/(.+)$/.exec(location.hash);
    if (!m) return "";
    try {
      return decodeURIComponent(m[1]);
    } catch {
      return "";
    }
  }

  // go opens a delivery's page by its URL, so that the address bar holds its link.
  function go(id) {
    if (location.hash === deliveryHash(id)) openTimeline(id);
    else location.hash = deliveryHash(id);
  }

  function openFromHash() {
    const id = hashDelivery();
    if (id && id !== view.open) openTimeline(id);
    else if (!id && view.open) closeTimeline();
  }

  function closeTimeline() {
    view.open = "";
    view.watch = null;
    $("timeline").hidden = true;
    for (const tr of $("deliveries").tBodies[0].rows) tr.classList.remove("selected");
    if (hashDelivery()) history.replaceState(null, "", location.pathname + location.search);
  }

  async function openTimeline(id) {
    view.open = id;
    for (const tr of $("deliveries").tBodies[0].rows) tr.classList.toggle("selected", tr.dataset.id === id);
    try {
      await loadTimeline();
      $("timeline").scrollIntoView({ block: "start" });
    } catch (e) {
      sayError("loading delivery " + id, e);
    }
  }

  async function loadTimeline() {
    const id = view.open;
    if (!id) return;
    let d;
    try {
      d = await api("GET", v1("/deliveries/" + seg(id)));
    } catch (e) {
      if (e instanceof APIError && e.status === 404) {
        view.open = "";
        $("timeline").hidden = true;
      }
      throw e;
    }
    if (view.open !== id) return; // another one was opened meanwhile
    $("tl-id").textContent = d.id;
    $("tl-link").href = deliveryHash(d.id);
    $("tl-link").title = location.origin + location.pathname + deliveryHash(d.id);
    const why = $("tl-pending");
    why.hidden = !d.pendingReason;
    why.textContent = d.pendingReason ? "Pending: " + d.pendingReason.message : "";
    why.dataset.code = d.pendingReason ? d.pendingReason.code : "";
    const summary = [
      ["event", d.eventId], ["group", d.consumerGroup], ["topic", d.topic], ["ordering key", d.orderingKey],
      ["status", d.status], ["created", fmtTime(d.createdAt)], ["ended", fmtTime(d.endedAt)],
      ["error", d.error ? d.error.code + ": " + d.error.message : ""],
    ].filter(([, v]) => v);
    $("tl-summary").replaceChildren(...summary.flatMap(([k, v]) => [el("dt", { text: k }), el("dd", { class: k === "status" ? "status-" + v : "", "data-field": k, text: v })]));
    const rows = (d.attempts || []).map((a) => el("tr", { "data-attempt": String(a.attempt), "data-status": a.status },
      el("td", { class: "num", text: String(a.attempt) }),
      el("td", { class: "status status-" + a.status, text: a.status + (a.lockState ? " (" + a.lockState + ")" : "") }),
      el("td", { class: "mono", text: fmtTime(a.startedAt) || (a.status === "pending" ? "due " + fmtTime(a.nextAttemptAt) : "") }),
      el("td", { class: "mono", text: fmtTime(a.endedAt) }),
      el("td", { class: "num http", text: a.httpStatus ? String(a.httpStatus) : "" }),
      el("td", { class: "error", text: a.error ? a.error.code + ": " + a.error.message : "" }),
      el("td", { class: "num", text: a.durationMs !== undefined ? fmtMs(a.durationMs) : "" }),
      el("td", {}, a.responseBody ? el("pre", { class: "excerpt", text: a.responseBody.slice(0, 1024) }) : null)));
    $("attempts").tBodies[0].replaceChildren(...rows);
    $("retry").disabled = d.status === "pending";
    $("retry").title = d.status === "pending" ? "only a terminal delivery can be retried" : "";
    $("timeline").hidden = false;
    await loadEvent(d);
    if (view.watch && view.watch.id === id) {
      const done = d.status !== "pending" && (d.attempts || []).some((a) => a.attempt >= view.watch.attempt);
      if (done || Date.now() > view.watch.until) view.watch = null;
      else setTimeout(() => loadTimeline().catch(() => {}), 500);
    }
  }

  // loadEvent shows the event of delivery d beside it (GET /v1/events/{id}): its headers, its payload and
  // its deliveries, each a link to its own page. An expired event says so.
  async function loadEvent(d) {
    let ev = null;
    try {
      ev = await api("GET", v1("/events/" + seg(d.eventId)));
    } catch (e) {
      if (!(e instanceof APIError) || e.status !== 404) throw e;
    }
    if (view.open !== d.id) return;
    $("ev-id").textContent = d.eventId;
    $("ev-note").hidden = !!ev;
    $("ev-note").textContent = ev ? "" : "The event has expired: its payload and headers are gone.";
    const headers = ev ? Object.entries(ev.headers || {}).sort(([a], [b]) => (a < b ? -1 : 1)) : [];
    $("ev-headers").tBodies[0].replaceChildren(...(headers.length ? headers.map(([k, v]) => el("tr", { "data-header": k },
      el("th", { class: "mono", text: k }), el("td", { class: "mono", text: v }))) : [el("tr", {}, el("td", { class: "muted", text: ev ? "none" : "" }))]));
    $("ev-data").textContent = ev ? JSON.stringify(ev.data, null, 2) : "";
    const rows = (ev ? ev.deliveries || [] : []).map((o) => el("tr", { "data-delivery": o.id, class: o.id === d.id ? "selected" : "" },
      el("td", {}, o.id === d.id ? el("span", { class: "mono", text: o.id + " (this one)" })
        : el("a", { class: "mono", href: deliveryHash(o.id), "data-other": o.id, text: o.id })),
      el("td", { text: o.consumerGroup }),
      el("td", { class: "status status-" + o.status, text: o.status }),
      el("td", { class: "num", text: String(o.attempts) })));
    $("ev-deliveries").tBodies[0].replaceChildren(...rows);
  }

  async function retry() {
    const id = view.open;
    if (!id) return;
    try {
      const r = await api("POST", v1("/deliveries/" + seg(id) + "/retry"));
      say("Delivery " + id + ": attempt " + r.attempt + " is due now.");
      view.watch = { id, attempt: r.attempt, until: Date.now() + 60000 };
      await loadTimeline();
      if (view.page === 0) await loadDeliveries();
    } catch (e) {
      sayError("retry of " + id, e);
    }
  }

  // ---- refresh ----------------------------------------------------------------------------------------

  async function refresh() {
    if (view.loading) return;
    view.loading = true;
    try {
      const work = [loadGroups()];
      if (view.page === 0) work.push(loadDeliveries()); // later pages stay put until asked
      if (view.open && !view.watch) work.push(loadTimeline());
      await Promise.all(work);
      $("login").hidden = true;
      $("data").hidden = false;
      $("forget").hidden = !token;
      $("updated").textContent = "updated " + fmtClock(new Date());
      if (view.scrollTo && view.open === view.scrollTo && !$("timeline").hidden) {
        view.scrollTo = "";
        $("timeline").scrollIntoView({ block: "start" });
      }
      if ($("message").textContent.startsWith("This sidecar needs") || $("message").textContent.startsWith("The token was refused")) say("");
    } catch (e) {
      sayError("loading", e);
    } finally {
      view.loading = false;
    }
  }

  function init() {
    $("login-form").addEventListener("submit", (ev) => {
      ev.preventDefault();
      const t = $("token").value.trim();
      $("token").value = "";
      if (!t) return;
      keepToken(t);
      say("");
      view.open = hashDelivery(); // the token form cleared it: a delivery's URL still opens it
      refresh();
    });
    $("forget").addEventListener("click", () => {
      keepToken("");
      askToken(false);
    });
    $("refresh").addEventListener("click", () => {
      if (view.page !== 0) loadDeliveries().catch((e) => sayError("loading deliveries", e));
      refresh();
    });
    $("filters").addEventListener("submit", applyFilters);
    $("f-failing").addEventListener("click", () => {
      $("f-status").value = "error";
      applyFilters();
    });
    $("page-first").addEventListener("click", () => turnPage("first"));
    $("page-prev").addEventListener("click", () => turnPage("prev"));
    $("page-next").addEventListener("click", () => turnPage("next"));
    $("retry").addEventListener("click", retry);
    $("tl-close").addEventListener("click", closeTimeline);
    window.addEventListener("hashchange", openFromHash);
    view.open = hashDelivery(); // a delivery's own URL opens it with the first refresh
    view.scrollTo = view.open;
    $("replay-form").addEventListener("submit", submitReplay);
    $("ep-new").addEventListener("click", () => openEndpoint(""));
    $("endpoint-form").addEventListener("submit", saveEndpoint);
    $("ep-cancel").addEventListener("click", () => { $("endpoint-form").hidden = true; view.editing = null; });
    $("confirm-no").addEventListener("click", closeConfirm);
    $("confirm-yes").addEventListener("click", () => {
      const action = $("confirm").onconfirm;
      closeConfirm();
      if (action) action();
    });
    $("replay-cancel").addEventListener("click", () => { $("replay-form").hidden = true; });
    setInterval(() => {
      if ($("auto").checked && !$("data").hidden && document.visibilityState === "visible") refresh();
    }, REFRESH_MS);
    refresh();
  }

  init();
})();
