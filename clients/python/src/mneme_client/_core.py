"""What the sync and async faces share: each operation as a request and the
decoding of its answer, errors, and the state of a resumable stream. The
faces differ only in how they wait for the network."""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from . import models
from ._sse import SseError, SseEvent, SseParser
from .errors import MnemeError

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)

DEFAULT_URL = "http://127.0.0.1:7878"
"""Where `mneme serve` listens unless told otherwise."""

MAX_ERROR_BYTES = 4096
"""The most of a non-JSON error body kept as its message."""


@dataclass
class Call(Generic[T]):
    """One request, and what its answer decodes to."""

    method: str
    path: str
    decode: Callable[[httpx.Response], T]
    json: Any = None
    content: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    waits: bool = False
    """The answer may take a whole turn: no read timeout."""


def error_of(response: httpx.Response, method: str, path: str) -> MnemeError:
    """The daemon's ``{"error": REASON}`` (or whatever came instead) as an
    error. The body must have been read."""
    message = ""
    try:
        body = response.json()
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            message = body["error"]
    except ValueError:
        pass
    if not message:
        text = response.content[:MAX_ERROR_BYTES].decode("utf-8", errors="replace").strip()
        message = text or response.reason_phrase or "error"
    return MnemeError(response.status_code, message, method, path)


def unexpected(response: httpx.Response, method: str, path: str, why: object) -> MnemeError:
    return MnemeError(response.status_code, f"an answer the client does not understand: {why}", method, path)


def model(cls: type[M]) -> Callable[[httpx.Response], M]:
    """Decodes a JSON answer as ``cls``."""

    def decode(response: httpx.Response) -> M:
        try:
            return cls.model_validate_json(response.content)
        except ValidationError as e:
            raise unexpected(response, response.request.method, response.request.url.path, e) from None

    return decode


def models_list(cls: type[M]) -> Callable[[httpx.Response], list[M]]:
    """Decodes a JSON array of ``cls``."""

    def decode(response: httpx.Response) -> list[M]:
        try:
            rows = response.json()
            if not isinstance(rows, list):
                raise ValueError(f"expected an array, got {type(rows).__name__}")
            return [cls.model_validate(row) for row in rows]
        except (ValueError, ValidationError) as e:
            raise unexpected(response, response.request.method, response.request.url.path, e) from None

    return decode


def by_status(answers: Mapping[int, Callable[[httpx.Response], Any]]) -> Callable[[httpx.Response], Any]:
    """Decodes an answer by its status (202: accepted, 200: the turn's end)."""

    def decode(response: httpx.Response) -> Any:
        chosen = answers.get(response.status_code)
        if chosen is None:
            raise unexpected(
                response, response.request.method, response.request.url.path, f"status {response.status_code}"
            )
        return chosen(response)

    return decode


def decision(response: httpx.Response) -> models.TurnOutcome | models.Decided:
    """A decision's answer: recorded (``Decided``), or with ``wait`` the
    continued turn's end (``TurnOutcome``)."""
    try:
        body = response.json()
    except ValueError as e:
        raise unexpected(response, response.request.method, response.request.url.path, e) from None
    if isinstance(body, dict) and "decided" in body:
        return model(models.Decided)(response)
    return model(models.TurnOutcome)(response)


def raw(response: httpx.Response) -> bytes:
    return response.content


def any_json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError as e:
        raise unexpected(response, response.request.method, response.request.url.path, e) from None


def body(request: BaseModel) -> Any:
    """A request model as the JSON the daemon takes."""
    return request.model_dump(mode="json", by_alias=True, exclude_none=True)


def segment(text: str) -> str:
    """One path segment, percent-encoded (a call id may hold anything)."""
    return quote(text, safe="")


# The operations, one function each, shared by both faces.


def health() -> Call[models.Health]:
    return Call("GET", "/health", model(models.Health))


