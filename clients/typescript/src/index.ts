/**
 * A client of the mneme daemon's HTTP API (`mneme serve`), on `fetch`, with
 * no dependencies (Node 18+, or a browser).
 *
 *     import { Mneme } from "@mneme/client";
 *     const m = new Mneme({ baseUrl: "http://127.0.0.1:7878", token });
 *     const s = await m.createSession({ agent: "billing" });
 *     const out = await s.send("Charge ada 4200 cents", { wait: true });
 *     for await (const e of s.events({ follow: true })) { ... }
 *
 * Every failure is a `MnemeError` carrying the daemon's message and the HTTP
 * status. The types of what the daemon takes and answers are generated from
 * its OpenAPI document (`schema.ts`).
 */

import type { components, paths } from "./schema.js";
import { SseError, SseParser, type SseEvent } from "./sse.js";

export type { components, paths } from "./schema.js";
export { SseError } from "./sse.js";

type Schemas = components["schemas"];
export type ApiError = Schemas["ApiError"];
export type AwaitingCall = Schemas["AwaitingCall"];
export type CacheReport = Schemas["CacheReport"];
export type Cancelled = Schemas["Cancelled"];
export type Decided = Schemas["Decided"];
export type Erased = Schemas["Erased"];
export type EventRecord = Schemas["EventRecord"];
export type Forked = Schemas["Forked"];
export type Health = Schemas["Health"];
export type InDoubtCall = Schemas["InDoubtCall"];
export type MessageAccepted = Schemas["MessageAccepted"];
export type PauseRequested = Schemas["PauseRequested"];
export type ReplayView = Schemas["ReplayView"];
export type RerunReport = Schemas["RerunReport"];
export type Resuming = Schemas["Resuming"];
export type SessionDiff = Schemas["SessionDiff"];
export type SessionStatus = Schemas["SessionStatus"];
export type SessionSummary = Schemas["SessionSummary"];
export type SessionView = Schemas["SessionView"];
export type TurnOutcome = Schemas["TurnOutcome"];
export type Verified = Schemas["Verified"];
export type WaitingCall = Schemas["WaitingCall"];
export type Woke = Schemas["Woke"];

/** Where `mneme serve` listens unless told otherwise. */
export const DEFAULT_URL = "http://127.0.0.1:7878";

/** Milliseconds a stream may be silent before it is taken for broken and
 * reopened (the daemon sends a keep-alive every 15 s). */
export const STREAM_IDLE_MS = 45_000;

const MAX_ERROR_BYTES = 4096;

/**
 * What went wrong talking to the daemon. `status` is the HTTP status the
 * daemon answered (404, 409, ...), or `null` when no answer came (the daemon
 * could not be reached, the connection broke, a stream could not be
 * reopened in time). `message` is the daemon's own reason (its
 * `{"error": REASON}`) or, without an answer, what happened.
 */
export class MnemeError extends Error {
  constructor(
    readonly status: number | null,
    message: string,
    readonly method: string = "",
    readonly path: string = "",
  ) {
    super(message);
    this.name = "MnemeError";
  }

  /** The request, the status and the message, on one line. */
  override toString(): string {
    const asked = `${this.method} ${this.path}`.trim();
    const said = this.status === null ? "no answer" : String(this.status);
    return asked ? `MnemeError: ${asked}: ${said}: ${this.message}` : `MnemeError: ${said}: ${this.message}`;
  }
}

export interface MnemeOptions {
  /** The daemon, e.g. `http://127.0.0.1:7878` (the default). */
  baseUrl?: string;
  /** The bearer token (default: `$MNEME_TOKEN` where there is a `process`). */
  token?: string;
  /** Who decides what this client decides, unless a call names someone else (default `api`). */
  by?: string;
  /** How long a request may wait for its answer, except those that wait for a turn (default 60 s). */
  timeoutMs?: number;
  /** How long a broken stream is reopened for before it gives up (default 30 s). */
  reconnectForMs?: number;
  /** The largest event a stream takes (default 64 MiB). */
  maxEventBytes?: number;
}

/** How to create a session: exactly one of `agent`, `agentToml`, `spec`. */
export type CreateSession =
  | { agent: string; firstMessage?: string }
  | { agentToml: string }
  | { spec: Record<string, unknown>; firstMessage?: string };

