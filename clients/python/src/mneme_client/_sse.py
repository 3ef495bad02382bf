"""Server-Sent Events, read as the WHATWG specification reads them, with
bounds: a line longer than ``max_line_bytes`` or an event whose data
exceeds ``max_event_bytes`` is refused (``SseError``) rather than buffered
without end."""

from __future__ import annotations

from dataclasses import dataclass


class SseError(Exception):
    """A stream that is not Server-Sent Events within the bounds."""


@dataclass(frozen=True)
class SseEvent:
    """One dispatched event."""

    event: str
    """Its name (``message`` when the stream gave none)."""
    data: str
    """Its data lines, joined with newlines."""
    id: str | None
    """The stream's last event id as of this event (an event without an
    ``id`` field keeps the one before it, as the specification says)."""


class SseParser:
    """Turns the bytes of one connection into events, as they arrive."""

    def __init__(self, max_line_bytes: int, max_event_bytes: int) -> None:
        self.max_line_bytes = max_line_bytes
        self.max_event_bytes = max_event_bytes
        self.last_id: str | None = None
        self.retry_ms: int | None = None
        self._buffer = bytearray()
        self._skip_lf = False
        self._event = ""
        self._data: list[str] = []
        self._data_bytes = 0

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """The events ``chunk`` completes."""
        out: list[SseEvent] = []
        buffer = self._buffer
        # Bytes before this had no line's end: not searched again (a long
        # line arriving in many chunks costs its length, not its square).
        scanned = len(buffer)
        buffer += chunk
        start = 0
        while start < len(buffer):
            if self._skip_lf:
                self._skip_lf = False
                if buffer[start] == 0x0A:  # the LF of a CRLF split across chunks
                    start += 1
                    continue
            search = max(start, scanned)
            cr = buffer.find(b"\r", search)
            lf = buffer.find(b"\n", search)
            ends = [at for at in (cr, lf) if at >= 0]
            if not ends:
                break
            end = min(ends)
            line = bytes(buffer[start:end])
            if end == cr:
                if end + 1 < len(buffer):
                    start = end + 2 if buffer[end + 1] == 0x0A else end + 1
                else:
                    start = end + 1
                    self._skip_lf = True
            else:
                start = end + 1
            if len(line) > self.max_line_bytes:
                raise SseError(f"a line of {len(line)} bytes, over the bound of {self.max_line_bytes}")
            event = self._line(line.decode("utf-8", errors="replace"))
            if event is not None:
                out.append(event)
        del buffer[:start]
        if len(buffer) > self.max_line_bytes:
            raise SseError(f"a line of more than {self.max_line_bytes} bytes (the bound) without its end")
        return out

    def _line(self, line: str) -> SseEvent | None:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None  # a comment (the daemon's keep-alives)
        field, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if field == "event":
            self._event = value
        elif field == "data":
            self._data_bytes += len(value) + 1
            if self._data_bytes > self.max_event_bytes:
                raise SseError(f"an event of more than {self.max_event_bytes} bytes (the bound)")
            self._data.append(value)
        elif field == "id":
            if "\0" not in value:
                self.last_id = value
        elif field == "retry":
            if value.isascii() and value.isdigit():
                self.retry_ms = int(value)
        return None

    def _dispatch(self) -> SseEvent | None:
        event, data = self._event, self._data
        self._event, self._data, self._data_bytes = "", [], 0
        if not data:
            return None
        return SseEvent(event=event or "message", data="\n".join(data), id=self.last_id)
