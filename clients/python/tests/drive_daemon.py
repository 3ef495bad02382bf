"""Drives a real daemon with mneme_client as a user would; run by
cli/tests/clients.rs, which starts the daemon (MNEME_URL, MNEME_TOKEN), an
agent `billing` whose `refund` waits for approval, and its model.

It creates a session, sends a message and gets the turn's outcome (a call
waiting for approval), follows the session's events, asks the test to
restart the daemon (a line `RESTART` on stdout; the test answers on stdin
once the new daemon listens), approves the call with edited arguments, and
follows the same stream (reopened with Last-Event-ID, read by a thread
while the daemon is away) to the answer. Then
it streams a reply's text, forks and erases the fork, reads the session
back with the async face, and meets the daemon's errors. The last line it
prints is `RESULT ` and a JSON object of what it saw, which the test checks
against the daemon's record.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
from typing import Any

from mneme_client import AsyncMneme, Delta, EventRecord, Mneme, MnemeError, TurnOutcome, models

URL = os.environ["MNEME_URL"]
TOKEN = os.environ["MNEME_TOKEN"]
CLOSED = os.environ["MNEME_CLOSED_URL"]  # where nothing listens
MISSING = "0192a000-0000-7000-8000-000000000000"


def error_of(call: Any) -> dict[str, Any]:
    """The MnemeError `call` raises, as JSON."""
    try:
        call()
    except MnemeError as e:
        return {"status": e.status, "message": e.message, "text": str(e)}
    raise AssertionError(f"{call} raised nothing")


def is_answer(event: EventRecord) -> bool:
    """The model's final reply of a turn: text and no calls."""
    fields = event.event.get(event.kind) or {}  # an event is {KIND: {its fields}}
    return event.kind == "ModelReplied" and bool(fields.get("content")) and not fields.get("tool_calls")