type Method = "get" | "post" | "delete";
/** The methods `paths[P]` documents. */
type MethodsOf<P extends keyof paths> = {
  [M in Method]: paths[P][M] extends { responses: unknown } ? M : never;
}[Method];
/** The JSON body an operation takes. */
type JsonBody<O> = O extends { requestBody?: { content: { "application/json": infer B } } } ? B : never;

interface ApiRequest {
  method: Method;
  path: string;
  json?: unknown;
  toml?: string;
  query?: Record<string, string | number | boolean | undefined>;
  waits?: boolean;
}

function envToken(): string | undefined {
  const process = (globalThis as { process?: { env?: Record<string, string | undefined> } }).process;
  return process?.env?.MNEME_TOKEN;
}

/** A client of one mneme daemon. */
export class Mneme {
  readonly baseUrl: string;
  readonly by: string;
  readonly timeoutMs: number;
  readonly reconnectForMs: number;
  readonly maxEventBytes: number;
  private readonly token: string | undefined;

  constructor(options: MnemeOptions = {}) {
    this.baseUrl = (options.baseUrl ?? DEFAULT_URL).replace(/\/+$/, "");
    this.token = options.token ?? envToken();
    this.by = options.by ?? "api";
    this.timeoutMs = options.timeoutMs ?? 60_000;
    this.reconnectForMs = options.reconnectForMs ?? 30_000;
    this.maxEventBytes = options.maxEventBytes ?? 64 << 20;
  }

  /** An operation of the document: its path (with `{name}`s filled from
   * `params`), and the JSON body it takes. */
  route<P extends keyof paths, M extends MethodsOf<P>>(
    method: M,
    path: P,
    params: Record<string, string>,
    body?: JsonBody<paths[P][M]>,
  ): ApiRequest {
    const filled = String(path).replace(/\{(\w+)\}/g, (_, name: string) => {
      const value = params[name];
      if (value === undefined) throw new TypeError(`${String(path)}: no value for {${name}}`);
      return encodeURIComponent(value);
    });
    return { method, path: filled, json: body };
  }

  /** Sends `request`; the answer's status and body (JSON, or bytes with `raw`). */
  async call(request: ApiRequest, raw = false): Promise<{ status: number; body: unknown }> {
    const method = request.method.toUpperCase();
    const headers: Record<string, string> = {};
    if (this.token) headers.authorization = `Bearer ${this.token}`;
    let body: string | undefined;
    if (request.toml !== undefined) {
      headers["content-type"] = "application/toml";
      body = request.toml;
    } else if (request.json !== undefined) {
      headers["content-type"] = "application/json";
      body = JSON.stringify(request.json);
    }
    const signal = request.waits ? undefined : AbortSignal.timeout(this.timeoutMs);
    let response: Response;
    try {
      response = await fetch(this.url(request.path, request.query), { method, headers, body, signal });
    } catch (e) {
      throw new MnemeError(null, `${this.baseUrl}: ${describe(e)}`, method, request.path);
    }
    if (response.status >= 400) throw await errorOf(response, method, request.path);
    try {
      if (raw) return { status: response.status, body: new Uint8Array(await response.arrayBuffer()) };
      return { status: response.status, body: await response.json() };
    } catch (e) {
      throw new MnemeError(response.status, `an answer the client does not understand: ${describe(e)}`, method, request.path);
    }
  }

  /** `baseUrl` + `path` + the query's defined values. */
  url(path: string, query?: Record<string, string | number | boolean | undefined>): string {
    const url = new URL(this.baseUrl + path);
    for (const [name, value] of Object.entries(query ?? {})) {
      if (value !== undefined) url.searchParams.set(name, String(value));
    }
    return url.toString();
  }

  /** Headers of a stream's request. */
  streamHeaders(lastEventId: string | null): Record<string, string> {
    const headers: Record<string, string> = { accept: "text/event-stream", "cache-control": "no-cache" };
    if (this.token) headers.authorization = `Bearer ${this.token}`;
    if (lastEventId !== null) headers["last-event-id"] = lastEventId;
    return headers;
  }

