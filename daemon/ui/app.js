// mneme's web view: framework-free, everything through the daemon's own API
// (same origin: the sign-in cookie, and the sign-in's key in the x-mneme-ui
// header), every text from a session put on the page as text (textContent,
// controls shown escaped), never as markup: what models and tools wrote is
// untrusted.
"use strict";

const KEY = "mneme-ui-key"; // where this origin keeps the sign-in's key

// A sign-in arrives as #signin=KEY: keep the key, take it out of the address.
(function takeKey() {
  const match = location.hash.match(/^#signin=([0-9a-f]{64})$/);
  if (!match) return;
  localStorage.setItem(KEY, match[1]);
  history.replaceState(null, "", "/ui/#/");
})();

function headers() {
  return { "x-mneme-ui": localStorage.getItem(KEY) || "none" };
}

const PAGE = 200; // events on a page of the timeline
const CALL_KINDS = new Set(["ToolStarted", "ToolFinished", "ToolInDoubt",
  "ToolResolved", "ApprovalRequested", "ApprovalDecided", "ToolChecked", "WakeScheduled", "Woken"]);

let live = []; // the event streams of the page shown
let shown = 0; // which rendering of a page is current: older ones stop

// ---- the API -------------------------------------------------------------

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

async function api(path, body) {
  const init = { credentials: "same-origin", headers: headers() };
  if (body !== undefined) {
    init.method = "POST";
    init.headers["content-type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  const response = await fetch(path, init);
  const text = await response.text();
  let value = null;
  try { value = text ? JSON.parse(text) : null; } catch (_) { value = text; }
  if (!response.ok) {
    const reason = value && value.error ? value.error : `${response.status} ${text}`;
    throw new ApiError(response.status, reason);
  }
  return value;
}

// ---- building the page ---------------------------------------------------

// How much of a reply still arriving is shown (its end).
const ARRIVING_CHARS = 4000;

// Text from a session, with controls and bidi overrides shown escaped (they
// could make text read other than it is stored).
function visible(text) {
  return String(text).replace(/[\u0000-\u0008\u000b-\u001f\u007f-\u009f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g,
    (c) => `\\u{${c.codePointAt(0).toString(16)}}`);
}

// A call's arguments laid out afresh (pretty: one member a line), as a
// person should read them: padding between tokens cannot push a member out
// of sight, and every string and number is kept as written (JSON.parse
// would round a long number). Text that is not JSON is shown as it is.
// (The CLI's describe::laid_out does the same.)
function laidOut(text, pretty = true) {
  try { JSON.parse(text); } catch (_) { return String(text); }
  let out = "", depth = 0, inString = false, escaped = false;
  const breakLine = () => { if (pretty) out += "\n" + "  ".repeat(depth); };
  for (let i = 0; i < text.length; i++) {
    const c = text[i];
    if (inString) {
      out += c;
      if (escaped) escaped = false;
      else if (c === "\\") escaped = true;
      else if (c === '"') inString = false;
      continue;
    }
    if (c === '"') { inString = true; out += c; }
    else if (c === "{" || c === "[") {
      out += c;
      let j = i + 1;
      while (j < text.length && /\s/.test(text[j])) j++;
      if (text[j] === "}" || text[j] === "]") { out += text[j]; i = j; continue; }
      depth++; breakLine();
    } else if (c === "}" || c === "]") { depth = Math.max(0, depth - 1); breakLine(); out += c; }
    else if (c === ",") { out += c; breakLine(); }
    else if (c === ":") out += pretty ? ": " : ":";
    else if (!/\s/.test(c)) out += c;
  }
  return out;
}

// An element: attributes (on* as listeners), then children (strings as text).
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat(Infinity)) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(visible(child)));
  }
  return node;
}

function show(...nodes) {
  const main = document.getElementById("main");
  main.replaceChildren(...nodes.flat(Infinity).filter((n) => n !== null && n !== undefined));
}

function note(text) {
  const box = document.getElementById("note");
  box.textContent = visible(text);
  if (text) setTimeout(() => { if (box.textContent === visible(text)) box.textContent = ""; }, 6000);
}

function failed(error) {
  if (error instanceof ApiError && error.status === 401) {
    show(el("h1", {}, "Not signed in"),
      el("p", {}, "Run ", el("code", {}, "mneme ui"),
        " on the machine of the daemon and open the link it prints (it works once)."));
    return;
  }
  note(`Error: ${error.message}`);
}

const fmt = {
  n: (v) => (v === undefined || v === null ? "–" : Number(v).toLocaleString("en")),
  cost: (v) => (v === undefined || v === null ? "–" : `$${Number(v).toFixed(4)}`),
  pct: (v) => (v === undefined || v === null ? "–" : `${(100 * v).toFixed(0)}%`),
  time: (t) => (t ? t.replace("T", " ").replace(/\.\d+Z$/, "Z") : "–"),
  short: (id) => String(id).slice(0, 8),
};

// A session's status as shown: `interrupted` for one that is running with
// nothing running it (the process that did died).
function statusOf(r) {
  return r.interrupted ? "interrupted" : r.status;
}

function badge(status, waits) {
  if (waits) return el("span", { class: "badge waits" }, `${status} · waits for a person`);
  return el("span", { class: `badge ${status}` }, status);
}

function sessionLink(id) {
  return el("a", { href: `#/s/${id}`, class: "mono" }, id);
}

// The shortest prefix (8 characters at least) of each id that no other of
// `ids` shares: ids made close in time share their first characters.
function shortIds(ids) {
  const sorted = [...new Set(ids.map(String))].sort();
  const common = (a, b) => { let i = 0; while (i < a.length && a[i] === b[i]) i++; return i; };
  const short = new Map();
  sorted.forEach((id, i) => {
    const n = Math.max(i > 0 ? common(sorted[i - 1], id) : 0, i + 1 < sorted.length ? common(id, sorted[i + 1]) : 0);
    short.set(id, id.slice(0, Math.max(8, n + 1)));
  });
  return (id) => short.get(String(id)) || fmt.short(id);
}

// ---- the sessions --------------------------------------------------------

