// @ts-check
// Drives a real daemon with @mneme/client as a user would; run by
// cli/tests/clients.rs (which first type-checks this file against the
// package's types with tsc), with the daemon's MNEME_URL and MNEME_TOKEN,
// an agent `billing` whose `refund` waits for approval, and its model.
//
// It creates a session, sends a message and gets the turn's outcome (a call
// waiting for approval), follows the session's events, asks the test to
// restart the daemon (a line `RESTART` on stdout; the test answers on stdin
// once the new daemon listens), approves the call with edited arguments,
// and follows the same stream (reopened with Last-Event-ID, read on while
// the daemon is away) to the answer.
// Then it streams a reply's text, forks and erases the fork, and meets the
// daemon's errors. The last line it prints is `RESULT ` and a JSON object
// of what it saw, which the test checks against the daemon's record.

import { createInterface } from "node:readline";
import { Mneme, MnemeError } from "@mneme/client";

/** @typedef {import("@mneme/client").EventRecord} EventRecord */
/** @typedef {import("@mneme/client").Delta} Delta */

const url = process.env.MNEME_URL;
const token = process.env.MNEME_TOKEN;
const closed = process.env.MNEME_CLOSED_URL; // where nothing listens
if (!url || !token || !closed) throw new Error("MNEME_URL, MNEME_TOKEN and MNEME_CLOSED_URL name the daemon");
const MISSING = "0192a000-0000-7000-8000-000000000000";
const stdin = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

/**
 * The MnemeError `call` rejects with, as JSON.
 * @param {() => Promise<unknown>} call
 */
async function errorOf(call) {
  try {
    await call();
  } catch (e) {
    if (e instanceof MnemeError) return { status: e.status, message: e.message, text: String(e) };
    throw e;
  }
  throw new Error(`${call} raised nothing`);
}

/**
 * The model's final reply of a turn: text and no calls.
 * @param {EventRecord} event
 */
function isAnswer(event) {
  // An event is {KIND: {its fields}}.
  const body = /** @type {{ content?: string, tool_calls?: unknown[] }} */ (event.event[event.kind] ?? {});
  return event.kind === "ModelReplied" && Boolean(body.content) && !(body.tool_calls && body.tool_calls.length);
}

/** @type {Record<string, unknown>} */
const seen = {};
const m = new Mneme({ baseUrl: url, token, by: "ada" });
if ((await m.health()).status !== "ok") throw new Error("not healthy");

const s = await m.createSession({ agent: "billing" });
seen.session = s.id;
const out = await s.send("Refund ada 1 cent", { wait: true });
if (out.status !== "paused") throw new Error(`expected a pause: ${JSON.stringify(out)}`);
const waiting = out.awaiting_approval ?? [];
seen.awaiting = waiting.map((c) => ({ call_id: c.call_id, tool: c.tool, arguments: c.arguments }));
const call = waiting[0].call_id;

// Follow the log: history first, up to the session's head. The iterator is
// kept (not broken out of), so its connection stays open across the restart.
const head = (await s.get()).events;
const stream = s.events({ follow: true });
const events = stream[Symbol.asyncIterator]();
/** @type {number[]} */
const seqs = [];
/** @type {string[]} */
const kinds = [];
for (;;) {
  const next = await events.next();
  if (next.done) throw new Error("the stream ended");
  seqs.push(next.value.seq);
  kinds.push(next.value.kind);
  if (next.value.seq === head) break;
}
seen.before_restart = stream.lastEventId;

// The daemon goes away and comes back while the stream is read: it goes
// on reading (reconnecting while the daemon is away) until the answer.
console.log("RESTART");
const following = (async () => {
  for (;;) {
    const next = await events.next();
    if (next.done) throw new Error("the stream ended");
    seqs.push(next.value.seq);
    kinds.push(next.value.kind);
    if (isAnswer(next.value)) return next.value.seq;
  }
})();
if ((await stdin.next()).value?.trim() !== "restarted") throw new Error("no word from the test");

const decided = await s.approve(call, { editArgs: { n: 2 } });
if (!("decided" in decided)) throw new Error(`expected a decision: ${JSON.stringify(decided)}`);
seen.decided = { decided: decided.decided, continuing: decided.continuing };
const answerSeq = await following;
await events.return?.();
stream.close();
seen.seqs = seqs;
seen.kinds = kinds;
seen.reconnects = stream.reconnects;
seen.answer_seq = answerSeq;

// Read back.
const view = await s.get();
seen.status = view.status;
seen.answer = view.answer;
/** @type {unknown[]} */
const approval = [];
for await (const decision of s.events({ kind: "ApprovalDecided" })) approval.push(decision.event.ApprovalDecided);
seen.approval = approval;
if (!(await s.verify()).ok) throw new Error("the chain does not verify");

// A streamed reply's text, piece by piece, while its turn runs: the stream
// is open before the message is sent.
const deltas = await s.deltas().open();
const streamed = await s.send("Say it in pieces", { wait: true });
const answer = streamed.answer ?? "";
/** @type {Delta[]} */
const got = [];
let text = "";
for await (const piece of deltas) {
  got.push(piece);
  text += piece.text;
  if (Buffer.byteLength(text) >= Buffer.byteLength(answer)) break;
}
seen.streamed_answer = answer;
seen.deltas = got.map((d) => ({ seq: d.seq, offset: d.offset, text: d.text }));

// What the daemon reads out of the session.
const plan = await s.replay();
const next = /** @type {{ messages: { role: string }[] }} */ (await s.nextRequest());
seen.reads = {
  replay_events: plan.events,
  tools: (plan.tools ?? []).map((t) => [t.name, t.effect]),
  next_request_roles: next.messages.map((message) => message.role),
  cache_misses: (await s.cache()).misses.length,
};

// A fork, compared, then erased (the daemon has a master key).
const fork = await s.fork(2);
const forked = await fork.get();
seen.fork = { id: fork.id, forked_from: forked.forked_from, events: forked.events };
const compared = await s.diff(fork);
seen.diff = { common: compared.common_events, answer: compared.a.answer, fork_events: compared.b.events };
const erased = await fork.erase({ reason: "a client test" });
seen.erased = { status: erased.status, erased: erased.erased };

// The daemon's errors, each as one MnemeError.
seen.errors = {
  unknown_session: await errorOf(() => m.session(MISSING).get()),
  wrong_token: await errorOf(() => new Mneme({ baseUrl: url, token: "wrong-token-0123456789" }).sessions()),
  approve_again: await errorOf(() => s.approve(call, { editArgs: { n: 3 } })),
  pause_idle: await errorOf(() => s.pause()),
  erased_fork: await errorOf(() => fork.send("hello again")),
  unreachable: await errorOf(() => new Mneme({ baseUrl: closed, token }).health()),
  deny_decided: await errorOf(() => s.deny(call)),
  resolve_not_in_doubt: await errorOf(() => s.resolve(call, { retry: true })),
  wake_awake: await errorOf(() => s.wake("payment-settled", { id: 1 })),
};
seen.listed = (await m.sessions({ agent: "billing" })).map((row) => row.session);

// Nothing left to do: a resume answers at once; a cancel ends it.
const resumed = await s.resume({ wait: true });
seen.resumed = { status: resumed.status, answer: resumed.answer };
seen.cancelled = (await s.cancel()).status;
seen.status_at_end = (await s.get()).status;
console.log("RESULT " + JSON.stringify(seen));
process.exit(0);