  /** Liveness (no token needed). */
  async health(): Promise<Health> {
    return (await this.call(this.route("get", "/health", {}))).body as Health;
  }

  /** The sessions, with status and usage; only those of `status` or `agent` if given. */
  async sessions(filter: { status?: SessionStatus; agent?: string } = {}): Promise<SessionSummary[]> {
    const request = { ...this.route("get", "/sessions", {}), query: filter };
    return (await this.call(request)).body as SessionSummary[];
  }

  /**
   * A new session of exactly one of: `agent` (a file `NAME.toml` in the
   * daemon's `--agents` directory), `agentToml` (an agent file's text) or
   * `spec` (an agent spec, as the file's TOML reads as JSON).
   * `firstMessage` is recorded with the start; its turn runs on `resume()`.
   */
  async createSession(how: CreateSession): Promise<Session> {
    const given = (["agent", "agentToml", "spec"] as const).filter((k) => k in how && (how as Record<string, unknown>)[k] !== undefined);
    if (given.length !== 1) {
      throw new TypeError(
        "createSession takes exactly one of agent (a NAME.toml in the daemon's --agents directory), " +
          `agentToml (an agent file's text) or spec (an agent spec as an object); given: ${given.join(", ") || "none"}`,
      );
    }
    let request: ApiRequest;
    if ("agentToml" in how) {
      if ("firstMessage" in how) throw new TypeError("firstMessage goes with agent or spec: an agent file sent as TOML carries no message");
      request = { method: "post", path: "/sessions", toml: how.agentToml };
    } else {
      const body: JsonBody<paths["/sessions"]["post"]> =
        "agent" in how ? { agent: how.agent, first_message: how.firstMessage } : { spec: how.spec, first_message: how.firstMessage };
      request = this.route("post", "/sessions", {}, body);
    }
    const created = (await this.call(request)).body as Schemas["Created"];
    return new Session(this, created.session);
  }

  /** The session `id` (no request is made until a method is called). */
  session(id: string): Session {
    return new Session(this, id);
  }
}

/** A decision's options. */
export interface DecisionOptions {
  /** Who decides (recorded; default: the client's `by`). */
  by?: string;
  /** Answer when the continued turn ends. */
  wait?: boolean;
  /** Continue the session after recording the decision (default true). */
  proceed?: boolean;
}

/** One session of a daemon. */
export class Session {
  constructor(
    readonly client: Mneme,
    readonly id: string,
  ) {}

  private get at(): Record<string, string> {
    return { id: this.id };
  }

  /** Status, usage, answer, the calls waiting for a person. */
  async get(): Promise<SessionView> {
    return (await this.client.call(this.client.route("get", "/sessions/{id}", this.at))).body as SessionView;
  }

  /**
   * A user message. Answers once it is durable (`MessageAccepted`), or with
   * `wait` when its turn ends (`TurnOutcome`: answered, waiting for
   * approval, paused, failed, ...).
   */
  send(text: string, options: { wait: true; refreshTools?: boolean }): Promise<TurnOutcome>;
  send(text: string, options?: { wait?: false; refreshTools?: boolean }): Promise<MessageAccepted>;
  async send(text: string, options: { wait?: boolean; refreshTools?: boolean } = {}): Promise<TurnOutcome | MessageAccepted> {
    const wait = options.wait ?? false;
    const body = { text, wait, refresh_tools: options.refreshTools || undefined };
    const request = { ...this.client.route("post", "/sessions/{id}/messages", this.at, body), waits: wait };
    return (await this.client.call(request)).body as TurnOutcome | MessageAccepted;
  }

  /** Continues pending work; `extend` starts a spent budget again. */
  resume(options: { wait: true; extend?: boolean }): Promise<TurnOutcome>;
  resume(options?: { wait?: false; extend?: boolean }): Promise<Resuming>;
  async resume(options: { wait?: boolean; extend?: boolean } = {}): Promise<TurnOutcome | Resuming> {
    const wait = options.wait ?? false;
    const body = { wait, extend: options.extend ?? false };
    const request = { ...this.client.route("post", "/sessions/{id}/resume", this.at, body), waits: wait };
    return (await this.client.call(request)).body as TurnOutcome | Resuming;
  }

