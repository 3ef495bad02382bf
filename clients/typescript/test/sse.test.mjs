// @ts-check
// The Server-Sent Events parser: the specification's framing, however the
// bytes are split, and its bounds (run by cli/tests/clients.rs with
// `node --test`).

import assert from "node:assert/strict";
import { test } from "node:test";
import { SseError, SseParser } from "../dist/sse.js";

const STREAM = new TextEncoder().encode(
  ": keep-alive\r\n" +
    'event: ModelReplied\r\nid: 7\r\ndata: {"seq": 7}\r\n\r\n' +
    "data: two\rdata: lines\r\r" +
    "event: delta\nid: 9:12\ndata:no space\n\n" +
    "retry: 1500\nid: bad\0id\ndata: x\n\n" +
    "event: empty\n\n",
);
const EXPECTED = [
  { event: "ModelReplied", data: '{"seq": 7}', id: "7" },
  { event: "message", data: "two\nlines", id: "7" },
  { event: "delta", data: "no space", id: "9:12" },
  { event: "message", data: "x", id: "9:12" },
];

/**
 * @param {Uint8Array[]} chunks
 * @param {number} bound
 */
function parse(chunks, bound = 1 << 20) {
  const parser = new SseParser(bound, bound);
  return chunks.flatMap((chunk) => parser.feed(chunk));
}

test("the same events however the bytes are split", () => {
  assert.deepEqual(parse([STREAM]), EXPECTED);
  assert.deepEqual(parse([...STREAM].map((b) => Uint8Array.of(b))), EXPECTED);
  for (let at = 0; at < STREAM.length; at++) {
    assert.deepEqual(parse([STREAM.slice(0, at), STREAM.slice(at)]), EXPECTED, `split at ${at}`);
  }
});

test("retry is kept and an unfinished event is not given", () => {
  const parser = new SseParser(1024, 1024);
  assert.deepEqual(parser.feed(new TextEncoder().encode("retry: 250\ndata: half")), []);
  assert.equal(parser.retryMs, 250);
  assert.deepEqual(parser.feed(new TextEncoder().encode("\n")), []);
});

test("a line over the bound is refused even without its end", () => {
  assert.throws(() => parse([new TextEncoder().encode("data: " + "a".repeat(2000) + "\n\n")], 1024), SseError);
  const parser = new SseParser(1024, 1024);
  assert.throws(() => {
    for (let i = 0; i < 10; i++) parser.feed(new Uint8Array(200).fill(0x61));
  }, SseError);
});

test("an event over the bound is refused", () => {
  const line = new TextEncoder().encode("data: " + "a".repeat(600) + "\n");
  assert.throws(() => parse([line, line], 1024), SseError);
});

test("a long line in small pieces costs its length", () => {
  const started = Date.now();
  const parser = new SseParser(16 << 20, 16 << 20);
  const piece = new Uint8Array(1024).fill(0x61);
  for (let i = 0; i < 8 * 1024; i++) parser.feed(piece);
  assert.deepEqual(parser.feed(new TextEncoder().encode("\n\n")), []);
  assert.ok(Date.now() - started < 5000);
});
