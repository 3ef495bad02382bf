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
  "ToolResolved", "ApprovalRequested", "ApprovalDecided", "ToolChecked"]);

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

function badge(status, waits) {
  if (waits) return el("span", { class: "badge waits" }, `${status} · waits for a person`);
  return el("span", { class: `badge ${status}` }, status);
}

function sessionLink(id) {
  return el("a", { href: `#/s/${id}`, class: "mono" }, id);
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
  const statuses = [...new Set(rows.map((r) => r.status))].sort();
  const agents = [...new Set(rows.map((r) => r.agent))].sort();
  const pick = (name, values, label) => el("label", {}, `${label} `,
    el("select", { name, onchange: (e) => refilter(name, e.target.value) },
      el("option", { value: "" }, "all"),
      values.map((v) => el("option", { value: v, selected: v === filter[name] }, v))));
  const find = el("input", {
    id: "find", type: "search", placeholder: "session id", value: filter.find,
    "aria-label": "Find a session by id",
    onkeydown: (e) => { if (e.key === "Enter") refilter("find", e.target.value.trim()); },
  });
  const kept = rows.filter((r) => (!filter.status || r.status === filter.status)
    && (!filter.agent || r.agent === filter.agent)
    && (!filter.find || r.session.includes(filter.find.toLowerCase())));
  kept.sort((a, b) => (Number(!!b.waits_for_a_person) - Number(!!a.waits_for_a_person))
    || b.last_activity.localeCompare(a.last_activity));
  const waiting = kept.filter((r) => r.waits_for_a_person).length;
  show(
    el("h1", {}, "Sessions"),
    el("div", { class: "toolbar" }, pick("status", statuses, "Status"), pick("agent", agents, "Agent"),
      el("label", {}, "Find ", find),
      el("span", {}, `${kept.length} of ${rows.length} sessions`),
      waiting ? el("span", { class: "badge waits" }, `${waiting} wait for a person`) : null),
    el("table", { id: "sessions" },
      el("thead", {}, el("tr", {},
        ["Session", "Status", "Agent"].map((h) => el("th", {}, h)),
        ["Events"].map((h) => el("th", { class: "num" }, h)),
        el("th", {}, "Last activity"),
        ["Cache hits", "Tokens in / out", "Cost"].map((h) => el("th", { class: "num" }, h)))),
      el("tbody", {}, kept.map((r) => el("tr", { class: r.waits_for_a_person ? "waits" : null },
        el("td", {}, sessionLink(r.session)),
        el("td", {}, badge(r.status, r.waits_for_a_person)),
        el("td", {}, r.agent),
        el("td", { class: "num" }, fmt.n(r.events)),
        el("td", {}, fmt.time(r.last_activity)),
        el("td", { class: "num" }, fmt.pct(r.cache_hit_ratio)),
        el("td", { class: "num" }, `${fmt.n(r.prompt_tokens)} / ${fmt.n(r.completion_tokens)}`),
        el("td", { class: "num" }, fmt.cost(r.cost)))))));
}

function refilter(name, value) {
  const query = new URLSearchParams(location.hash.split("?")[1] || "");
  if (value) query.set(name, value); else query.delete(name);
  location.hash = `#/?${query}`;
}

// ---- one session ---------------------------------------------------------

