"""A client of the mneme daemon's HTTP API (``mneme serve``).

    from mneme_client import Mneme
    m = Mneme("http://127.0.0.1:7878", token=...)
    s = m.create_session(agent="billing")
    out = s.send("Charge ada 4200 cents", wait=True)
    for e in s.events(follow=True):
        ...

``AsyncMneme`` is the same, awaited. Every failure is a ``MnemeError``
carrying the daemon's message and the HTTP status. The types of what the
daemon answers are in ``mneme_client.models``, generated from its OpenAPI
document.
"""

from . import models
from ._core import Delta
from .aio import AsyncDeltaStream, AsyncEventStream, AsyncMneme, AsyncSession
from .client import DeltaStream, EventStream, Mneme, Session
from .errors import MnemeError
from .models import EventRecord, SessionStatus, SessionView, TurnOutcome

__all__ = [
    "AsyncDeltaStream",
    "AsyncEventStream",
    "AsyncMneme",
    "AsyncSession",
    "Delta",
    "DeltaStream",
    "EventRecord",
    "EventStream",
    "Mneme",
    "MnemeError",
    "Session",
    "SessionStatus",
    "SessionView",
    "TurnOutcome",
    "models",
]
