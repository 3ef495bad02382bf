"""The Server-Sent Events parser: the specification's framing, however the
bytes are split, and its bounds (run by cli/tests/clients.rs)."""

from __future__ import annotations

import time
import unittest

from mneme_client._sse import SseError, SseEvent, SseParser

STREAM = (
    b": keep-alive\r\n"
    b'event: ModelReplied\r\nid: 7\r\ndata: {"seq": 7}\r\n\r\n'
    b"data: two\rdata: lines\r\r"
    b"event: delta\nid: 9:12\ndata:no space\n\n"
    b"retry: 1500\nid: bad\0id\ndata: x\n\n"
    b"event: empty\n\n"
)
EXPECTED = [
    SseEvent("ModelReplied", '{"seq": 7}', "7"),
    SseEvent("message", "two\nlines", "7"),
    SseEvent("delta", "no space", "9:12"),
    SseEvent("message", "x", "9:12"),
]


def parse(chunks: list[bytes], bound: int = 1 << 20) -> list[SseEvent]:
    parser = SseParser(max_line_bytes=bound, max_event_bytes=bound)
    events: list[SseEvent] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    return events


class SseParserTest(unittest.TestCase):
    def test_the_same_events_however_the_bytes_are_split(self) -> None:
        self.assertEqual(parse([STREAM]), EXPECTED)
        self.assertEqual(parse([bytes([b]) for b in STREAM]), EXPECTED)
        for at in range(len(STREAM)):
            self.assertEqual(parse([STREAM[:at], STREAM[at:]]), EXPECTED, at)

    def test_retry_is_kept_and_an_unfinished_event_is_not_given(self) -> None:
        parser = SseParser(1024, 1024)
        self.assertEqual(parser.feed(b"retry: 250\ndata: half"), [])
        self.assertEqual(parser.retry_ms, 250)
        self.assertEqual(parser.feed(b"\n"), [])

    def test_a_line_over_the_bound_is_refused_even_without_its_end(self) -> None:
        with self.assertRaises(SseError):
            parse([b"data: " + b"a" * 2000 + b"\n\n"], bound=1024)
        parser = SseParser(1024, 1024)
        with self.assertRaises(SseError):
            for _ in range(10):
                parser.feed(b"a" * 200)

    def test_an_event_over_the_bound_is_refused(self) -> None:
        with self.assertRaises(SseError):
            parse([b"data: " + b"a" * 600 + b"\n"] * 2, bound=1024)

    def test_a_long_line_in_small_pieces_costs_its_length(self) -> None:
        started = time.monotonic()
        parser = SseParser(16 << 20, 16 << 20)
        piece = b"a" * 1024
        for _ in range(8 * 1024):
            parser.feed(piece)
        events = parser.feed(b"\n\n")
        self.assertEqual(events, [])  # not a field anyone knows
        self.assertLess(time.monotonic() - started, 5.0)


if __name__ == "__main__":
    unittest.main()