  /** Delivers `event` (with `payload`, any JSON) to a sleeping session. */
  wake(event: string, payload: unknown, options: { wait: true }): Promise<TurnOutcome>;
  wake(event: string, payload?: unknown, options?: { wait?: false }): Promise<Woke>;
  async wake(event: string, payload: unknown = {}, options: { wait?: boolean } = {}): Promise<TurnOutcome | Woke> {
    const wait = options.wait ?? false;
    // The payload is any JSON (the document says object): sent as given.
    const body = { event, payload: payload as Record<string, unknown>, wait };
    const request = { ...this.client.route("post", "/sessions/{id}/wake", this.at, body), waits: wait };
    return (await this.client.call(request)).body as TurnOutcome | Woke;
  }

  /**
   * Approves the waiting call `call`; with `editArgs` (any JSON value,
   * usually an object) the tool runs with those arguments instead of the
   * model's, recorded with who gave them. The session then goes on (unless
   * other calls still wait, or `proceed` is false): with `wait`, the answer
   * is the continued turn's end.
   */
  async approve(call: string, options: DecisionOptions & { editArgs?: unknown } = {}): Promise<TurnOutcome | Decided> {
    const args = options.editArgs === undefined ? undefined : JSON.stringify(options.editArgs);
    return this.decide("approve", call, { approved: true, args, ...this.decision(options) });
  }

  /** Denies the waiting call `call`: the model is told. */
  async deny(call: string, options: DecisionOptions = {}): Promise<TurnOutcome | Decided> {
    return this.decide("approve", call, { approved: false, ...this.decision(options) });
  }

  /**
   * Decides on a call in doubt: exactly one of `retry: true`, `skip: RESULT`
   * (recorded as its result, not run) or `fail: MESSAGE`.
   */
  async resolve(
    call: string,
    options: DecisionOptions & { retry?: boolean; skip?: unknown; fail?: string },
  ): Promise<TurnOutcome | Decided> {
    const chosen = [options.retry ? "retry" : "", options.skip !== undefined ? "skip" : "", options.fail !== undefined ? "fail" : ""].filter(Boolean);
    if (chosen.length !== 1) {
      throw new TypeError(
        "resolve takes exactly one of retry: true (run the call again), skip: RESULT (record it as the call's result) " +
          `or fail: MESSAGE (record the call as failed); given: ${chosen.join(", ") || "none"}`,
      );
    }
    const body = {
      retry: options.retry ?? false,
      // Any JSON (the document says object): sent as given.
      skip: options.skip as Record<string, unknown> | undefined,
      fail: options.fail,
      ...this.decision(options),
    };
    return this.decide("resolve", call, body);
  }

  private decision(options: DecisionOptions): { by: string; wait: boolean; continue: boolean } {
    return { by: options.by ?? this.client.by, wait: options.wait ?? false, continue: options.proceed ?? true };
  }

  private async decide(
    kind: "approve" | "resolve",
    call: string,
    body: JsonBody<paths["/sessions/{id}/calls/{call}/approve"]["post"]> | JsonBody<paths["/sessions/{id}/calls/{call}/resolve"]["post"]>,
  ): Promise<TurnOutcome | Decided> {
    const at = { id: this.id, call };
    const route =
      kind === "approve"
        ? this.client.route("post", "/sessions/{id}/calls/{call}/approve", at, body as JsonBody<paths["/sessions/{id}/calls/{call}/approve"]["post"]>)
        : this.client.route("post", "/sessions/{id}/calls/{call}/resolve", at, body as JsonBody<paths["/sessions/{id}/calls/{call}/resolve"]["post"]>);
    const answer = (await this.client.call({ ...route, waits: body.wait ?? false })).body;
    return answer as Schemas["DecisionAnswer"] | Decided;
  }

  /** Pauses the session at its next step (409 when nothing runs it and it does not sleep). */
  async pause(): Promise<PauseRequested> {
    return (await this.client.call(this.client.route("post", "/sessions/{id}/pause", this.at))).body as PauseRequested;
  }