def list_sessions(status: str | None, agent: str | None) -> Call[list[models.SessionSummary]]:
    params = {k: v for k, v in (("status", status), ("agent", agent)) if v is not None}
    return Call("GET", "/sessions", models_list(models.SessionSummary), params=params)


def create_session(
    agent: str | None, agent_toml: str | None, spec: Mapping[str, Any] | None, first_message: str | None
) -> Call[models.Created]:
    given = [name for name, v in (("agent", agent), ("agent_toml", agent_toml), ("spec", spec)) if v is not None]
    if len(given) != 1:
        raise ValueError(
            "create_session takes exactly one of agent= (a NAME.toml in the daemon's --agents directory), "
            f"agent_toml= (an agent file's text) or spec= (an agent spec as a dict); given: {', '.join(given) or 'none'}"
        )
    if agent_toml is not None:
        if first_message is not None:
            raise ValueError("first_message= goes with agent= or spec=: an agent file sent as TOML carries no message")
        toml = {"content-type": "application/toml"}
        return Call("POST", "/sessions", model(models.Created), content=agent_toml, headers=toml)
    request = models.CreateSession(
        agent=agent, spec=dict(spec) if spec is not None else None, first_message=first_message
    )
    return Call("POST", "/sessions", model(models.Created), json=body(request))


def get_session(id: str) -> Call[models.SessionView]:
    return Call("GET", f"/sessions/{segment(id)}", model(models.SessionView))


def post_message(
    id: str, text: str, wait: bool, refresh_tools: bool
) -> Call[models.TurnOutcome | models.MessageAccepted]:
    request = models.PostMessage(text=text, wait=wait, refresh_tools=refresh_tools or None)
    decode = by_status({202: model(models.MessageAccepted), 200: model(models.TurnOutcome)})
    return Call("POST", f"/sessions/{segment(id)}/messages", decode, json=body(request), waits=wait)


def resume(id: str, wait: bool, extend: bool) -> Call[models.TurnOutcome | models.Resuming]:
    request = models.Resume(wait=wait, extend=extend)
    decode = by_status({202: model(models.Resuming), 200: model(models.TurnOutcome)})
    return Call("POST", f"/sessions/{segment(id)}/resume", decode, json=body(request), waits=wait)


def wake(id: str, event: str, payload: Any, wait: bool) -> Call[models.TurnOutcome | models.Woke]:
    # The payload is any JSON (the document says object): set as given.
    request = body(models.Wake(event=event, wait=wait))
    request["payload"] = payload if payload is not None else {}
    decode = by_status({202: model(models.Woke), 200: model(models.TurnOutcome)})
    return Call("POST", f"/sessions/{segment(id)}/wake", decode, json=request, waits=wait)


def pause(id: str) -> Call[models.PauseRequested]:
    return Call("POST", f"/sessions/{segment(id)}/pause", model(models.PauseRequested))


def cancel(id: str, by: str) -> Call[models.Cancelled]:
    return Call("POST", f"/sessions/{segment(id)}/cancel", model(models.Cancelled), json=body(models.Cancel(by=by)))


def approve(
    id: str, call: str, approved: bool, by: str, edit_args: Any, wait: bool, proceed: bool
) -> Call[models.TurnOutcome | models.Decided]:
    if edit_args is not None and not approved:
        raise ValueError("edit_args= goes with an approval, not a denial")
    args = None if edit_args is None else json.dumps(edit_args)
    request = models.Approve.model_validate(
        {"approved": approved, "by": by, "args": args, "wait": wait, "continue": proceed}
    )
    path = f"/sessions/{segment(id)}/calls/{segment(call)}/approve"
    return Call("POST", path, decision, json=body(request), waits=wait)


