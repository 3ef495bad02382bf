"""The asynchronous face: ``AsyncMneme``, ``AsyncSession``, and the streams
(``async for``). The same operations as the synchronous face, awaited."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Mapping
from types import TracebackType
from typing import Any, Generic, Literal, TypeVar, overload

import httpx

from . import _core, models
from ._core import Call, Delta, DeltaState, EventState, StreamState
from .client import STREAM_READ_TIMEOUT
from .errors import MnemeError

T = TypeVar("T")


class AsyncMneme:
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
        self.http = httpx.AsyncClient(
            base_url=self.base_url, headers=headers, timeout=httpx.Timeout(timeout, connect=10.0)
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncMneme:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def _call(self, call: Call[T]) -> T:
        timeout = httpx.Timeout(None, connect=10.0) if call.waits else httpx.Timeout(self.timeout, connect=10.0)
        try:
            response = await self.http.request(
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

    async def health(self) -> models.Health:
        """Liveness (no token needed)."""
        return await self._call(_core.health())

    async def sessions(self, *, status: str | None = None, agent: str | None = None) -> list[models.SessionSummary]:
        """The sessions, with status and usage; only those of ``status`` or
        ``agent`` if given."""
        return await self._call(_core.list_sessions(status, agent))

    async def create_session(
        self,
        agent: str | None = None,
        *,
        agent_toml: str | None = None,
        spec: Mapping[str, Any] | None = None,
        first_message: str | None = None,
    ) -> AsyncSession:
        """A new session of exactly one of: ``agent`` (a file ``NAME.toml`` in
        the daemon's ``--agents`` directory), ``agent_toml`` (an agent file's
        text) or ``spec`` (an agent spec, as the file's TOML reads as
        JSON). ``first_message`` is recorded with the start; its turn runs on
        ``resume()``."""
        created = await self._call(_core.create_session(agent, agent_toml, spec, first_message))
        return AsyncSession(self, str(created.session))

    def session(self, id: str) -> AsyncSession:
        """The session ``id`` (no request is made until a method is called)."""
        return AsyncSession(self, id)


class AsyncSession:
    """One session of a daemon."""

    def __init__(self, client: AsyncMneme, id: str) -> None:
        self.client = client
        self.id = id

    def __repr__(self) -> str:
        return f"AsyncSession({self.id!r})"

    async def get(self) -> models.SessionView:
        """Status, usage, answer, the calls waiting for a person."""
        return await self.client._call(_core.get_session(self.id))

    @overload
    async def send(self, text: str, *, wait: Literal[True], refresh_tools: bool = False) -> models.TurnOutcome: ...
    @overload
    async def send(
        self, text: str, *, wait: Literal[False] = False, refresh_tools: bool = False
    ) -> models.MessageAccepted: ...
    async def send(
        self, text: str, *, wait: bool = False, refresh_tools: bool = False
    ) -> models.TurnOutcome | models.MessageAccepted:
        """A user message. Answers once it is durable (``MessageAccepted``),
        or with ``wait`` when its turn ends (``TurnOutcome``: answered,
        waiting for approval, paused, failed, ...)."""
        return await self.client._call(_core.post_message(self.id, text, wait, refresh_tools))

    @overload
    async def resume(self, *, wait: Literal[True], extend: bool = False) -> models.TurnOutcome: ...
    @overload
    async def resume(self, *, wait: Literal[False] = False, extend: bool = False) -> models.Resuming: ...
    async def resume(self, *, wait: bool = False, extend: bool = False) -> models.TurnOutcome | models.Resuming:
        """Continues pending work; ``extend`` starts a spent budget again."""
        return await self.client._call(_core.resume(self.id, wait, extend))

    @overload
    async def wake(self, event: str, payload: Any = None, *, wait: Literal[True]) -> models.TurnOutcome: ...
    @overload
    async def wake(self, event: str, payload: Any = None, *, wait: Literal[False] = False) -> models.Woke: ...
    async def wake(self, event: str, payload: Any = None, *, wait: bool = False) -> models.TurnOutcome | models.Woke:
        """Delivers ``event`` (with ``payload``, any JSON) to a sleeping session."""
        return await self.client._call(_core.wake(self.id, event, payload, wait))

    async def approve(
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
        return await self.client._call(
            _core.approve(self.id, call, True, by or self.client.by, edit_args, wait, proceed)
        )

    async def deny(
        self, call: str, *, by: str | None = None, wait: bool = False, proceed: bool = True
    ) -> models.TurnOutcome | models.Decided:
        """Denies the waiting call ``call``: the model is told."""
        return await self.client._call(_core.approve(self.id, call, False, by or self.client.by, None, wait, proceed))

    async def resolve(
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
        return await self.client._call(
            _core.resolve(self.id, call, retry, skip, fail, by or self.client.by, wait, proceed)
        )

    async def pause(self) -> models.PauseRequested:
        """Pauses the session at its next step (409 when nothing runs it and
        it does not sleep)."""
        return await self.client._call(_core.pause(self.id))

    async def cancel(self, *, by: str | None = None) -> models.Cancelled:
        """Cancels the session; a new message reopens it."""
        return await self.client._call(_core.cancel(self.id, by or self.client.by))

    async def fork(self, at: int, *, spec: Mapping[str, Any] | None = None) -> AsyncSession:
        """A new session holding this one's first ``at`` events (run on
        ``spec`` from there, if given)."""
        forked = await self.client._call(_core.fork(self.id, at, spec))
        return AsyncSession(self.client, str(forked.session))

    async def rerun(self, spec: Mapping[str, Any], *, live_tools: bool = False) -> models.RerunReport:
        """Re-runs this session's user messages on ``spec`` in a new session."""
        return await self.client._call(_core.rerun(self.id, spec, live_tools))

    async def erase(self, *, reason: str, by: str | None = None, cascade: bool = True) -> models.Erased:
        """Erases the session's content for good (and, unless ``cascade`` is
        false, that of every session derived from it). Needs a daemon with
        a master key."""
        return await self.client._call(_core.erase(self.id, reason, by or self.client.by, cascade))

    @overload
    def events(
        self,
        *,
        follow: Literal[False] = False,
        after: int | None = None,
        until: int | None = None,
        kind: str | None = None,
    ) -> AsyncIterator[models.EventRecord]: ...
    @overload
    def events(
        self, *, follow: Literal[True], after: int | None = None, kind: str | None = None
    ) -> AsyncEventStream: ...
    def events(
        self, *, follow: bool = False, after: int | None = None, until: int | None = None, kind: str | None = None
    ) -> AsyncIterator[models.EventRecord] | AsyncEventStream:
        """The session's log (``async for``): the events after ``after`` (up
        to ``until``), of the kinds in ``kind`` (comma-separated) if given.
        With ``follow``, an endless stream: history, then each event once
        durable; it reopens itself when the connection breaks, from the last
        event it gave."""
        if not follow:
            return self._page(after, until, kind)
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
        return AsyncEventStream(self.client, state)

    async def _page(self, after: int | None, until: int | None, kind: str | None) -> AsyncIterator[models.EventRecord]:
        for record in await self.client._call(_core.events_page(self.id, after, until, kind)):
            yield record

    def deltas(self, *, last_event_id: str | None = None) -> AsyncDeltaStream:
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
        return AsyncDeltaStream(self.client, state)

    async def verify(self) -> models.Verified:
        """Checks the session's hash chain."""
        return await self.client._call(_core.verify(self.id))

    async def replay(self) -> models.ReplayView:
        """Dry run: the rebuilt next request and the resume plan."""
        return await self.client._call(_core.replay(self.id))

    async def next_request(self) -> Any:
        """The session's next model request, as it would be sent."""
        return await self.client._call(_core.next_request(self.id))

    async def cache(self) -> models.CacheReport:
        """The session's prefix-cache misses and their causes."""
        return await self.client._call(_core.cache(self.id))

    async def diff(self, other: str | AsyncSession) -> models.SessionDiff:
        """This session compared with ``other`` (its fork, say)."""
        other_id = other.id if isinstance(other, AsyncSession) else other
        return await self.client._call(_core.diff(self.id, other_id))

    async def blob(self, digest: str) -> bytes:
        """Binary content a tool returned by reference, by its SHA-256."""
        return await self.client._call(_core.blob(self.id, digest))


