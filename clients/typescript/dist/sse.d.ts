/**
 * Server-Sent Events, read as the WHATWG specification reads them, with
 * bounds: a line longer than `maxLineBytes` or an event whose data exceeds
 * `maxEventBytes` is refused (`SseError`) rather than buffered without end.
 */
/** A stream that is not Server-Sent Events within the bounds. */
export declare class SseError extends Error {
    constructor(message: string);
}
/** One dispatched event. */
export interface SseEvent {
    /** Its name (`message` when the stream gave none). */
    event: string;
    /** Its data lines, joined with newlines. */
    data: string;
    /** The stream's last event id as of this event. */
    id: string | null;
}
/** Turns the bytes of one connection into events, as they arrive. */
export declare class SseParser {
    readonly maxLineBytes: number;
    readonly maxEventBytes: number;
    lastId: string | null;
    retryMs: number | null;
    private buffer;
    private length;
    private skipLf;
    private eventName;
    private data;
    private dataBytes;
    private readonly decoder;
    constructor(maxLineBytes: number, maxEventBytes: number);
    /** The events `chunk` completes. */
    feed(chunk: Uint8Array): SseEvent[];
    private append;
    private line;
    private dispatch;
}
