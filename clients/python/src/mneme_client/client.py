"""The synchronous face: ``Mneme``, ``Session``, and the streams."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar, overload

import httpx

from . import _core, models
from ._core import Call, Delta, DeltaState, EventState, StreamState
from .errors import MnemeError

T = TypeVar("T")

STREAM_READ_TIMEOUT = 45.0
"""Seconds a stream may be silent before it is taken for broken and
reopened (the daemon sends a keep-alive every 15)."""


class Mneme:
    """A client of one mneme daemon.

    ``token`` defaults to ``$MNEME_TOKEN``; ``by`` names who decides what
    this client decides (approvals, resolutions, cancellations, erasures),
    unless a call names someone else. ``timeout`` bounds each request's wait
    for an answer, except those that wait for a turn (``wait=True``), which
    wait as long as the turn takes. A broken stream is reopened for up to
    ``reconnect_for`` seconds; an event larger than ``max_event_bytes`` is
    refused.
    """

    def __init__(
        self,
        base_url: str = _core.DEFAULT_URL,
        token: str | None = None,
        *,
        by: str = "api",
        timeout: float = 60.0,
        reconnect_for: float = 30.0,
        max_event_bytes: int = 64 << 20,
    ) -> None:
        token = token if token is not None else os.environ.get("MNEME_TOKEN")
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.base_url = base_url.rstrip("/")
        self.by = by
        self.timeout = timeout
        self.reconnect_for = reconnect_for
        self.max_event_bytes = max_event_bytes
        self.http = httpx.Client(base_url=self.base_url, headers=headers, timeout=httpx.Timeout(timeout, connect=10.0))

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Mneme:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def _call(self, call: Call[T]) -> T:
        timeout = httpx.Timeout(None, connect=10.0) if call.waits else httpx.Timeout(self.timeout, connect=10.0)
        try:
            response = self.http.request(
                call.method,
                call.path,
                json=call.json,
                content=call.content,
                headers=call.headers,
                params=call.params,
                timeout=timeout,
            )
        except httpx.TransportError as e:
            raise MnemeError(None, f"{self.base_url}: {e!r}", call.method, call.path) from None
        if response.status_code >= 400:
            raise _core.error_of(response, call.method, call.path)
        return call.decode(response)

    def health(self) -> models.Health:
        """Liveness (no token needed)."""
        return self._call(_core.health())

    def sessions(self, *, status: str | None = None, agent: str | None = None) -> list[models.SessionSummary]:
        """The sessions, with status and usage; only those of ``status`` or
        ``agent`` if given."""
        return self._call(_core.list_sessions(status, agent))

    def create_session(
        self,
        agent: str | None = None,
        *,
        agent_toml: str | None = None,
        spec: Mapping[str, Any] | None = None,
        first_message: str | None = None,
    ) -> Session:
        """A new session of exactly one of: ``agent`` (a file ``NAME.toml`` in
        the daemon's ``--agents`` directory), ``agent_toml`` (an agent file's
        text) or ``spec`` (an agent spec, as the file's TOML reads as
        JSON). ``first_message`` is recorded with the start; its turn runs on
        ``resume()``."""
        created = self._call(_core.create_session(agent, agent_toml, spec, first_message))
        return Session(self, str(created.session))

    def session(self, id: str) -> Session:
        """The session ``id`` (no request is made until a method is called)."""
        return Session(self, id)


class Session:
    """One session of a daemon."""

    def __init__(self, client: Mneme, id: str) -> None:
        self.client = client
        self.id = id

    def __repr__(self) -> str:
        return f"Session({self.id!r})"

    def get(self) -> models.SessionView:
        """Status, usage, answer, the calls waiting for a person."""
        return self.client._call(_core.get_session(self.id))

    @overload
    def send(self, text: str, *, wait: Literal[True], refresh_tools: bool = False) -> models.TurnOutcome: ...
    @overload
    def send(
        self, text: str, *, wait: Literal[False] = False, refresh_tools: bool = False
    ) -> models.MessageAccepted: ...
    def send(
        self, text: str, *, wait: bool = False, refresh_tools: bool = False
    ) -> models.TurnOutcome | models.MessageAccepted:
        """A user message. Answers once it is durable (``MessageAccepted``),
        or with ``wait`` when its turn ends (``TurnOutcome``: answered,
        waiting for approval, paused, failed, ...)."""
        return self.client._call(_core.post_message(self.id, text, wait, refresh_tools))

    @overload
    def resume(self, *, wait: Literal[True], extend: bool = False) -> models.TurnOutcome: ...
    @overload
    def resume(self, *, wait: Literal[False] = False, extend: bool = False) -> models.Resuming: ...
    def resume(self, *, wait: bool = False, extend: bool = False) -> models.TurnOutcome | models.Resuming:
        """Continues pending work; ``extend`` starts a spent budget again."""
        return self.client._call(_core.resume(self.id, wait, extend))

    @overload
    def wake(self, event: str, payload: Any = None, *, wait: Literal[True]) -> models.TurnOutcome: ...
    @overload
    def wake(self, event: str, payload: Any = None, *, wait: Literal[False] = False) -> models.Woke: ...
    def wake(self, event: str, payload: Any = None, *, wait: bool = False) -> models.TurnOutcome | models.Woke:
        """Delivers ``event`` (with ``payload``, any JSON) to a sleeping session."""
        return self.client._call(_core.wake(self.id, event, payload, wait))

    def approve(
        self,
        call: str,
        *,
        edit_args: Any = None,
        by: str | None = None,
        wait: bool = False,
        proceed: bool = True,
    ) -> models.TurnOutcome | models.Decided:
        """Approves the waiting call ``call``; with ``edit_args`` (any JSON
        value, usually a dict) the tool runs with those arguments instead of
        the model's, recorded with who gave them. The session then goes on
        (unless other calls still wait, or ``proceed`` is false): with
        ``wait``, the answer is the continued turn's end."""
        return self.client._call(_core.approve(self.id, call, True, by or self.client.by, edit_args, wait, proceed))

    def deny(
        self, call: str, *, by: str | None = None, wait: bool = False, proceed: bool = True
    ) -> models.TurnOutcome | models.Decided:
        """Denies the waiting call ``call``: the model is told."""
        return self.client._call(_core.approve(self.id, call, False, by or self.client.by, None, wait, proceed))

    def resolve(
        self,
        call: str,
        *,
        retry: bool = False,
        skip: Any = None,
        fail: str | None = None,
        by: str | None = None,
        wait: bool = False,
        proceed: bool = True,
    ) -> models.TurnOutcome | models.Decided:
        """Decides on a call in doubt: exactly one of ``retry=True``,
        ``skip=RESULT`` (recorded as its result, not run) or
        ``fail=MESSAGE``."""
        return self.client._call(_core.resolve(self.id, call, retry, skip, fail, by or self.client.by, wait, proceed))

    def pause(self) -> models.PauseRequested:
        """Pauses the session at its next step (409 when nothing runs it and
        it does not sleep)."""
        return self.client._call(_core.pause(self.id))

    def cancel(self, *, by: str | None = None) -> models.Cancelled:
        """Cancels the session; a new message reopens it."""
        return self.client._call(_core.cancel(self.id, by or self.client.by))

    def fork(self, at: int, *, spec: Mapping[str, Any] | None = None) -> Session:
        """A new session holding this one's first ``at`` events (run on
        ``spec`` from there, if given)."""
        forked = self.client._call(_core.fork(self.id, at, spec))
        return Session(self.client, str(forked.session))

    def rerun(self, spec: Mapping[str, Any], *, live_tools: bool = False) -> models.RerunReport:
        """Re-runs this session's user messages on ``spec`` in a new session."""
        return self.client._call(_core.rerun(self.id, spec, live_tools))

    def erase(self, *, reason: str, by: str | None = None, cascade: bool = True) -> models.Erased:
        """Erases the session's content for good (and, unless ``cascade`` is
        false, that of every session derived from it). Needs a daemon with
        a master key."""
        return self.client._call(_core.erase(self.id, reason, by or self.client.by, cascade))

    @overload
    def events(
        self,
        *,
        follow: Literal[False] = False,
        after: int | None = None,
        until: int | None = None,
        kind: str | None = None,
    ) -> list[models.EventRecord]: ...
    @overload
    def events(self, *, follow: Literal[True], after: int | None = None, kind: str | None = None) -> EventStream: ...
    def events(
        self, *, follow: bool = False, after: int | None = None, until: int | None = None, kind: str | None = None
    ) -> list[models.EventRecord] | EventStream:
        """The session's log: the events after ``after`` (up to ``until``),
        of the kinds in ``kind`` (comma-separated) if given. With ``follow``,
        an endless stream: history, then each event once durable; it reopens
        itself when the connection breaks, from the last event it gave."""
        if not follow:
            return self.client._call(_core.events_page(self.id, after, until, kind))
        if until is not None:
            raise ValueError("until= pages the log; a followed stream has no end")
        params = {k: str(v) for k, v in (("after", after), ("kind", kind)) if v is not None}
        params["follow"] = "true"
        state = EventState(
            f"/sessions/{_core.segment(self.id)}/events",
            params,
            None,
            self.client.max_event_bytes,
            self.client.reconnect_for,
        )
        return EventStream(self.client, state)

    def deltas(self, *, last_event_id: str | None = None) -> DeltaStream:
        """The text of the session's streamed replies (``stream = true``) as it
        arrives, each piece a ``Delta``; from ``last_event_id`` (a
        ``Delta.id``) if given. Endless: it reopens itself when the
        connection breaks, with no gap and no repeat."""
        state = DeltaState(
            f"/sessions/{_core.segment(self.id)}/deltas",
            {},
            last_event_id,
            self.client.max_event_bytes,
            self.client.reconnect_for,
        )
        return DeltaStream(self.client, state)

    def verify(self) -> models.Verified:
        """Checks the session's hash chain."""
        return self.client._call(_core.verify(self.id))

    def replay(self) -> models.ReplayView:
        """Dry run: the rebuilt next request and the resume plan."""
        return self.client._call(_core.replay(self.id))

    def next_request(self) -> Any:
        """The session's next model request, as it would be sent."""
        return self.client._call(_core.next_request(self.id))

    def cache(self) -> models.CacheReport:
        """The session's prefix-cache misses and their causes."""
        return self.client._call(_core.cache(self.id))

    def diff(self, other: str | Session) -> models.SessionDiff:
        """This session compared with ``other`` (its fork, say)."""
        other_id = other.id if isinstance(other, Session) else other
        return self.client._call(_core.diff(self.id, other_id))

    def blob(self, digest: str) -> bytes:
        """Binary content a tool returned by reference, by its SHA-256."""
        return self.client._call(_core.blob(self.id, digest))