  /** Cancels the session; a new message reopens it. */
  async cancel(options: { by?: string } = {}): Promise<Cancelled> {
    const body = { by: options.by ?? this.client.by };
    return (await this.client.call(this.client.route("post", "/sessions/{id}/cancel", this.at, body))).body as Cancelled;
  }

  /** A new session holding this one's first `at` events (run on `spec` from there, if given). */
  async fork(at: number, options: { spec?: Record<string, unknown> } = {}): Promise<Session> {
    const body = { at, spec: options.spec };
    const forked = (await this.client.call(this.client.route("post", "/sessions/{id}/fork", this.at, body))).body as Forked;
    return new Session(this.client, forked.session);
  }

  /** Re-runs this session's user messages on `spec` in a new session. */
  async rerun(spec: Record<string, unknown>, options: { liveTools?: boolean } = {}): Promise<RerunReport> {
    const body = { spec, live_tools: options.liveTools ?? false };
    const request = { ...this.client.route("post", "/sessions/{id}/rerun", this.at, body), waits: true };
    return (await this.client.call(request)).body as RerunReport;
  }

  /** Erases the session's content for good (and, unless `cascade` is false, that of every session derived from it). Needs a daemon with a master key. */
  async erase(options: { reason: string; by?: string; cascade?: boolean }): Promise<Erased> {
    const body = { reason: options.reason, by: options.by ?? this.client.by, cascade: options.cascade ?? true };
    return (await this.client.call(this.client.route("delete", "/sessions/{id}", this.at, body))).body as Erased;
  }

  /**
   * The session's log (`for await`): the events after `after` (up to
   * `until`), of the kinds in `kind` (comma-separated) if given. With
   * `follow`, an endless stream: history, then each event once durable; it
   * reopens itself when the connection breaks, from the last event it gave.
   */
  events(options: { follow?: boolean; after?: number; until?: number; kind?: string } = {}): EventStream {
    if (options.follow && options.until !== undefined) {
      throw new TypeError("until pages the log; a followed stream has no end");
    }
    const query = { after: options.after, until: options.until, kind: options.kind, follow: options.follow || undefined };
    const path = this.client.route("get", "/sessions/{id}/events", this.at).path;
    return new EventStream(this.client, path, query, null, options.follow ?? false);
  }

  /**
   * The text of the session's streamed replies (`stream = true`) as it
   * arrives, each piece a `Delta`; from `lastEventId` (a `Delta.id`) if
   * given. Endless: it reopens itself when the connection breaks, with no
   * gap and no repeat.
   */
  deltas(options: { lastEventId?: string } = {}): DeltaStream {
    const path = this.client.route("get", "/sessions/{id}/deltas", this.at).path;
    return new DeltaStream(this.client, path, {}, options.lastEventId ?? null, true);
  }

  /** Checks the session's hash chain. */
  async verify(): Promise<Verified> {
    return (await this.client.call(this.client.route("get", "/sessions/{id}/verify", this.at))).body as Verified;
  }

  /** Dry run: the rebuilt next request and the resume plan. */
  async replay(): Promise<ReplayView> {
    return (await this.client.call(this.client.route("get", "/sessions/{id}/replay", this.at))).body as ReplayView;
  }

  /** The session's next model request, as it would be sent. */
  async nextRequest(): Promise<unknown> {
    return (await this.client.call(this.client.route("get", "/sessions/{id}/request", this.at))).body;
  }

  /** The session's prefix-cache misses and their causes. */
  async cache(): Promise<CacheReport> {
    return (await this.client.call(this.client.route("get", "/sessions/{id}/cache", this.at))).body as CacheReport;
  }

  /** This session compared with `other` (its fork, say). */
  async diff(other: string | Session): Promise<SessionDiff> {
    const at = { id: this.id, other: typeof other === "string" ? other : other.id };
    return (await this.client.call(this.client.route("get", "/sessions/{id}/diff/{other}", at))).body as SessionDiff;
  }

  /** Binary content a tool returned by reference, by its SHA-256. */
  async blob(digest: string): Promise<Uint8Array> {
    const request = this.client.route("get", "/sessions/{id}/blobs/{digest}", { id: this.id, digest });
    return (await this.client.call(request, true)).body as Uint8Array;
  }
}

