/**
 * Server-Sent Events, read as the WHATWG specification reads them, with
 * bounds: a line longer than `maxLineBytes` or an event whose data exceeds
 * `maxEventBytes` is refused (`SseError`) rather than buffered without end.
 */
/** A stream that is not Server-Sent Events within the bounds. */
export class SseError extends Error {
    constructor(message) {
        super(message);
        this.name = "SseError";
    }
}
const CR = 0x0d;
const LF = 0x0a;
/** Turns the bytes of one connection into events, as they arrive. */
export class SseParser {
    maxLineBytes;
    maxEventBytes;
    lastId = null;
    retryMs = null;
    buffer = new Uint8Array(0);
    length = 0;
    skipLf = false;
    eventName = "";
    data = [];
    dataBytes = 0;
    decoder = new TextDecoder("utf-8");
    constructor(maxLineBytes, maxEventBytes) {
        this.maxLineBytes = maxLineBytes;
        this.maxEventBytes = maxEventBytes;
    }
    /** The events `chunk` completes. */
    feed(chunk) {
        const out = [];
        // Bytes before `scanned` had no line's end: not searched again (a long
        // line arriving in many chunks costs its length, not its square).
        const scanned = this.length;
        this.append(chunk);
        const buffer = this.buffer;
        const length = this.length;
        let start = 0;
        while (start < length) {
            if (this.skipLf) {
                this.skipLf = false;
                if (buffer[start] === LF) {
                    start += 1; // the LF of a CRLF split across chunks
                    continue;
                }
            }
            let end = Math.max(start, scanned);
            while (end < length && buffer[end] !== CR && buffer[end] !== LF)
                end += 1;
            if (end === length)
                break;
            const line = buffer.subarray(start, end);
            if (buffer[end] === CR) {
                if (end + 1 < length) {
                    start = buffer[end + 1] === LF ? end + 2 : end + 1;
                }
                else {
                    start = end + 1;
                    this.skipLf = true;
                }
            }
            else {
                start = end + 1;
            }
            if (line.length > this.maxLineBytes) {
                throw new SseError(`a line of ${line.length} bytes, over the bound of ${this.maxLineBytes}`);
            }
            const event = this.line(this.decoder.decode(line));
            if (event !== null)
                out.push(event);
        }
        buffer.copyWithin(0, start, length);
        this.length = length - start;
        if (this.length > this.maxLineBytes) {
            throw new SseError(`a line of more than ${this.maxLineBytes} bytes (the bound) without its end`);
        }
        return out;
    }
    append(chunk) {
        const needed = this.length + chunk.length;
        if (needed > this.buffer.length) {
            const grown = new Uint8Array(Math.max(needed, this.buffer.length * 2, 4096));
            grown.set(this.buffer.subarray(0, this.length), 0);
            this.buffer = grown;
        }
        this.buffer.set(chunk, this.length);
        this.length = needed;
    }
    line(line) {
        if (line === "")
            return this.dispatch();
        if (line.startsWith(":"))
            return null; // a comment (the daemon's keep-alives)
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" "))
            value = value.slice(1);
        switch (field) {
            case "event":
                this.eventName = value;
                break;
            case "data":
                this.dataBytes += value.length + 1;
                if (this.dataBytes > this.maxEventBytes) {
                    throw new SseError(`an event of more than ${this.maxEventBytes} bytes (the bound)`);
                }
                this.data.push(value);
                break;
            case "id":
                if (!value.includes("\0"))
                    this.lastId = value;
                break;
            case "retry":
                if (/^[0-9]+$/.test(value))
                    this.retryMs = Number(value);
                break;
        }
        return null;
    }
    dispatch() {
        const event = this.eventName;
        const data = this.data;
        this.eventName = "";
        this.data = [];
        this.dataBytes = 0;
        if (data.length === 0)
            return null;
        return { event: event || "message", data: data.join("\n"), id: this.lastId };
    }
}