def main() -> None:
    seen: dict[str, Any] = {}
    m = Mneme(URL, token=TOKEN, by="ada")
    assert m.health().status == "ok"

    s = m.create_session(agent="billing")
    seen["session"] = s.id
    out = s.send("Refund ada 1 cent", wait=True)
    assert isinstance(out, TurnOutcome), out
    assert out.status == models.SessionStatus.paused, out
    waiting = out.awaiting_approval or []
    seen["awaiting"] = [{"call_id": c.call_id, "tool": c.tool, "arguments": c.arguments} for c in waiting]
    call = waiting[0].call_id

    # Follow the log: history first, up to the session's head.
    head = s.get().events
    stream = s.events(follow=True)
    seqs: list[int] = []
    kinds: list[str] = []
    for event in stream:
        seqs.append(event.seq)
        kinds.append(event.kind)
        if event.seq == head:
            break
    seen["before_restart"] = stream.last_event_id

    # The daemon goes away and comes back while the stream is read: a
    # thread goes on reading it (reconnecting while the daemon is away)
    # until the answer.
    answered: list[int] = []
    failed: list[BaseException] = []

    def follow_to_the_answer() -> None:
        try:
            for event in stream:
                seqs.append(event.seq)
                kinds.append(event.kind)
                if is_answer(event):
                    answered.append(event.seq)
                    return
        except BaseException as e:  # reported by the main thread
            failed.append(e)

    print("RESTART", flush=True)
    follower = threading.Thread(target=follow_to_the_answer)
    follower.start()
    assert sys.stdin.readline().strip() == "restarted"

    decided = s.approve(call, edit_args={"n": 2})
    assert isinstance(decided, models.Decided), decided
    seen["decided"] = {"decided": decided.decided, "continuing": decided.continuing}
    follower.join(timeout=60)
    assert not follower.is_alive(), "no answer followed within 60 s"
    if failed:
        raise failed[0]
    answer_seq = answered[0] if answered else None
    stream.close()
    seen["seqs"] = seqs
    seen["kinds"] = kinds
    seen["reconnects"] = stream.reconnects
    seen["answer_seq"] = answer_seq

    # Read back.
    view = s.get()
    seen["status"] = view.status.value
    seen["answer"] = view.answer
    decisions = s.events(kind="ApprovalDecided")
    seen["approval"] = [d.event["ApprovalDecided"] for d in decisions]
    assert s.verify().ok

    # A streamed reply's text, piece by piece, while its turn runs.
    pieces: list[Delta] = []
    with s.deltas() as deltas:
        streamed = s.send("Say it in pieces", wait=True)
        assert streamed.answer, streamed
        text = ""
        for piece in deltas:
            pieces.append(piece)
            text += piece.text
            if len(text.encode()) >= len(streamed.answer.encode()):
                break
    seen["streamed_answer"] = streamed.answer
    seen["deltas"] = [{"seq": p.seq, "offset": p.offset, "text": p.text} for p in pieces]

    # What the daemon reads out of the session.
    plan = s.replay()
    seen["reads"] = {
        "replay_events": plan.events,
        "tools": [(t.name, t.effect) for t in plan.tools or []],
        "next_request_roles": [m["role"] for m in s.next_request()["messages"]],
        "cache_misses": len(s.cache().misses),
    }

    # A fork, compared, then erased (the daemon has a master key).
    fork = s.fork(at=2)
    forked = fork.get()
    seen["fork"] = {"id": fork.id, "forked_from": str(forked.forked_from), "events": forked.events}
    compared = s.diff(fork)
    seen["diff"] = {"common": compared.common_events, "answer": compared.a.answer, "fork_events": compared.b.events}
    erased = fork.erase(reason="a client test")
    seen["erased"] = {"status": erased.status.value, "erased": [str(e) for e in erased.erased or []]}

    # The daemon's errors, each as one MnemeError.
    seen["errors"] = {
        "unknown_session": error_of(lambda: m.session(MISSING).get()),
        "wrong_token": error_of(lambda: Mneme(URL, token="wrong-token-0123456789").sessions()),
        "approve_again": error_of(lambda: s.approve(call, edit_args={"n": 3})),
        "pause_idle": error_of(lambda: s.pause()),
        "erased_fork": error_of(lambda: fork.send("hello again")),
        "unreachable": error_of(lambda: Mneme(CLOSED, token=TOKEN).health()),
        "deny_decided": error_of(lambda: s.deny(call)),
        "resolve_not_in_doubt": error_of(lambda: s.resolve(call, retry=True)),
        "wake_awake": error_of(lambda: s.wake("payment-settled", {"id": 1})),
    }
    try:
        m.create_session(agent="billing", agent_toml="name = 'x'")
    except ValueError as e:
        seen["errors"]["two_agents"] = str(e)

    seen["async"] = asyncio.run(read_back_async(s.id, head))
    seen["listed"] = [str(row.session) for row in m.sessions(agent="billing")]

    # Nothing left to do: a resume answers at once; a cancel ends it.
    resumed = s.resume(wait=True)
    seen["resumed"] = {"status": resumed.status.value, "answer": resumed.answer}
    seen["cancelled"] = s.cancel().status.value
    seen["status_at_end"] = s.get().status.value
    m.close()
    print("RESULT " + json.dumps(seen), flush=True)


async def read_back_async(id: str, head: int) -> dict[str, Any]:
    """The same session, read with the async face."""
    async with AsyncMneme(URL, token=TOKEN) as m:
        s = m.session(id)
        view = await s.get()
        page = [e.seq async for e in s.events(after=head - 2, until=head)]
        followed: list[int] = []
        async with s.events(follow=True, after=head) as stream:
            async for event in stream:
                followed.append(event.seq)
                if event.seq >= head + 2:
                    break
        try:
            await m.session(MISSING).get()
            missing = None
        except MnemeError as e:
            missing = e.status
        return {"answer": view.answer, "page": page, "followed": followed, "missing": missing}


if __name__ == "__main__":
    main()