class _Stream(Generic[T]):
    """A resumable Server-Sent Events stream (``async for`` it; ``aclose`` it,
    or use it in an ``async with``, when done)."""

    def __init__(self, client: AsyncMneme, state: StreamState[T]) -> None:
        self._client = client
        self._state = state
        self._response: httpx.Response | None = None
        self._chunks: AsyncIterator[bytes] | None = None

    @property
    def last_event_id(self) -> str | None:
        """Where the stream is (the last event's id)."""
        return self._state.last_event_id

    @property
    def reconnects(self) -> int:
        """How many times the stream was reopened after it broke."""
        return self._state.reconnects

    async def __aenter__(self: _S) -> _S:
        if self._response is None and not self._state.closed:
            await self._open()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        self._state.closed = True
        await self._drop()

    def __aiter__(self) -> AsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        state = self._state
        while not state.pending:
            if state.closed:
                raise StopAsyncIteration
            if state.must_reconnect:
                await self._drop()
                state.broke()
            if self._chunks is None:
                await self._open()
                continue
            try:
                chunk: bytes | None = await self._chunks.__anext__()
            except StopAsyncIteration:
                chunk = None
            except httpx.TransportError:
                chunk = None
            if chunk is None:  # the daemon went (or the network): reopen
                await self._drop()
                state.broke()
                continue
            state.feed(chunk)
        return state.pending.popleft()

    async def _drop(self) -> None:
        if self._response is not None:
            try:
                await self._response.aclose()
            except httpx.HTTPError:
                pass
        self._response = None
        self._chunks = None

    async def _open(self) -> None:
        state = self._state
        http = self._client.http
        timeout = httpx.Timeout(STREAM_READ_TIMEOUT, connect=10.0)
        while True:
            request = http.build_request(
                "GET", state.path, params=state.params, headers=state.headers(), timeout=timeout
            )
            try:
                response = await http.send(request, stream=True)
            except httpx.TransportError as e:
                error = MnemeError(None, f"{self._client.base_url}: {e!r}", "GET", state.path)
            else:
                if response.status_code < 400:
                    self._response = response
                    self._chunks = response.aiter_bytes()
                    state.connected()
                    return
                await response.aread()
                await response.aclose()
                error = _core.error_of(response, "GET", state.path)
            await asyncio.sleep(state.retry_or_raise(error))


_S = TypeVar("_S", bound=_Stream[Any])


class AsyncEventStream(_Stream[models.EventRecord]):
    """A session's events as they become durable (``EventRecord``s)."""


class AsyncDeltaStream(_Stream[Delta]):
    """A session's streamed reply text as it arrives (``Delta``s)."""