async function sessionsPage(query, current) {
  const rows = await api("/sessions");
  if (current !== shown) return;
  const filter = {
    status: query.get("status") || "",
    agent: query.get("agent") || "",
    find: query.get("find") || "",
  };
  const statuses = [...new Set(rows.map(statusOf))].sort();
  const agents = [...new Set(rows.map((r) => r.agent))].sort();
  const pick = (name, values, label) => el("label", {}, `${label} `,
    el("select", { name, onchange: (e) => refilter(name, e.target.value) },
      el("option", { value: "" }, "all"),
      values.map((v) => el("option", { value: v, selected: v === filter[name] }, v))));
  const find = el("input", {
    id: "find", type: "search", placeholder: "id or title", value: filter.find,
    "aria-label": "Find a session by id or title",
    onkeydown: (e) => { if (e.key === "Enter") refilter("find", e.target.value.trim()); },
  });
  const wanted = filter.find.toLowerCase();
  const kept = rows.filter((r) => (!filter.status || statusOf(r) === filter.status)
    && (!filter.agent || r.agent === filter.agent)
    && (!wanted || r.session.includes(wanted) || (r.title || "").toLowerCase().includes(wanted)));
  kept.sort((a, b) => (Number(!!b.waits_for_a_person) - Number(!!a.waits_for_a_person))
    || b.last_activity.localeCompare(a.last_activity));
  const waiting = kept.filter((r) => r.waits_for_a_person).length;
  const short = shortIds(rows.flatMap((r) => [r.session, r.parent, r.forked_from, r.rerun_of].filter(Boolean)));
  show(
    el("h1", {}, "Sessions"),
    el("div", { class: "toolbar" }, pick("status", statuses, "Status"), pick("agent", agents, "Agent"),
      el("label", {}, "Find ", find),
      el("span", {}, `${kept.length} of ${rows.length} sessions`),
      waiting ? el("span", { class: "badge waits" }, `${waiting} wait for a person`) : null),
    el("p", { id: "spend", class: "spend", hidden: true }),
    el("table", { id: "sessions" },
      el("thead", {}, el("tr", {},
        ["Session", "Status", "Agent"].map((h) => el("th", {}, h)),
        ["Events"].map((h) => el("th", { class: "num" }, h)),
        el("th", {}, "Last activity"),
        ["Cache hits", "Tokens in / out", "Cost"].map((h) => el("th", { class: "num" }, h)))),
      el("tbody", {}, kept.map((r) => el("tr", { class: r.waits_for_a_person ? "waits" : null, "data-session": r.session },
        el("td", { class: "session" }, sessionCell(r, short)),
        el("td", {}, badge(statusOf(r), r.waits_for_a_person)),
        el("td", {}, r.agent),
        el("td", { class: "num" }, fmt.n(r.events)),
        el("td", {}, fmt.time(r.last_activity)),
        el("td", { class: "num" }, fmt.pct(r.cache_hit_ratio)),
        el("td", { class: "num" }, `${fmt.n(r.prompt_tokens)} / ${fmt.n(r.completion_tokens)}`),
        el("td", { class: "num" }, fmt.cost(r.cost)))))));
  showSpend(current).catch(failed);
}

// What was spent today (UTC), by tenant (a tenant's sign-in: its own), as
// the daemon's ledgers of the log say (`GET /spend`).
async function showSpend(current) {
  const day = new Date().toISOString().slice(0, 10);
  const report = await api(`/spend?by=day&day=${day}`);
  const node = document.getElementById("spend");
  if (current !== shown || !node) return;
  const rows = report.rows.filter((r) => r.model_calls > 0);
  const each = rows.map((r) => `${r.tenant === null || r.tenant === undefined ? "the operator's own" : r.tenant} ${fmt.cost(r.cost)} (${fmt.n(r.model_calls)} model requests)`);
  node.textContent = visible(`Spent today (${day}, UTC): ${rows.length ? each.join(" · ") : "nothing"}`);
  node.hidden = false;
}

// A listed session: its title (its first message) linking to it, its id's
// short prefix (the whole id as its title), and what it comes from.
function sessionCell(r, short) {
  const title = r.title
    ? el("span", { class: "title" }, r.title)
    : el("span", { class: "title none" }, r.status === "unreadable" ? "unreadable" : "no message yet");
  const mark = (kind, text, id) => el("span", { class: `mark ${kind}` }, `${text} `,
    el("a", { href: `#/s/${id}`, class: "mono", title: id }, short(id)));
  const marks = [
    r.rerun_of ? mark("rerun", "rerun of", r.rerun_of) : r.forked_from ? mark("fork", "fork of", r.forked_from) : null,
    r.parent ? mark("child", "sub-agent of", r.parent) : null,
  ].filter(Boolean);
  return [
    el("a", { href: `#/s/${r.session}`, class: "session-link", title: r.session }, title),
    " ", el("span", { class: "mono short-id", title: r.session }, short(r.session)),
    marks.length ? el("div", { class: "marks" }, marks) : null,
    r.error ? el("div", { class: "error" }, clip(r.error, 300)) : null,
  ];
}

function refilter(name, value) {
  const query = new URLSearchParams(location.hash.split("?")[1] || "");
  if (value) query.set(name, value); else query.delete(name);
  location.hash = `#/?${query}`;
}

// ---- one session ---------------------------------------------------------

// How a session is shown: as a conversation, or as its events. The choice
// holds while the page stays open; `?view=events` asks for the events.
let preferredView = "conversation";

async function sessionPage(id, query, current) {
  const view = await api(`/sessions/${id}`);
  const head = view.events;
  const last = Math.max(0, head - PAGE);
  const after = query.has("after") ? Math.min(Math.max(0, Math.floor(Number(query.get("after"))) || 0), last) : last;
  const until = after + PAGE;
  const records = await api(`/sessions/${id}/events?after=${after}&until=${until}`);
  if (current !== shown) return; // another page was asked for meanwhile
  const page = newPage(id, view, after);
  for (const record of records) addRecord(page, record);
  // On the last page, a call still open in a session nothing runs any more
  // will not finish: the process running it died.
  // (Only those the view counted: a turn may have started since.)
  if (until >= head && (view.status !== "running" || view.interrupted)) page.died(head);
  const verifying = el("span", { class: "badge", id: "verified" }, "verifying the chain…");
  const chosen = query.get("view") === "events" || query.get("view") === "conversation" ? query.get("view")
    : query.has("seq") ? "events" : preferredView;
  show(
    el("h1", {}, "Session ", el("span", { class: "mono" }, id)),
    view.title ? el("p", { class: "session-title", id: "session-title" }, view.title) : null,
    forkPanel(id, view),
    el("div", { class: "toolbar" }, badge(statusOf(view), view.waits_for_a_person), verifying, actions(id, view)),
    facts(view),
    parentPanel(view),
    waitingPanel(id, view),
    viewTabs(chosen),
    pager(id, after, head),
    el("section", { id: "conversation", role: "tabpanel", "aria-labelledby": "tab-conversation", hidden: chosen !== "conversation" },
      page.conversation.node),
    el("section", { id: "events", role: "tabpanel", "aria-labelledby": "tab-events", hidden: chosen !== "events" },
      page.timeline.node),
    el("div", { id: "arriving", class: "panel arriving", hidden: true, "aria-live": "polite" }),
    pager(id, after, head));
  const first = after === 0 ? records[0] : (await api(`/sessions/${id}/events?after=0&until=1`))[0];
  const rerun = first && first.event && first.event.SessionForked && first.event.SessionForked.rerun;
  if (rerun && current === shown) {
    const from = first.event.SessionForked.parent;
    document.querySelector("h1").after(el("p", { class: "panel", id: "rerun-of" }, "A rerun of ", sessionLink(from),
      ` on another agent (its messages up to seq ${rerun.through_seq}; calls with no record ${rerun.live_tools ? "ran live" : "ran only if read-only"}). `,
      el("a", { href: `#/diff/${from}/${id}`, id: "rerun-diff-link" }, "Compare it with its original")));
  }
  const focus = Number(query.get("seq"));
  if (focus) {
    const row = document.getElementById(`e${focus}`);
    if (row) { row.focus(); row.scrollIntoView({ block: "center" }); }
  }
  if (until >= head) follow(id, page, current);
  // The chain's check reads every record: it fills its badge when done.
  api(`/sessions/${id}/verify`).then((v) => {
    if (verifying.isConnected) verifying.replaceWith(verifyBadge(v));
  }, failed);
  // So does the explanation of cache misses: the replies it names are marked.
  api(`/sessions/${id}/cache`).then((report) => {
    if (current === shown) markMisses(report);
  }, failed);
}

