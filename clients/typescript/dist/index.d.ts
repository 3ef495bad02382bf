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
import { type SseEvent } from "./sse.js";
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
export declare const DEFAULT_URL = "http://127.0.0.1:7878";
/** Milliseconds a stream may be silent before it is taken for broken and
 * reopened (the daemon sends a keep-alive every 15 s). */
export declare const STREAM_IDLE_MS = 45000;
/**
 * What went wrong talking to the daemon. `status` is the HTTP status the
 * daemon answered (404, 409, ...), or `null` when no answer came (the daemon
 * could not be reached, the connection broke, a stream could not be
 * reopened in time). `message` is the daemon's own reason (its
 * `{"error": REASON}`) or, without an answer, what happened.
 */
export declare class MnemeError extends Error {
    readonly status: number | null;
    readonly method: string;
    readonly path: string;
    constructor(status: number | null, message: string, method?: string, path?: string);
    /** The request, the status and the message, on one line. */
    toString(): string;
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
export type CreateSession = {
    agent: string;
    firstMessage?: string;
} | {
    agentToml: string;
} | {
    spec: Record<string, unknown>;
    firstMessage?: string;
};
type Method = "get" | "post" | "delete";
/** The methods `paths[P]` documents. */
type MethodsOf<P extends keyof paths> = {
    [M in Method]: paths[P][M] extends {
        responses: unknown;
    } ? M : never;
}[Method];
/** The JSON body an operation takes. */
type JsonBody<O> = O extends {
    requestBody?: {
        content: {
            "application/json": infer B;
        };
    };
} ? B : never;
interface ApiRequest {
    method: Method;
    path: string;
    json?: unknown;
    toml?: string;
    query?: Record<string, string | number | boolean | undefined>;
    waits?: boolean;
}
/** A client of one mneme daemon. */
export declare class Mneme {
    readonly baseUrl: string;
    readonly by: string;
    readonly timeoutMs: number;
    readonly reconnectForMs: number;
    readonly maxEventBytes: number;
    private readonly token;
    constructor(options?: MnemeOptions);
    /** An operation of the document: its path (with `{name}`s filled from
     * `params`), and the JSON body it takes. */
    route<P extends keyof paths, M extends MethodsOf<P>>(method: M, path: P, params: Record<string, string>, body?: JsonBody<paths[P][M]>): ApiRequest;
    /** Sends `request`; the answer's status and body (JSON, or bytes with `raw`). */
    call(request: ApiRequest, raw?: boolean): Promise<{
        status: number;
        body: unknown;
    }>;
    /** `baseUrl` + `path` + the query's defined values. */
    url(path: string, query?: Record<string, string | number | boolean | undefined>): string;
    /** Headers of a stream's request. */
    streamHeaders(lastEventId: string | null): Record<string, string>;
    /** Liveness (no token needed). */
    health(): Promise<Health>;
    /** The sessions, with status and usage; only those of `status` or `agent` if given. */
    sessions(filter?: {
        status?: SessionStatus;
        agent?: string;
    }): Promise<SessionSummary[]>;
    /**
     * A new session of exactly one of: `agent` (a file `NAME.toml` in the
     * daemon's `--agents` directory), `agentToml` (an agent file's text) or
     * `spec` (an agent spec, as the file's TOML reads as JSON).
     * `firstMessage` is recorded with the start; its turn runs on `resume()`.
     */
    createSession(how: CreateSession): Promise<Session>;
    /** The session `id` (no request is made until a method is called). */
    session(id: string): Session;
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
export declare class Session {
    readonly client: Mneme;
    readonly id: string;
    constructor(client: Mneme, id: string);
    private get at();
    /** Status, usage, answer, the calls waiting for a person. */
    get(): Promise<SessionView>;
    /**
     * A user message. Answers once it is durable (`MessageAccepted`), or with
     * `wait` when its turn ends (`TurnOutcome`: answered, waiting for
     * approval, paused, failed, ...).
     */
    send(text: string, options: {
        wait: true;
        refreshTools?: boolean;
    }): Promise<TurnOutcome>;
    send(text: string, options?: {
        wait?: false;
        refreshTools?: boolean;
    }): Promise<MessageAccepted>;
    /** Continues pending work; `extend` starts a spent budget again. */
    resume(options: {
        wait: true;
        extend?: boolean;
    }): Promise<TurnOutcome>;
    resume(options?: {
        wait?: false;
        extend?: boolean;
    }): Promise<Resuming>;
    /** Delivers `event` (with `payload`, any JSON) to a sleeping session. */
    wake(event: string, payload: unknown, options: {
        wait: true;
    }): Promise<TurnOutcome>;
    wake(event: string, payload?: unknown, options?: {
        wait?: false;
    }): Promise<Woke>;
    /**
     * Approves the waiting call `call`; with `editArgs` (any JSON value,
     * usually an object) the tool runs with those arguments instead of the
     * model's, recorded with who gave them. The session then goes on (unless
     * other calls still wait, or `proceed` is false): with `wait`, the answer
     * is the continued turn's end.
     */
    approve(call: string, options?: DecisionOptions & {
        editArgs?: unknown;
    }): Promise<TurnOutcome | Decided>;
    /** Denies the waiting call `call`: the model is told. */
    deny(call: string, options?: DecisionOptions): Promise<TurnOutcome | Decided>;
    /**
     * Decides on a call in doubt: exactly one of `retry: true`, `skip: RESULT`
     * (recorded as its result, not run) or `fail: MESSAGE`.
     */
    resolve(call: string, options: DecisionOptions & {
        retry?: boolean;
        skip?: unknown;
        fail?: string;
    }): Promise<TurnOutcome | Decided>;
    private decision;
    private decide;
    /** Pauses the session at its next step (409 when nothing runs it and it does not sleep). */
    pause(): Promise<PauseRequested>;
    /** Cancels the session; a new message reopens it. */
    cancel(options?: {
        by?: string;
    }): Promise<Cancelled>;
    /** A new session holding this one's first `at` events (run on `spec` from there, if given). */
    fork(at: number, options?: {
        spec?: Record<string, unknown>;
    }): Promise<Session>;
    /** Re-runs this session's user messages on `spec` in a new session. */
    rerun(spec: Record<string, unknown>, options?: {
        liveTools?: boolean;
    }): Promise<RerunReport>;
    /** Erases the session's content for good (and, unless `cascade` is false, that of every session derived from it). Needs a daemon with a master key. */
    erase(options: {
        reason: string;
        by?: string;
        cascade?: boolean;
    }): Promise<Erased>;
    /**
     * The session's log (`for await`): the events after `after` (up to
     * `until`), of the kinds in `kind` (comma-separated) if given. With
     * `follow`, an endless stream: history, then each event once durable; it
     * reopens itself when the connection breaks, from the last event it gave.
     */
    events(options?: {
        follow?: boolean;
        after?: number;
        until?: number;
        kind?: string;
    }): EventStream;
    /**
     * The text of the session's streamed replies (`stream = true`) as it
     * arrives, each piece a `Delta`; from `lastEventId` (a `Delta.id`) if
     * given. Endless: it reopens itself when the connection breaks, with no
     * gap and no repeat.
     */
    deltas(options?: {
        lastEventId?: string;
    }): DeltaStream;
    /** Checks the session's hash chain. */
    verify(): Promise<Verified>;
    /** Dry run: the rebuilt next request and the resume plan. */
    replay(): Promise<ReplayView>;
    /** The session's next model request, as it would be sent. */
    nextRequest(): Promise<unknown>;
    /** The session's prefix-cache misses and their causes. */
    cache(): Promise<CacheReport>;
    /** This session compared with `other` (its fork, say). */
    diff(other: string | Session): Promise<SessionDiff>;
    /** Binary content a tool returned by reference, by its SHA-256. */
    blob(digest: string): Promise<Uint8Array>;
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
declare const RECONNECT: unique symbol;
/**
 * A resumable Server-Sent Events stream. Iterate it with `for await`;
 * breaking out closes its connection, and iterating again goes on after the
 * last item given. `close()` ends it for good.
 */
declare abstract class Stream<T> implements AsyncIterable<T> {
    protected readonly client: Mneme;
    protected readonly path: string;
    private readonly query;
    private readonly follows;
    /** Where the stream is (the last item's id): sent as `Last-Event-ID` when it reopens. */
    lastEventId: string | null;
    /** How many times the stream was reopened after it broke. */
    reconnects: number;
    private closed;
    private opened;
    private controller;
    private ready;
    constructor(client: Mneme, path: string, query: Record<string, string | number | boolean | undefined>, lastEventId: string | null, follows: boolean);
    /** What an event becomes: an item, nothing, or a reconnection. */
    protected abstract take(event: SseEvent): T | null | typeof RECONNECT;
    /** A page of the log as one JSON array (a stream that does not follow). */
    protected page(_body: unknown): T[];
    /** Opens the stream's connection now rather than on the first read:
     * once this resolves, the daemon holds the subscription, so nothing from
     * here on is missed (open the deltas before sending the message whose
     * reply they are). */
    open(): Promise<this>;
    /** Ends the stream for good. */
    close(): void;
    [Symbol.asyncIterator](): AsyncIterator<T>;
    private once;
    private follow;
    /** The next chunk, or null when the connection ended, broke or went silent. */
    private read;
    /** Opens (or reopens) the stream: the first time, failing at once;
     * after a break, retrying for up to `reconnectForMs`. */
    private connect;
}
/** A session's events as they become durable (`EventRecord`s). */
export declare class EventStream extends Stream<EventRecord> {
    protected take(event: SseEvent): EventRecord;
    protected page(body: unknown): EventRecord[];
}
/** A session's streamed reply text as it arrives (`Delta`s). */
export declare class DeltaStream extends Stream<Delta> {
    protected take(event: SseEvent): Delta | null | typeof RECONNECT;
}