/** A piece of a streamed reply's text. */
export interface Delta {
  /** The seq the reply is expected at (where its `ModelReplied` lands). */
  seq: number;
  /** How many bytes (UTF-8) of the reply's text this piece reaches. */
  offset: number;
  /** The piece. */
  text: string;
  /** The frame's id, `SEQ:OFFSET`: give it as `lastEventId` to go on from here. */
  id: string;
}

const RETRYABLE = new Set([502, 503, 504]);
const RECONNECT = Symbol("reconnect");

/**
 * A resumable Server-Sent Events stream. Iterate it with `for await`;
 * breaking out closes its connection, and iterating again goes on after the
 * last item given. `close()` ends it for good.
 */
abstract class Stream<T> implements AsyncIterable<T> {
  /** Where the stream is (the last item's id): sent as `Last-Event-ID` when it reopens. */
  lastEventId: string | null;
  /** How many times the stream was reopened after it broke. */
  reconnects = 0;
  private closed = false;
  private opened = false;
  private controller: AbortController | null = null;
  private ready: Response | null = null;

  constructor(
    protected readonly client: Mneme,
    protected readonly path: string,
    private readonly query: Record<string, string | number | boolean | undefined>,
    lastEventId: string | null,
    private readonly follows: boolean,
  ) {
    this.lastEventId = lastEventId;
  }

  /** What an event becomes: an item, nothing, or a reconnection. */
  protected abstract take(event: SseEvent): T | null | typeof RECONNECT;

  /** A page of the log as one JSON array (a stream that does not follow). */
  protected page(_body: unknown): T[] {
    return [];
  }

  /** Opens the stream's connection now rather than on the first read:
   * once this resolves, the daemon holds the subscription, so nothing from
   * here on is missed (open the deltas before sending the message whose
   * reply they are). */
  async open(): Promise<this> {
    if (this.follows && this.ready === null && !this.closed) this.ready = await this.connect(null, null);
    return this;
  }

  /** Ends the stream for good. */
  close(): void {
    this.closed = true;
    this.controller?.abort();
    this.ready = null;
  }

  [Symbol.asyncIterator](): AsyncIterator<T> {
    return this.follows ? this.follow() : this.once();
  }

  private async *once(): AsyncGenerator<T> {
    const request: ApiRequest = { method: "get", path: this.path, query: this.query };
    yield* this.page((await this.client.call(request)).body);
  }

  private async *follow(): AsyncGenerator<T> {
    let brokenSince: number | null = null;
    let parser: SseParser | null = null;
    while (!this.closed) {
      const response = this.ready ?? (await this.connect(brokenSince, parser?.retryMs ?? null));
      this.ready = null;
      if (response === null) return; // closed while it waited to reconnect
      brokenSince = null;
      parser = new SseParser(this.client.maxEventBytes, this.client.maxEventBytes);
      const reader = (response.body as ReadableStream<Uint8Array>).getReader();
      let reconnect = false;
      try {
        while (!reconnect) {
          const chunk = await this.read(reader);
          if (chunk === null) break; // the daemon went (or the network): reopen
          let events: SseEvent[];
          try {
            events = parser.feed(chunk);
          } catch (e) {
            if (e instanceof SseError) {
              this.closed = true;
              throw new MnemeError(null, `the stream is not Server-Sent Events within bounds: ${e.message}`, "GET", this.path);
            }
            throw e;
          }
          for (const event of events) {
            const item = this.take(event);
            if (item === RECONNECT) {
              reconnect = true; // pieces were dropped for this slow reader: reopen from where it is
              break;
            }
            if (item !== null) yield item;
          }
        }
      } finally {
        this.controller?.abort();
        this.controller = null;
      }
      brokenSince = Date.now();
    }
  }

  /** The next chunk, or null when the connection ended, broke or went silent. */
  private async read(reader: ReadableStreamDefaultReader<Uint8Array>): Promise<Uint8Array | null> {
    let timer: ReturnType<typeof setTimeout> | undefined;
    const silent = new Promise<null>((resolve) => {
      timer = setTimeout(() => resolve(null), STREAM_IDLE_MS);
    });
    try {
      const next = await Promise.race([reader.read(), silent]);
      if (next === null || next.done) return null;
      return next.value;
    } catch {
      return null;
    } finally {
      clearTimeout(timer);
    }
  }