class _Stream(Generic[T]):
    """A resumable Server-Sent Events stream (iterate it; close it, or use it
    in a ``with``, when done)."""

    def __init__(self, client: Mneme, state: StreamState[T]) -> None:
        self._client = client
        self._state = state
        self._response: httpx.Response | None = None
        self._chunks: Iterator[bytes] | None = None

    @property
    def last_event_id(self) -> str | None:
        """Where the stream is (the last event's id)."""
        return self._state.last_event_id

    @property
    def reconnects(self) -> int:
        """How many times the stream was reopened after it broke."""
        return self._state.reconnects

    def __enter__(self: _S) -> _S:
        if self._response is None and not self._state.closed:
            self._open()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        self._state.closed = True
        self._drop()

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        state = self._state
        while not state.pending:
            if state.closed:
                raise StopIteration
            if state.must_reconnect:
                self._drop()
                state.broke()
            if self._chunks is None:
                self._open()
                continue
            try:
                chunk = next(self._chunks, None)
            except httpx.TransportError:
                chunk = None
            if chunk is None:  # the daemon went (or the network): reopen
                self._drop()
                state.broke()
                continue
            state.feed(chunk)
        return state.pending.popleft()

    def _drop(self) -> None:
        if self._response is not None:
            try:
                self._response.close()
            except httpx.HTTPError:
                pass
        self._response = None
        self._chunks = None

    def _open(self) -> None:
        state = self._state
        http = self._client.http
        timeout = httpx.Timeout(STREAM_READ_TIMEOUT, connect=10.0)
        while True:
            request = http.build_request(
                "GET", state.path, params=state.params, headers=state.headers(), timeout=timeout
            )
            try:
                response = http.send(request, stream=True)
            except httpx.TransportError as e:
                error = MnemeError(None, f"{self._client.base_url}: {e!r}", "GET", state.path)
            else:
                if response.status_code < 400:
                    self._response = response
                    self._chunks = response.iter_bytes()
                    state.connected()
                    return
                response.read()
                response.close()
                error = _core.error_of(response, "GET", state.path)
            time.sleep(state.retry_or_raise(error))


_S = TypeVar("_S", bound=_Stream[Any])


class EventStream(_Stream[models.EventRecord]):
    """A session's events as they become durable (``EventRecord``s)."""


class DeltaStream(_Stream[Delta]):
    """A session's streamed reply text as it arrives (``Delta``s)."""