async function sessionPage(id, query, current) {
  const view = await api(`/sessions/${id}`);
  const head = view.events;
  const last = Math.max(0, head - PAGE);
  const after = query.has("after") ? Math.min(Math.max(0, Math.floor(Number(query.get("after"))) || 0), last) : last;
  const until = after + PAGE;
  const records = await api(`/sessions/${id}/events?after=${after}&until=${until}`);
  if (current !== shown) return; // another page was asked for meanwhile
  const timeline = el("ol", { class: "timeline", id: "timeline", "aria-label": "Events" });
  const context = { id, calls: new Map(), lastReply: null, compacted: false, toolOf: new Map(),
    effectOf: new Map(), lastSeq: after,
    // Sub-agents: the child session each agent call's first ToolStarted began.
    childAt: new Map((view.children || []).map((c) => [c.seq, c.session])) };
  for (const record of records) addRecord(timeline, record, context);
  const verifying = el("span", { class: "badge", id: "verified" }, "verifying the chain…");
  show(
    el("h1", {}, "Session ", el("span", { class: "mono" }, id)),
    el("div", { class: "toolbar" }, badge(view.status, view.waits_for_a_person), verifying, actions(id, view)),
    facts(view),
    parentPanel(view),
    waitingPanel(id, view),
    el("h2", {}, "Timeline ", el("span", { id: "live" })),
    pager(id, after, head),
    timeline,
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
  if (until >= head) follow(id, timeline, context, current);
  // The chain's check reads every record: it fills its badge when done.
  api(`/sessions/${id}/verify`).then((v) => {
    if (verifying.isConnected) verifying.replaceWith(verifyBadge(v));
  }, failed);
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
  if (view.status === "erased") {
    return [el("span", { class: "erased-note" }, "Its content was erased: nothing runs in it again.")];
  }
  return [
    el("button", { type: "button", id: "pause", disabled: !running, onclick: post("pause", {}, () => "Pause asked for: the turn stops at its next step.") }, "Pause"),
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
      call.waits_for === "approval" ? approvalButtons(id, call)
        : [el("pre", { class: "arguments", "aria-label": "Arguments" }, clip(call.arguments, 2000)), doubtButtons(id, call)])));
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
  const args = el("textarea", { class: "edit-args", rows: 4, spellcheck: "false", "aria-label": "Arguments" });
  // Shown escaped like every session text: a bidi override would make the
  // arguments read other than what the tool gets. Left as shown, the call
  // is approved with its own arguments.
  const shown = visible(call.arguments);
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

// Adds one record to the timeline: a tool call's events gather in one card
// (its attempts, effect, key, duration, result) where the call first shows.
function addRecord(timeline, record, context) {
  context.lastSeq = Math.max(context.lastSeq, record.seq);
  const [kind, fields] = unwrap(record);
  learn(kind, fields, context);
  const row = eventRow(record, kind, fields, context);
  const callId = fields && fields.call_id;
  if (CALL_KINDS.has(kind) && callId) {
    let card = context.calls.get(callId);
    if (!card) {
      card = callCard(callId, context.toolOf.get(callId), context.effectOf, context.childAt);
      context.calls.set(callId, card);
      timeline.append(el("li", { class: "event call-row" }, el("span", {}), el("span", {}), el("span", { class: "kind" }, "Tool call"), card.node));
    }
    card.add(kind, fields, record);
    row.classList.add("nested");
  }
  timeline.append(row);
}

// What later events need to know: each call's tool, each tool's effect.
function learn(kind, f, context) {
  if (kind === "ModelReplied") for (const call of f.tool_calls) context.toolOf.set(call.id, call.name);
  const spec = kind === "SessionStarted" || kind === "SpecChanged" ? f.spec : null;
  if (spec) for (const tool of spec.tools) context.effectOf.set(tool.name, tool.effect);
}