  /** Opens (or reopens) the stream: the first time, failing at once;
   * after a break, retrying for up to `reconnectForMs`. */
  private async connect(brokenSince: number | null, retryMs: number | null): Promise<Response | null> {
    let failures = 0;
    for (;;) {
      if (this.closed) return null;
      const controller = new AbortController();
      let error: MnemeError;
      try {
        const url = this.client.url(this.path, this.query);
        const response = await fetch(url, { headers: this.client.streamHeaders(this.lastEventId), signal: controller.signal });
        if (response.status < 400 && response.body) {
          if (this.opened) this.reconnects += 1;
          this.opened = true;
          this.controller = controller;
          return response;
        }
        error = await errorOf(response, "GET", this.path);
      } catch (e) {
        error = new MnemeError(null, `${this.client.baseUrl}: ${describe(e)}`, "GET", this.path);
      }
      if (!this.opened || (error.status !== null && !RETRYABLE.has(error.status))) {
        this.closed = true;
        throw error;
      }
      const now = Date.now();
      brokenSince ??= now;
      const left = brokenSince + this.client.reconnectForMs - now;
      if (left <= 0) {
        this.closed = true;
        throw new MnemeError(
          null,
          `the stream broke and could not be reopened within ${this.client.reconnectForMs / 1000} s: ${error.message}`,
          "GET",
          this.path,
        );
      }
      failures += 1;
      const backoff = retryMs ?? Math.min(50 * 2 ** Math.min(failures, 6), 2000);
      await new Promise((resolve) => setTimeout(resolve, Math.min(backoff, left)));
    }
  }
}

/** A session's events as they become durable (`EventRecord`s). */
export class EventStream extends Stream<EventRecord> {
  protected take(event: SseEvent): EventRecord {
    let record: EventRecord;
    try {
      record = JSON.parse(event.data) as EventRecord;
    } catch (e) {
      throw new MnemeError(200, `an event the client does not understand: ${describe(e)}`, "GET", this.path);
    }
    this.lastEventId = String(record.seq);
    return record;
  }

  protected override page(body: unknown): EventRecord[] {
    if (!Array.isArray(body)) throw new MnemeError(200, "an answer the client does not understand: expected an array", "GET", this.path);
    return body as EventRecord[];
  }
}

/** A session's streamed reply text as it arrives (`Delta`s). */
export class DeltaStream extends Stream<Delta> {
  protected take(event: SseEvent): Delta | null | typeof RECONNECT {
    if (event.event === "lagged") return RECONNECT;
    if (event.event !== "delta") return null;
    const [seq, offset] = (event.id ?? "").split(":");
    let text: unknown;
    try {
      text = (JSON.parse(event.data) as { text?: unknown }).text;
    } catch {
      text = undefined;
    }
    if (typeof text !== "string" || !/^[0-9]+$/.test(seq ?? "") || !/^[0-9]+$/.test(offset ?? "")) {
      throw new MnemeError(200, `a delta the client does not understand: ${event.data.slice(0, 200)}`, "GET", this.path);
    }
    const delta = { seq: Number(seq), offset: Number(offset), text, id: `${seq}:${offset}` };
    this.lastEventId = delta.id;
    return delta;
  }
}

/** The daemon's `{"error": REASON}` (or whatever came instead) as an error. */
async function errorOf(response: Response, method: string, path: string): Promise<MnemeError> {
  let text = "";
  try {
    text = await response.text();
  } catch {
    // no body
  }
  let message = "";
  try {
    const body = JSON.parse(text) as Partial<ApiError>;
    if (typeof body.error === "string") message = body.error;
  } catch {
    // not JSON
  }
  if (!message) message = text.slice(0, MAX_ERROR_BYTES).trim() || response.statusText || "error";
  return new MnemeError(response.status, message, method, path);
}

function describe(e: unknown): string {
  if (e instanceof Error) {
    const cause = (e as { cause?: unknown }).cause;
    return cause instanceof Error ? `${e.message} (${cause.message})` : e.message;
  }
  return String(e);
}