def resolve(
    id: str, call: str, retry: bool, skip: Any, fail: str | None, by: str, wait: bool, proceed: bool
) -> Call[models.TurnOutcome | models.Decided]:
    chosen = [
        name for name, given in (("retry", retry), ("skip", skip is not None), ("fail", fail is not None)) if given
    ]
    if len(chosen) != 1:
        raise ValueError(
            "resolve takes exactly one of retry=True (run the call again), skip=RESULT (record it as the "
            f"call's result) or fail=MESSAGE (record the call as failed); given: {', '.join(chosen) or 'none'}"
        )
    request = body(
        models.Resolve.model_validate({"retry": retry, "fail": fail, "by": by, "wait": wait, "continue": proceed})
    )
    if skip is not None:
        request["skip"] = skip  # any JSON (the document says object): set as given
    path = f"/sessions/{segment(id)}/calls/{segment(call)}/resolve"
    return Call("POST", path, decision, json=request, waits=wait)


def fork(id: str, at: int, spec: Mapping[str, Any] | None) -> Call[models.Forked]:
    request = models.Fork(at=at, spec=dict(spec) if spec is not None else None)
    return Call("POST", f"/sessions/{segment(id)}/fork", model(models.Forked), json=body(request))


def rerun(id: str, spec: Mapping[str, Any], live_tools: bool) -> Call[models.RerunReport]:
    request = models.Rerun(spec=dict(spec), live_tools=live_tools)
    return Call("POST", f"/sessions/{segment(id)}/rerun", model(models.RerunReport), json=body(request), waits=True)


def erase(id: str, reason: str, by: str, cascade: bool) -> Call[models.Erased]:
    request = models.Erase(reason=reason, by=by, cascade=cascade)
    return Call("DELETE", f"/sessions/{segment(id)}", model(models.Erased), json=body(request))


def events_page(id: str, after: int | None, until: int | None, kind: str | None) -> Call[list[models.EventRecord]]:
    params = {k: str(v) for k, v in (("after", after), ("until", until), ("kind", kind)) if v is not None}
    return Call("GET", f"/sessions/{segment(id)}/events", models_list(models.EventRecord), params=params)


def verify(id: str) -> Call[models.Verified]:
    return Call("GET", f"/sessions/{segment(id)}/verify", model(models.Verified))


def replay(id: str) -> Call[models.ReplayView]:
    return Call("GET", f"/sessions/{segment(id)}/replay", model(models.ReplayView))


def next_request(id: str) -> Call[Any]:
    return Call("GET", f"/sessions/{segment(id)}/request", any_json)


def cache(id: str) -> Call[models.CacheReport]:
    return Call("GET", f"/sessions/{segment(id)}/cache", model(models.CacheReport))


def diff(id: str, other: str) -> Call[models.SessionDiff]:
    return Call("GET", f"/sessions/{segment(id)}/diff/{segment(other)}", model(models.SessionDiff))


def blob(id: str, digest: str) -> Call[bytes]:
    return Call("GET", f"/sessions/{segment(id)}/blobs/{segment(digest)}", raw)


# Streams.


@dataclass(frozen=True)
class Delta:
    """A piece of a streamed reply's text."""

    seq: int
    """The seq the reply is expected at (where its ``ModelReplied`` lands)."""
    offset: int
    """How many bytes (UTF-8) of the reply's text this piece reaches."""
    text: str
    """The piece."""

    @property
    def id(self) -> str:
        """The frame's id, ``SEQ:OFFSET``: give it as ``last_event_id`` to
        go on from here."""
        return f"{self.seq}:{self.offset}"


RETRYABLE = (502, 503, 504)
"""Statuses a reconnecting stream waits out (a daemon stopping or starting)."""