function callCard(callId, tool, effectOf, childAt) {
  const attempts = el("tbody");
  const head = el("p", {}, el("strong", { class: "tool" }, tool || "?"), " ",
    el("span", { class: "badge effect-declared" }, (tool && effectOf.get(tool)) || "effect unknown"), " ",
    el("span", { class: "mono" }, callId));
  const status = el("p", { class: "call-status" });
  const edited = el("pre", { class: "edited-args", "aria-label": "Edited arguments", hidden: true });
  // A call of an agent tool: the child session it runs.
  const child = el("p", { class: "subagent", hidden: true });
  const showChild = (session) => {
    if (!session || !child.hidden) return;
    child.append("Sub-agent session ", el("a", { href: `#/s/${session}`, class: "mono child-link" }, session));
    child.hidden = false;
  };
  const node = el("div", { class: "call", "data-call": callId }, head, el("table", {},
    el("thead", {}, el("tr", {}, ["Attempt", "Effect", "Idempotency key", "Duration", "Result"].map((h) => el("th", {}, h)))),
    attempts), child, status, edited);
  let current = null;
  return {
    node,
    add(kind, f, record) {
      if (kind === "ToolStarted") showChild(childAt && childAt.get(record.seq));
      if (kind === "ToolFinished" && f.child) showChild(f.child.session);
      if (kind === "ToolStarted") {
        head.querySelector(".tool").textContent = visible(f.tool);
        head.querySelector(".effect-declared").textContent = visible(f.effect);
        current = el("tr", { class: "attempt" }, el("td", {}, String(f.attempt)), el("td", { class: "effect" }, String(f.effect)),
          el("td", { class: "mono key" }, f.idempotency_key), el("td", { class: "duration" }, "running…"), el("td", { class: "result" }, ""));
        attempts.append(current);
      } else if (kind === "ToolFinished" && !current) {
        attempts.append(el("tr", { class: "attempt" }, el("td", { colspan: 3 }, "started on an earlier page"),
          el("td", { class: "duration" }, `${f.duration_ms} ms`), el("td", { class: "result" }, outcomeText(f))));
      } else if (kind === "ToolFinished") {
        current.querySelector(".duration").textContent = `${f.duration_ms} ms`;
        current.querySelector(".result").textContent = outcomeText(f);
        if (f.settled_by_check) current.classList.add("settled-by-check");
      } else if (kind === "ToolChecked") {
        const answer = f.answer === "Applied" ? "applied: its answer is the result"
          : f.answer === "NotApplied" ? "not applied: it runs again with its key"
            : `could not tell (${clip(f.answer.Unknown, 200)})`;
        status.textContent = visible(`Attempt ${f.attempt} interrupted; its check answered ${answer} (#${record.seq})`);
      } else if (kind === "ToolInDoubt") {
        status.textContent = visible(`In doubt (#${record.seq}): ${clip(f.reason, 300)}`);
      } else if (kind === "ApprovalRequested") {
        const until = f.expires_at_ms ? ` until ${new Date(f.expires_at_ms).toISOString()}` : "";
        status.textContent = `Waits for approval${until} (#${record.seq})`;
      } else if (kind === "ApprovalDecided" && !f.approved && f.reason === "expired") {
        status.textContent = visible(`Expired (#${record.seq}): nobody approved it in time, denied by ${f.by}`);
        status.classList.add("expired");
      } else if (kind === "ApprovalDecided" && f.approved && f.args) {
        status.textContent = visible(`Approved with edited arguments by ${f.by} (#${record.seq}):`);
        edited.textContent = visible(clip(f.args, 2000));
        edited.hidden = false;
      } else if (kind === "ApprovalDecided") {
        status.textContent = visible(`${f.approved ? "Approved" : "Denied"} by ${f.by} (#${record.seq})`);
      } else if (kind === "ToolResolved") {
        status.textContent = visible(`Resolved by ${f.by} (#${record.seq}): ${clip(JSON.stringify(f.resolution), 300)}`);
      }
    },
  };
}

// A finished call's outcome, clipped.
function outcomeText(f) {
  const [ok, text] = "Ok" in f.outcome ? ["ok", f.outcome.Ok] : ["error", f.outcome.Err];
  return visible(`${ok}: ${clip(text, 160)}`);
}

function clip(text, n) {
  const s = String(text);
  return s.length > n ? `${s.slice(0, n)}…` : s;
}

function eventRow(record, kind, fields, context) {
  const row = el("li", { class: "event", id: `e${record.seq}`, tabindex: 0, "data-kind": kind },
    el("span", { class: "seq" }, `#${record.seq}`),
    el("span", { class: "time", title: record.ts }, record.ts.slice(11, 23)),
    el("span", { class: "kind" }, kind),
    el("span", { class: "body" }, record.summary,
      record.caused_by ? el("a", { class: "caused", href: `#/s/${context.id}?after=${Math.max(0, record.caused_by - 1 - PAGE / 2)}&seq=${record.caused_by}`, title: "the event that caused it" }, `↳ caused by #${record.caused_by}`) : null));
  const extra = replyFacts(kind, fields, context);
  if (extra) row.append(extra);
  const payload = el("button", { type: "button", class: "quiet payload-toggle", "aria-expanded": "false",
    onclick: () => togglePayload(row, record) }, "payload");
  const fork = el("button", { type: "button", class: "quiet fork", title: `a new session holding events 1–${record.seq}`,
    onclick: () => forkAt(context.id, record.seq) }, "fork here");
  row.querySelector(".body").append(" ", payload, fork);
  if (kind === "ContextCompacted") context.compacted = true;
  return row;
}