// A fork's link to its parent, and to the diff of the two (a rerun has its
// own, once its first event is read).
function forkPanel(id, view) {
  const from = view.forked_from;
  if (!from || view.rerun_of) return null;
  return el("p", { class: "panel", id: "forked" }, "A fork of ", sessionLink(from), ". ",
    el("a", { href: `#/diff/${from}/${id}`, id: "diff-link" }, "Compare it with its parent"));
}

// The two ways to show a session: the conversation, or its events.
function viewTabs(chosen) {
  const tab = (name, label) => el("button", {
    type: "button", role: "tab", id: `tab-${name}`, class: "tab", "aria-controls": name,
    "aria-selected": String(chosen === name), onclick: () => chooseView(name),
  }, label);
  return el("div", { class: "tabs", role: "tablist", "aria-label": "How the session is shown" },
    tab("conversation", "Conversation"), tab("events", "Events"), el("span", { id: "live" }));
}

function chooseView(name) {
  preferredView = name;
  for (const other of ["conversation", "events"]) {
    const tab = document.getElementById(`tab-${other}`);
    const panel = document.getElementById(other);
    if (!tab || !panel) return;
    tab.setAttribute("aria-selected", String(other === name));
    panel.hidden = other !== name;
  }
}

// A sub-agent's link to the call of its parent that started it.
function parentPanel(view) {
  const up = view.spawned_by;
  if (!up) return null;
  return el("p", { class: "panel", id: "spawned-by" }, "A sub-agent of session ",
    el("a", { href: `#/s/${up.session}?seq=${up.seq}`, class: "mono", id: "parent-link" }, up.session),
    ` (its call ${visible(up.call_id)}, #${up.seq}).`);
}

function verifyBadge(v) {
  if (v.ok) {
    return el("span", { class: "badge ok", id: "verified", title: `head hash ${v.head}` },
      `✓ chain verified to seq ${v.events} · head ${String(v.head).slice(0, 12)}`);
  }
  const where = v.bad_seq ? ` at seq ${v.bad_seq}` : "";
  return el("span", { class: "badge bad", id: "verified" }, `✗ chain broken${where}: ${v.error || "see mneme verify"}`);
}