class StreamState(Generic[T]):
    """What a resumable stream keeps across its connections: where it is,
    how often it reconnected, the events read and not yet taken."""

    def __init__(
        self,
        path: str,
        params: dict[str, str],
        last_event_id: str | None,
        max_event_bytes: int,
        reconnect_for: float,
    ) -> None:
        self.path = path
        self.params = params
        self.last_event_id = last_event_id
        """Where the stream is: sent as ``Last-Event-ID`` when it reconnects."""
        self.reconnects = 0
        """How many times the stream was opened again after it broke."""
        self.max_event_bytes = max_event_bytes
        self.reconnect_for = reconnect_for
        self.pending: deque[T] = deque()
        self.parser: SseParser | None = None
        self.opened = False
        self.closed = False
        self.broken_since: float | None = None
        self.failures = 0
        self.must_reconnect = False
        self.retry_ms: int | None = None
        """The daemon's `retry:` (milliseconds), if it gave one."""

    def headers(self) -> dict[str, str]:
        headers = {"accept": "text/event-stream", "cache-control": "no-cache"}
        if self.last_event_id is not None:
            headers["last-event-id"] = self.last_event_id
        return headers

    def connected(self) -> None:
        if self.opened:
            self.reconnects += 1
        self.opened = True
        self.broken_since = None
        self.failures = 0
        self.parser = SseParser(max_line_bytes=self.max_event_bytes, max_event_bytes=self.max_event_bytes)

    def broke(self) -> None:
        """The connection ended or failed: the next read reconnects."""
        if self.parser is not None and self.parser.retry_ms is not None:
            self.retry_ms = self.parser.retry_ms
        self.parser = None
        self.must_reconnect = False
        if self.broken_since is None:
            self.broken_since = time.monotonic()

    def feed(self, chunk: bytes) -> None:
        assert self.parser is not None
        try:
            events = self.parser.feed(chunk)
        except SseError as e:
            self.closed = True
            raise MnemeError(
                None, f"the stream is not Server-Sent Events within bounds: {e}", "GET", self.path
            ) from None
        for event in events:
            self.take(event)

    def take(self, event: SseEvent) -> None:
        raise NotImplementedError

    def retry_or_raise(self, error: MnemeError) -> float:
        """After a failed attempt to (re)open the stream: how long to wait
        before the next, or the error when it must not be retried (the
        first connection, a status other than 502-504, or a stream broken
        for longer than ``reconnect_for``)."""
        if not self.opened or (error.status is not None and error.status not in RETRYABLE):
            self.closed = True
            raise error
        now = time.monotonic()
        if self.broken_since is None:
            self.broken_since = now
        if now - self.broken_since >= self.reconnect_for:
            self.closed = True
            raise MnemeError(
                None,
                f"the stream broke and could not be reopened within {self.reconnect_for:g} s: {error.message}",
                "GET",
                self.path,
            ) from None
        self.failures += 1
        retry = self.retry_ms
        backoff = min(0.05 * 2 ** min(self.failures, 6), 2.0) if retry is None else retry / 1000
        return min(backoff, max(0.0, self.broken_since + self.reconnect_for - now))


class EventState(StreamState[models.EventRecord]):
    def take(self, event: SseEvent) -> None:
        try:
            record = models.EventRecord.model_validate_json(event.data)
        except ValidationError as e:
            self.closed = True
            raise MnemeError(200, f"an event the client does not understand: {e}", "GET", self.path) from None
        self.last_event_id = str(record.seq)
        self.pending.append(record)


class DeltaState(StreamState[Delta]):
    def take(self, event: SseEvent) -> None:
        if event.event == "lagged":
            # Pieces were dropped for this slow reader: reopened from where
            # it is, the daemon sends the rest of the reply, no gap.
            self.must_reconnect = True
            return
        if event.event != "delta":
            return
        seq, _, offset = (event.id or "").partition(":")
        try:
            text = json.loads(event.data)["text"]
            delta = Delta(seq=int(seq), offset=int(offset), text=str(text))
        except (ValueError, KeyError, TypeError) as e:
            self.closed = True
            raise MnemeError(
                200, f"a delta the client does not understand ({e}): {event.data[:200]!r}", "GET", self.path
            ) from None
        self.last_event_id = delta.id
        self.pending.append(delta)