// Under a model reply: its tokens, cache use, finish and prefix digest, and
// whether the server's prefix cache missed.
function replyFacts(kind, f, context) {
  if (kind !== "ModelReplied") return null;
  const u = f.usage || {};
  const previous = context.lastReply;
  context.lastReply = u;
  let miss = null;
  if (context.compacted) {
    miss = "the prompt's prefix changed here (compaction): the server's cache misses from here";
  } else if (previous && u.cached_tokens < previous.prompt_tokens / 2) {
    miss = `cache miss: ${fmt.n(u.cached_tokens)} tokens cached, the previous prompt had ${fmt.n(previous.prompt_tokens)}`;
  }
  context.compacted = false;
  return el("div", { class: "extra" },
    `tokens ${fmt.n(u.prompt_tokens)} in (${fmt.n(u.cached_tokens)} cached) / ${fmt.n(u.completion_tokens)} out · finish ${f.finish_reason} · ${f.latency_ms} ms`,
    f.prefix_digest ? el("span", { class: "mono", title: f.prefix_digest }, ` · prefix ${f.prefix_digest.slice(0, 12)}`) : null,
    miss ? el("div", { class: "miss-note" }, miss) : null);
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
    location.hash = `#/s/${forked.session}?forked_from=${id}`;
  } catch (error) { failed(error); }
}

// Reads Server-Sent Events from `path` (with the sign-in's key, which an
// EventSource cannot send), calling `on(name, data)` for each, until
// `stop()`; a broken stream is opened again after a second from `path()`.
function stream(path, on, onState) {
  const control = { stopped: false, abort: null };
  const frame = (text) => {
    let name = "message";
    const data = [];
    for (const line of text.split("\n")) {
      if (line.startsWith("event:")) name = line.slice(6).trim();
      else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
    }
    if (data.length) on(name, data.join("\n"));
  };
  const open = async () => {
    while (!control.stopped) {
      const abort = new AbortController();
      control.abort = abort;
      try {
        const response = await fetch(path(), { credentials: "same-origin", headers: headers(), signal: abort.signal });
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
function follow(id, timeline, context, current) {
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
    if (record.seq <= context.lastSeq || current !== shown) return;
    addRecord(timeline, record, context);
    if (record.kind === "ModelReplied") { tail = ""; arriving.textContent = ""; arriving.hidden = true; }
    if (["SessionFinished", "SessionPaused", "ApprovalRequested", "ApprovalDecided", "ToolInDoubt"].includes(record.kind)
      || (record.kind === "ModelReplied" && !unwrap(record)[1].tool_calls.length)) {
      scheduleRefresh();
    }
  };
  const onDelta = (name, data) => {
    if (name !== "delta") return;
    arriving.hidden = false;
    tail = (tail + visible(JSON.parse(data).text)).slice(-ARRIVING_CHARS);
    arriving.textContent = tail;
  };
  live = [
    stream(() => `/sessions/${id}/events?follow=true&after=${context.lastSeq}`, onEvent, state),
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
      const from = query.get("forked_from");
      if (from && uuid.test(from) && current === shown) {
        document.querySelector("h1").after(el("p", { class: "panel", id: "forked" }, "A fork of ", sessionLink(from), ". ",
          el("a", { href: `#/diff/${from}/${parts[1]}`, id: "diff-link" }, "Compare it with its parent")));
      }
    } else if (parts[0] === "diff" && uuid.test(parts[1] || "") && uuid.test(parts[2] || "")) {
      await diffPage(parts[1], parts[2], current);
    } else {
      await sessionsPage(query, current);
    }
  } catch (error) { if (current === shown) failed(error); }
}

function moveFocus(step) {
  const rows = [...document.querySelectorAll(".event[id]")];
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
    document.getElementById("who").textContent = visible(`signed in as ${me.name}`);
  } catch (_) { /* the page says so */ }
}

window.addEventListener("hashchange", route);
document.addEventListener("keydown", onKey);
document.addEventListener("DOMContentLoaded", () => {
  document.getElementById("help-button").addEventListener("click", toggleHelp);
  whoAmI();
  route();
});