function facts(view) {
  const rows = [
    ["Agent", view.agent],
    ["Events", fmt.n(view.events)],
    ["Created", fmt.time(view.created)],
    ["Last activity", fmt.time(view.last_activity)],
    ["Model calls", fmt.n(view.model_calls)],
    ["Tokens in / cached / out", `${fmt.n(view.prompt_tokens)} / ${fmt.n(view.cached_tokens)} / ${fmt.n(view.completion_tokens)}`],
    ["Prefix-cache hits", fmt.pct(view.cache_hit_ratio)],
    ["Cost", fmt.cost(view.cost)],
    ["Running on", view.running_on || "–"],
  ];
  if (view.wakes_at) rows.push(["Wakes at", fmt.time(view.wakes_at)]);
  if (view.waits_for) rows.push(["Waits for the event", view.waits_for]);
  if (view.answer) rows.push(["Answer", view.answer]);
  return el("dl", { class: "facts" }, rows.map(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
}

function actions(id, view) {
  const post = (path, body, done) => async () => {
    try {
      const answer = await api(`/sessions/${id}/${path}`, body);
      note(done(answer));
      setTimeout(route, 300);
    } catch (error) { failed(error); }
  };
  const running = view.status === "running";
  const pausable = running || view.status === "sleeping";
  if (view.status === "erased") {
    return [el("span", { class: "erased-note" }, "Its content was erased: nothing runs in it again.")];
  }
  return [
    el("button", { type: "button", id: "pause", disabled: !pausable, onclick: post("pause", {}, () => "Pause asked for: the turn stops at its next step.") }, "Pause"),
    el("button", { type: "button", id: "resume", disabled: running, onclick: post("resume", {}, () => "Resuming.") }, "Resume"),
    el("button", { type: "button", id: "cancel", class: "danger", onclick: () => {
      if (confirm("Cancel this session? A new message reopens it.")) post("cancel", { by: "" }, () => "Cancelled.")();
    } }, "Cancel"),
    el("label", {}, "Compare with ", el("input", {
      id: "compare", placeholder: "session id", size: 12,
      onkeydown: (e) => { if (e.key === "Enter" && e.target.value.trim()) location.hash = `#/diff/${id}/${encodeURIComponent(e.target.value.trim())}`; },
    })),
  ];
}

function waitingPanel(id, view) {
  if (!view.waiting.length) return null;
  return el("section", { class: "panel waits", id: "waiting", "aria-label": "Calls that wait for a person" },
    el("h2", {}, "Waiting for a person"),
    view.waiting.map((call) => el("div", { class: "waiting-call", "data-call": call.call_id },
      el("p", {}, el("strong", {}, call.tool), " ", el("code", { class: "call-id" }, clip(call.call_id, 64)),
        ` ${call.waits_for === "approval" ? "waits for approval" : `is in doubt: ${clip(call.reason, 300)}`}`,
        call.expires_at ? el("span", { class: "expires" }, ` until ${call.expires_at} (then it is denied as expired)`) : null),
      call.description ? el("p", { class: "tool-description" }, "What the model was told of this tool: ",
        el("q", {}, clip(call.description, 2000))) : null,
      call.waits_for === "approval" ? approvalButtons(id, call)
        : [el("pre", { class: "arguments whole", "aria-label": "Arguments" }, laidOut(call.arguments)), doubtButtons(id, call)])));
}

function decide(id, call, action, body) {
  return async () => {
    try {
      const answer = await api(`/sessions/${id}/calls/${encodeURIComponent(call.call_id)}/${action}`, { by: "", ...body });
      const going = answer && (answer.continuing || answer.status);
      note(`Recorded for ${clip(call.call_id, 64)}${going ? "; the session goes on." : "."}`);
      setTimeout(route, 300);
    } catch (error) { failed(error); }
  };
}

// The call's arguments, editable: approved as they are, or (changed) with
// the person's, which the tool then runs with (recorded with their name).
function approvalButtons(id, call) {
  // Shown whole, laid out afresh and escaped like every session text (a
  // bidi override would make the arguments read other than what the tool
  // gets). Left as shown, the call is approved with its own arguments.
  const shown = visible(laidOut(call.arguments));
  const rows = Math.min(Math.max(shown.split("\n").length, 4), 24);
  const args = el("textarea", { class: "edit-args", rows, spellcheck: "false", "aria-label": "Arguments" });
  args.value = shown;
  const approve = async () => {
    const edited = args.value !== shown;
    if (edited) {
      try { JSON.parse(args.value); } catch (_) { note("The arguments must be JSON."); return; }
    }
    await decide(id, call, "approve", edited ? { approved: true, args: args.value } : { approved: true })();
  };
  return el("div", { class: "approval" },
    el("label", {}, "Arguments (edit them to approve the call with yours)", args),
    el("div", { class: "toolbar" },
      el("button", { type: "button", class: "primary approve", onclick: approve }, "Approve"),
      el("button", { type: "button", class: "danger deny", onclick: decide(id, call, "approve", { approved: false }) }, "Deny")));
}

function doubtButtons(id, call) {
  const result = el("input", { placeholder: 'result as JSON, e.g. {"ok": true}', size: 30, "aria-label": "Result to record" });
  const message = el("input", { placeholder: "why it failed", size: 24, "aria-label": "Failure message" });
  const skip = async () => {
    let value;
    try { value = JSON.parse(result.value); } catch (_) { note("The result must be JSON."); return; }
    await decide(id, call, "resolve", { skip: value })();
  };
  return el("div", { class: "toolbar" },
    el("button", { type: "button", class: "retry", onclick: decide(id, call, "resolve", { retry: true }) }, "Run it again"),
    result, el("button", { type: "button", onclick: skip }, "Skip with this result"),
    message, el("button", { type: "button", onclick: () => decide(id, call, "resolve", { fail: message.value || "failed (web view)" })() }, "Record as failed"));
}

function pager(id, after, head) {
  const to = (a) => `#/s/${id}?after=${a}`;
  const first = after === 0;
  const lastStart = Math.max(0, head - PAGE);
  const jump = el("input", { type: "number", min: 1, max: head, size: 7, placeholder: "seq", "aria-label": "Go to seq",
    onkeydown: (e) => {
      if (e.key !== "Enter") return;
      const seq = Math.floor(Number(e.target.value));
      if (seq >= 1) location.hash = `#/s/${id}?after=${Math.max(0, seq - 1 - PAGE / 2)}&seq=${seq}`;
    } });
  return el("nav", { class: "pager", "aria-label": "Pages of events" },
    el("a", { href: to(0), "aria-disabled": first ? "true" : null, class: "page-first" }, "« first"),
    el("a", { href: to(Math.max(0, after - PAGE)), "aria-disabled": first ? "true" : null, class: "page-prev" }, "‹ earlier"),
    el("span", {}, `events ${fmt.n(Math.min(head, after + 1))}–${fmt.n(Math.min(head, after + PAGE))} of ${fmt.n(head)}`),
    el("a", { href: to(Math.min(lastStart, after + PAGE)), "aria-disabled": after >= lastStart ? "true" : null, class: "page-next" }, "later ›"),
    el("a", { href: to(lastStart), "aria-disabled": after >= lastStart ? "true" : null, class: "page-last" }, "last »"),
    jump);
}

// The one key of an externally tagged event: (kind, fields).
function unwrap(record) {
  const event = record.event;
  if (typeof event === "string") return [event, {}];
  const kind = Object.keys(event)[0];
  return [kind, event[kind]];
}

// What both views of a page are built from: what the records so far told
// (each call's tool and arguments, each tool's effect, the last reply's
// usage), the events timeline and the conversation.
function newPage(id, view, after) {
  const page = {
    id, lastSeq: after, lastReplySeq: 0, toolOf: new Map(), argsOf: new Map(), effectOf: new Map(),
    // Sub-agents: the child session each agent call's first ToolStarted began.
    childAt: new Map((view.children || []).map((c) => [c.seq, c.session])),
    timeline: { node: el("ol", { class: "timeline", id: "timeline", "aria-label": "Events" }), calls: new Map() },
    conversation: { node: el("ol", { class: "conversation", id: "turns", "aria-label": "Conversation" }), calls: new Map(), reply: null },
  };
  if (after > 0) {
    page.conversation.node.append(el("li", { class: "turn remark" },
      `Events 1–${after} are on earlier pages (‹ earlier).`));
  }
  // Every attempt still open (started by seq `upTo`) is one whose process died.
  page.died = (upTo) => {
    for (const calls of [page.timeline.calls, page.conversation.calls]) for (const card of calls.values()) card.died(upTo);
  };
  return page;
}

// Adds one record to both views.
function addRecord(page, record) {
  page.lastSeq = Math.max(page.lastSeq, record.seq);
  if (record.kind === "ModelReplied") page.lastReplySeq = Math.max(page.lastReplySeq || 0, record.seq);
  const [kind, fields] = unwrap(record);
  learn(kind, fields, page);
  if (kind === "SessionResumed" && fields.after_crash) page.died(record.seq);
  addEvent(page, record, kind, fields);
  addTurn(page, record, kind, fields);
}

// The events timeline: every event as a row; a tool call's events gather in
// one card (its attempts, effect, key, duration, result) where the call
// first shows, its rows nested under it.
function addEvent(page, record, kind, fields) {
  const timeline = page.timeline.node;
  // Some servers use the same call ids in every reply: a reply's calls are
  // new ones, each with a card of its own.
  if (kind === "ModelReplied") for (const call of fields.tool_calls) page.timeline.calls.delete(call.id);
  const row = eventRow(record, kind, fields, page);
  const callId = fields && fields.call_id;
  if (CALL_KINDS.has(kind) && callId) {
    let card = page.timeline.calls.get(callId);
    if (!card) {
      card = callCard(callId, page);
      page.timeline.calls.set(callId, card);
      timeline.append(el("li", { class: "event call-row" }, el("span", {}), el("span", {}), el("span", { class: "kind" }, "Tool call"), card.node));
    }
    card.add(kind, fields, record);
    row.classList.add("nested");
  }
  timeline.append(row);
}

// The conversation: what the user said, what the agent answered, each call
// of a reply as a card under it, and short notes for what else happened.
function addTurn(page, record, kind, f) {
  const conv = page.conversation;
  const list = conv.node;
  const item = (cls, ...children) => {
    const node = el("li", { class: `turn ${cls}`, id: `c${record.seq}`, tabindex: 0, "data-seq": record.seq }, ...children);
    list.append(node);
    return node;
  };
  const noteItem = (cls, ...children) => item(`remark ${cls}`, ...children);
  if (CALL_KINDS.has(kind) && f.call_id) {
    let card = conv.calls.get(f.call_id);
    if (!card) {
      // A call of a reply on an earlier page.
      card = callCard(f.call_id, page);
      conv.calls.set(f.call_id, card);
      item("agent", el("div", { class: "who" }, "Agent"), el("div", { class: "calls" }, card.node));
    }
    card.add(kind, f, record);
    return;
  }
  switch (kind) {
    case "UserMessage":
      item("user", el("div", { class: "who" }, "User"), el("div", { class: "text" }, clip(f.text, 20000)));
      return;
    case "MidTurnMessage":
      item("user", el("div", { class: "who" }, `User, while a turn ran (${f.policy === "queue" ? "queued" : f.policy === "interrupt" ? "interrupts the turn" : "rejected"})`),
        el("div", { class: "text" }, clip(f.text, 20000)));
      return;
    case "ModelReplied": {
      const cards = f.refused ? [] : f.tool_calls.map((call) => {
        const card = callCard(call.id, page);
        conv.calls.set(call.id, card);
        return card.node;
      });
      item("agent",
        el("div", { class: "who" }, "Agent"),
        thoughts(f),
        f.content ? el("div", { class: "text" }, clip(f.content, 20000)) : null,
        !f.content && !f.tool_calls.length ? el("div", { class: "text none" }, "(an empty reply)") : null,
        f.refused ? el("div", { class: "refused" }, `Not run: ${clip(f.refused, 300)} (its calls: ${f.tool_calls.map((c) => c.name).join(", ")})`) : null,
        f.finish_reason === "length" ? el("div", { class: "cut-off" }, "Cut off by the token limit.") : null,
        cards.length ? el("div", { class: "calls" }, cards) : null,
        figures(f));
      return;
    }
    case "SessionResumed":
      if (f.after_crash) noteItem("crash", `The process running this turn died; resumed by ${f.by}.`);
      else noteItem("resumed", `Resumed by ${f.by}${f.extend_budget ? ", with the turn's budget started again" : ""}.`);
      return;
    case "SessionPaused":
      noteItem("paused", `Paused: ${clip(f.reason, 300)}`);
      return;
    case "SessionFinished": {
      const outcome = f.outcome || {};
      if ("Failed" in outcome) noteItem("failed", `The turn failed: ${clip(outcome.Failed, 500)}`);
      else if (outcome.Cancelled) noteItem("cancelled", `Cancelled by ${outcome.Cancelled.by}.`);
      else noteItem("", record.summary);
      return;
    }
    case "SessionStarted":
      noteItem("started", `Started: agent ${f.spec.name}, model ${f.spec.model.model || "?"}, ${f.spec.tools.length} ${f.spec.tools.length === 1 ? "tool" : "tools"}.`);
      return;
    case "SessionForked":
      noteItem("forked", f.rerun ? "A rerun of " : "A fork of ", sessionLink(f.parent),
        f.rerun ? ": the original's messages follow, answered again."
          : f.shared ? `: the ${f.at_seq} events above are its parent's; what follows is its own.`
            : `: its first ${f.at_seq} events follow.`);
      return;
    case "ContextCompacted":
      noteItem("compacted", `The prompt's first ${f.entries} entries were replaced by a summary (the log keeps them): ${clip(f.summary, 300)}`);
      return;
    case "HeadSigned":
    case "SpawnedBy":
      return; // the events show them; the page's panels say whose child it is
    default:
      noteItem("", record.summary);
  }
}

// What a reply thought before it answered (a server's reasoning text, or
// Anthropic's thinking blocks), folded away and clipped: shown, never
// sent anywhere by the page.
function thoughts(f) {
  const blocks = (f.thinking || []).map((json) => {
    try {
      const block = JSON.parse(json);
      return block.type === "redacted_thinking" ? "(a redacted thinking block)" : String(block.thinking || "");
    } catch (_) { return String(json); }
  });
  const text = [f.reasoning, ...blocks].filter((t) => t).join("\n\n");
  if (!text) return null;
  return el("details", { class: "thinking" },
    el("summary", {}, f.reasoning ? "Reasoning" : `Thinking (${blocks.length} ${blocks.length === 1 ? "block" : "blocks"})`),
    el("div", { class: "text" }, clip(text, 4000)));
}

// A reply's figures, once, small: tokens in (cached) and out, latency; the
// finish reason and prefix digest on hover; a cache miss is marked by
// `markMisses`.
function figures(f) {
  const u = f.usage || {};
  const hover = visible(`finish ${f.finish_reason}${f.prefix_digest ? ` · prefix ${f.prefix_digest}` : ""}`);
  return el("div", { class: "figures", title: hover },
    `tokens ${fmt.n(u.prompt_tokens)} in (${fmt.n(u.cached_tokens)} cached) / ${fmt.n(u.completion_tokens)} out · ${fmt.n(f.latency_ms)} ms`,
    f.first_token_ms ? ` (first token ${fmt.n(f.first_token_ms)} ms)` : null);
}

// What later events need to know: each call's tool and arguments, each
// tool's effect.
function learn(kind, f, page) {
  if (kind === "ModelReplied") {
    for (const call of f.tool_calls) { page.toolOf.set(call.id, call.name); page.argsOf.set(call.id, call.arguments); }
  }
  const spec = kind === "SessionStarted" || kind === "SpecChanged" ? f.spec : null;
  if (spec) for (const tool of spec.tools) page.effectOf.set(tool.name, tool.effect);
}

// Marks each reply shown whose prompt missed the server's prefix cache, in
// both views, with what it cost and why, as the daemon explains it from
// the log (`GET /sessions/{id}/cache`).
function markMisses(report) {
  for (const miss of report.misses) {
    const said = `Cache miss: ${fmt.n(miss.cacheable_tokens - miss.cached_tokens)} of ${fmt.n(miss.cacheable_tokens)} cacheable prompt tokens not read from the cache; cause: ${miss.cause}; the request first differs at byte ${fmt.n(miss.first_difference)}`;
    for (const at of [`#c${miss.seq} .figures`, `#e${miss.seq} .extra`]) {
      const node = document.querySelector(at);
      if (node && !node.querySelector(".miss-note")) node.append(el("div", { class: "miss-note", "data-cause": miss.cause }, said));
    }
  }
}

// A tool call as one card: tool, effect, idempotency key, arguments, each
// attempt (started, then ok or error with its duration, in doubt, checked,
// or its process died), who approved it, and its result. Each view builds
// its own.
function callCard(callId, page) {
  const tool = page.toolOf.get(callId);
  const toolName = el("strong", { class: "tool" }, tool || "?");
  const effect = el("span", { class: "badge effect effect-declared" }, (tool && page.effectOf.get(tool)) || "effect unknown");
  const key = el("code", { class: "key" });
  const keyLine = el("span", { class: "key-line", hidden: true }, "key ", key);
  const args = page.argsOf.get(callId);
  const argsBox = el("pre", { class: "arguments", "aria-label": "Arguments", hidden: args === undefined }, args === undefined ? "" : clip(laidOut(args, false), 1000));
  const attempts = el("ol", { class: "attempts", "aria-label": "Attempts" });
  const status = el("p", { class: "call-status" });
  const edited = el("pre", { class: "edited-args", "aria-label": "Edited arguments", hidden: true });
  const result = el("p", { class: "result", hidden: true });
  // A call of an agent tool: the child session it runs.
  const child = el("p", { class: "subagent", hidden: true });
  const showChild = (session) => {
    if (!session || !child.hidden) return;
    child.append("Sub-agent session ", el("a", { href: `#/s/${session}`, class: "mono child-link" }, session));
    child.hidden = false;
  };
  const node = el("div", { class: "call", "data-call": callId },
    el("p", { class: "call-head" }, toolName, " ", effect, " ", keyLine, " ", el("span", { class: "mono call-id" }, callId)),
    argsBox, attempts, status, edited, child, result);
  const byAttempt = new Map();
  let current = null; // the attempt last started
  // One attempt: its row, and whether it is still open (no end recorded).
  const attemptRow = (n, ts, seq) => {
    const a = { n, seq, open: true, died: false, said: "", outcome: el("span", { class: "outcome" }, "running…"), duration: el("span", { class: "duration" }) };
    a.node = el("li", { class: "attempt running", "data-attempt": n }, `Attempt ${n}`,
      ts ? el("span", { class: "started", title: ts }, ` · started ${ts.slice(11, 23)}`) : " · started on an earlier page",
      " · ", a.outcome, a.duration);
    attempts.append(a.node);
    byAttempt.set(String(n), a);
    return a;
  };
  const say = (a, cls, text) => {
    a.said = text;
    a.outcome.textContent = visible(a.died ? (text ? `process died; ${text}` : "process died") : text);
    a.node.className = `attempt ${a.died ? "died" : cls}`;
  };
  const die = (a) => {
    if (!a || !a.open) return;
    a.open = false;
    a.died = true;
    say(a, "died", "");
  };
  return {
    node,
    died(upTo) { for (const a of byAttempt.values()) if (a.seq <= upTo) die(a); },
    add(kind, f, record) {
      if (kind === "ToolStarted") {
        showChild(page.childAt.get(record.seq));
        toolName.textContent = visible(f.tool);
        effect.textContent = visible(f.effect);
        key.textContent = visible(f.idempotency_key);
        keyLine.hidden = false;
        if (argsBox.hidden) { argsBox.textContent = visible(clip(laidOut(f.args, false), 1000)); argsBox.hidden = false; }
        // A new attempt while the last is open: the process running it died.
        for (const a of byAttempt.values()) if (a.open) die(a);
        current = attemptRow(f.attempt, record.ts, record.seq);
      } else if (kind === "ToolFinished") {
        if (f.child) showChild(f.child.session);
        const a = current || attemptRow("?", null, record.seq);
        const [ok, text] = "Ok" in f.outcome ? ["ok", f.outcome.Ok] : ["error", f.outcome.Err];
        if (f.settled_by_check) {
          a.open = false;
        } else if (a.open) {
          a.open = false;
          say(a, ok, ok);
          a.duration.textContent = ` · ${f.duration_ms} ms`;
        }
        const how = f.settled_by_check ? " (settled by its check)"
          : f.rerun === "NotRun" ? " (not run in a rerun)"
            : f.rerun && f.rerun.Recorded ? ` (answered from the record: ${f.rerun.Recorded.call_id} of ${f.rerun.Recorded.session})` : "";
        result.textContent = visible(`Result${how}: ${ok}: ${clip(text, 300)}`);
        result.className = `result ${ok}`;
        result.hidden = false;
        if (f.settled_by_check) node.classList.add("settled-by-check");
      } else if (kind === "ToolChecked") {
        const answer = f.answer === "Applied" ? "applied: its answer is the result"
          : f.answer === "NotApplied" ? "not applied: it runs again with its key"
            : `could not tell (${clip(f.answer.Unknown, 200)})`;
        const a = byAttempt.get(String(f.attempt)) || attemptRow(f.attempt, null, record.seq);
        // Only an attempt interrupted in flight is checked.
        a.open = false;
        a.died = true;
        say(a, "checked", `its check answered ${answer} (#${record.seq})`);
      } else if (kind === "ToolInDoubt") {
        const a = current || attemptRow("?", null, record.seq);
        a.open = false;
        say(a, "doubt", `in doubt (#${record.seq}): ${clip(f.reason, 300)}`);
      } else if (kind === "WakeScheduled") {
        const a = current || attemptRow("?", null, record.seq);
        a.open = false; // asleep, not running: nothing died
        const at = (ms) => new Date(ms).toISOString();
        const until = f.at_ms ? at(f.at_ms)
          : `the event ${f.event}${f.deadline_ms ? ` (at most until ${at(f.deadline_ms)})` : ""}`;
        say(a, "sleeping", `sleeping until ${until} (#${record.seq})`);
      } else if (kind === "Woken") {
        const late = f.late_ms ? `, ${(f.late_ms / 1000).toFixed(1)} s late` : "";
        status.textContent = visible(`Woke (${f.by}${late}) (#${record.seq})`);
      } else if (kind === "ApprovalRequested") {
        const until = f.expires_at_ms ? ` until ${new Date(f.expires_at_ms).toISOString()}` : "";
        status.textContent = `Waits for approval${until} (#${record.seq})`;
      } else if (kind === "ApprovalDecided" && !f.approved && f.reason === "expired") {
        status.textContent = visible(`Expired (#${record.seq}): nobody approved it in time, denied by ${f.by}`);
        status.classList.add("expired");
      } else if (kind === "ApprovalDecided" && f.approved && f.args) {
        status.textContent = visible(`Approved with edited arguments by ${f.by} (#${record.seq}):`);
        edited.textContent = visible(clip(laidOut(f.args, false), 2000));
        edited.hidden = false;
      } else if (kind === "ApprovalDecided") {
        status.textContent = visible(`${f.approved ? "Approved" : "Denied"} by ${f.by} (#${record.seq})`);
      } else if (kind === "ToolResolved") {
        status.textContent = visible(`Resolved by ${f.by} (#${record.seq}): ${clip(JSON.stringify(f.resolution), 300)}`);
      }
    },
  };
}

function clip(text, n) {
  const s = String(text);
  return s.length > n ? `${s.slice(0, n)}…` : s;
}

function eventRow(record, kind, fields, page) {
  const row = el("li", { class: "event", id: `e${record.seq}`, tabindex: 0, "data-kind": kind },
    el("span", { class: "seq" }, `#${record.seq}`),
    el("span", { class: "time", title: record.ts }, record.ts.slice(11, 23)),
    el("span", { class: "kind" }, kind),
    el("span", { class: "body" }, record.summary,
      record.caused_by ? el("a", { class: "caused", href: `#/s/${page.id}?after=${Math.max(0, record.caused_by - 1 - PAGE / 2)}&seq=${record.caused_by}`, title: "the event that caused it" }, `↳ caused by #${record.caused_by}`) : null));
  const extra = replyFacts(kind, fields);
  if (extra) row.append(extra);
  const payload = el("button", { type: "button", class: "quiet payload-toggle", "aria-expanded": "false",
    onclick: () => togglePayload(row, record) }, "payload");
  const fork = el("button", { type: "button", class: "quiet fork", title: `a new session holding events 1–${record.seq}`,
    onclick: () => forkAt(page.id, record.seq) }, "fork here");
  row.querySelector(".body").append(" ", payload, fork);
  return row;
}

// Under a model reply's row: its tokens, cache use, finish and prefix
// digest (a cache miss is marked by `markMisses`).
function replyFacts(kind, f) {
  if (kind !== "ModelReplied") return null;
  const u = f.usage || {};
  return el("div", { class: "extra" },
    `tokens ${fmt.n(u.prompt_tokens)} in (${fmt.n(u.cached_tokens)} cached) / ${fmt.n(u.completion_tokens)} out · finish ${f.finish_reason} · ${f.latency_ms} ms`,
    f.prefix_digest ? el("span", { class: "mono", title: f.prefix_digest }, ` · prefix ${f.prefix_digest.slice(0, 12)}`) : null);
}

function togglePayload(row, record) {
  const open = row.querySelector("pre.payload");
  const button = row.querySelector(".payload-toggle");
  if (open) { open.remove(); button.setAttribute("aria-expanded", "false"); return; }
  const envelope = { seq: record.seq, event_id: record.event_id, ts: record.ts, caused_by: record.caused_by,
    schema: record.schema, prev_hash: record.prev_hash, hash: record.hash };
  row.append(el("pre", { class: "payload" }, JSON.stringify({ envelope, event: record.event }, null, 2)));
  button.setAttribute("aria-expanded", "true");
}

async function forkAt(id, seq) {
  try {
    const forked = await api(`/sessions/${id}/fork`, { at: seq });
    note(`Forked at seq ${seq}: ${forked.session}`);
    location.hash = `#/s/${forked.session}`;
  } catch (error) { failed(error); }
}

// Reads Server-Sent Events from `path` (with the sign-in's key, which an
// EventSource cannot send), calling `on(name, data, id)` for each, until
// `stop()`; a broken stream is opened again after a second from `path()`,
// with the id of the last event it had as `Last-Event-ID`.
function stream(path, on, onState) {
  const control = { stopped: false, abort: null, last: null };
  const frame = (text) => {
    let name = "message";
    const data = [];
    for (const line of text.split("\n")) {
      if (line.startsWith("event:")) name = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      else if (line.startsWith("id:")) control.last = line.slice(3).trim();
    }
    if (data.length) on(name, data.join("\n"), control.last);
  };
  const open = async () => {
    while (!control.stopped) {
      const abort = new AbortController();
      control.abort = abort;
      try {
        const sent = control.last === null ? headers() : { ...headers(), "Last-Event-ID": control.last };
        const response = await fetch(path(), { credentials: "same-origin", headers: sent, signal: abort.signal });
        if (response.status === 401) { onState("signed out"); return; }
        onState("live");
        const reader = response.body.getReader();
        const decoder = new TextDecoder();
        let buffer = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
          let end;
          while ((end = buffer.indexOf("\n\n")) >= 0) {
            frame(buffer.slice(0, end));
            buffer = buffer.slice(end + 2);
          }
        }
      } catch (_) { /* broken or stopped */ }
      if (control.stopped) return;
      onState("reconnecting");
      await new Promise((resolve) => setTimeout(resolve, 1000));
    }
  };
  open();
  return { stop() { control.stopped = true; if (control.abort) control.abort.abort(); } };
}

// Follows new events as they become durable (the API's stream, from the
// last event shown, never showing one twice), and a streamed reply's text
// as it arrives (shown until the reply is recorded).
function follow(id, page, current) {
  const badgeNode = document.getElementById("live");
  const arriving = document.getElementById("arriving");
  const state = (what) => {
    badgeNode.textContent = `· ${what}`;
    badgeNode.className = what === "live" ? "live" : "";
  };
  // Only the end of a reply still arriving is shown: appending each piece
  // to the whole text made the page's work grow with the square of its
  // length (a few megabytes froze it for seconds).
  let tail = "";
  const onEvent = (_, data) => {
    const record = JSON.parse(data);
    if (record.seq <= page.lastSeq || current !== shown) return;
    addRecord(page, record);
    if (record.kind === "ModelReplied") { tail = ""; arriving.textContent = ""; arriving.hidden = true; }
    if (["SessionFinished", "SessionPaused", "ApprovalRequested", "ApprovalDecided", "ToolInDoubt"].includes(record.kind)
      || (record.kind === "ModelReplied" && !unwrap(record)[1].tool_calls.length)) {
      scheduleRefresh();
    }
  };
  const onDelta = (name, data, id) => {
    // A reply already shown recorded (its id: the seq it was expected at).
    if (name !== "delta" || Number(String(id).split(":")[0]) <= page.lastReplySeq) return;
    arriving.hidden = false;
    tail = (tail + visible(JSON.parse(data).text)).slice(-ARRIVING_CHARS);
    arriving.textContent = tail;
  };
  live = [
    stream(() => `/sessions/${id}/events?follow=true&after=${page.lastSeq}`, onEvent, state),
    stream(() => `/sessions/${id}/deltas`, onDelta, () => {}),
  ];
}

let refreshTimer = null;
function scheduleRefresh() {
  clearTimeout(refreshTimer);
  refreshTimer = setTimeout(route, 400);
}

// ---- two sessions compared -----------------------------------------------

async function diffPage(a, b, current) {
  const d = await api(`/sessions/${a}/diff/${b}`);
  if (current !== shown) return;
  const side = (name, s) => el("section", { class: "side", "aria-label": `Session ${name}` },
    el("h2", {}, `${name}: `, sessionLink(s.session)),
    el("p", {}, s.diverges_at_seq ? `goes on from seq ${s.diverges_at_seq} with ${s.after.length} events` : "nothing after the common events"),
    el("ol", {}, s.after.map((e) => el("li", { value: e.seq }, el("strong", {}, e.kind), " ", e.summary))));
  const compare = [
    ["Answer", d.a.answer || "–", d.b.answer || "–"],
    ["Tool calls", d.a.tool_calls.join("\n") || "–", d.b.tool_calls.join("\n") || "–"],
    ["Prompt tokens", fmt.n(d.a.prompt_tokens), fmt.n(d.b.prompt_tokens)],
    ["Completion tokens", fmt.n(d.a.completion_tokens), fmt.n(d.b.completion_tokens)],
    ["Cost", fmt.cost(d.a.cost), fmt.cost(d.b.cost)],
  ];
  show(
    el("h1", {}, "Two sessions compared"),
    el("p", { id: "common" }, `They hold the same first ${d.common_events} events of their history.`),
    el("table", { id: "comparison" },
      el("thead", {}, el("tr", {}, ["", "A", "B", ""].map((h) => el("th", {}, h)))),
      el("tbody", {}, compare.map(([what, x, y]) => el("tr", {},
        el("th", {}, what), el("td", { class: "pre" }, x), el("td", { class: "pre" }, y),
        el("td", { class: x === y ? "" : "differs" }, x === y ? "same" : "differs"))))),
    el("div", { class: "columns" }, side("A", d.a), side("B", d.b)));
}

// ---- routing and keys ------------------------------------------------------

async function route() {
  for (const source of live) source.stop();
  live = [];
  const current = ++shown;
  const [path, search] = location.hash.replace(/^#/, "").split("?");
  const query = new URLSearchParams(search || "");
  const parts = (path || "/").split("/").filter(Boolean);
  const uuid = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;
  try {
    if (parts[0] === "s" && uuid.test(parts[1] || "")) {
      await sessionPage(parts[1], query, current);
    } else if (parts[0] === "diff" && uuid.test(parts[1] || "") && uuid.test(parts[2] || "")) {
      await diffPage(parts[1], parts[2], current);
    } else {
      await sessionsPage(query, current);
    }
  } catch (error) { if (current === shown) failed(error); }
}

// The rows j and k move between: the events, or the conversation's turns,
// whichever is shown.
function moveFocus(step) {
  const events = document.getElementById("events");
  const selector = events && !events.hidden ? ".event[id]" : events ? "#conversation .turn[id]" : ".event[id]";
  const rows = [...document.querySelectorAll(selector)];
  if (!rows.length) return;
  const at = rows.indexOf(document.activeElement);
  const next = rows[Math.min(rows.length - 1, Math.max(0, at < 0 ? 0 : at + step))];
  next.focus();
  next.scrollIntoView({ block: "nearest" });
}

function onKey(e) {
  const typing = ["INPUT", "TEXTAREA", "SELECT", "BUTTON", "A"].includes(e.target.tagName);
  if (typing || e.target.isContentEditable || e.ctrlKey || e.metaKey || e.altKey) return;
  if (e.key === "Enter" && !e.target.classList.contains("event")) return;
  const click = (selector) => { const a = document.querySelector(selector); if (a) a.click(); };
  const actions = {
    "j": () => moveFocus(1),
    "k": () => moveFocus(-1),
    "Enter": () => e.target.querySelector(".payload-toggle").click(),
    "t": () => { const events = document.getElementById("events"); if (events) chooseView(events.hidden ? "events" : "conversation"); },
    "/": () => { const f = document.getElementById("find"); if (f) f.focus(); else location.hash = "#/"; },
    "[": () => click(".page-prev"),
    "]": () => click(".page-next"),
    "g": () => { location.hash = "#/"; },
    "?": () => toggleHelp(),
  };
  const act = actions[e.key];
  if (act) { e.preventDefault(); act(); }
}

function toggleHelp() {
  const help = document.getElementById("help");
  help.hidden = !help.hidden;
}

async function whoAmI() {
  try {
    const me = await api("/ui/me");
    document.getElementById("who").textContent = visible(`signed in as ${me.name}${me.tenant ? ` (tenant ${me.tenant})` : ""}`);
    document.getElementById("sign-out").hidden = false;
  } catch (_) { /* the page says so */ }
}

// Ends the sign-in on the daemon (its cookie and key stop working) and
// forgets the key here.
async function signOut() {
  try { await api("/ui/logout", {}); } catch (_) { /* signed out either way */ }
  localStorage.removeItem(KEY);
  for (const source of live) source.stop();
  live = [];
  shown++;
  document.getElementById("who").textContent = "signed out: run `mneme ui` to sign in again";
  document.getElementById("sign-out").hidden = true;
  document.getElementById("main").textContent = "";
}

window.addEventListener("hashchange", route);
document.addEventListener("keydown", onKey);
document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("help-button").addEventListener("click", toggleHelp);
  document.getElementById("sign-out").addEventListener("click", signOut);
  whoAmI();
  route();
});
