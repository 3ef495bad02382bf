"""The one error the client raises."""

from __future__ import annotations


class MnemeError(Exception):
    """What went wrong talking to the daemon.

    ``status`` is the HTTP status the daemon answered (404, 409, ...), or
    ``None`` when no answer came (the daemon could not be reached, the
    connection broke, a stream could not be reopened in time). ``message``
    is the daemon's own reason (its ``{"error": REASON}``) or, without an
    answer, what happened. ``method`` and ``path`` name the request.
    """

    def __init__(self, status: int | None, message: str, method: str = "", path: str = "") -> None:
        self.status = status
        self.message = message
        self.method = method
        self.path = path
        asked = f"{method} {path}".strip()
        said = f"{status}" if status is not None else "no answer"
        super().__init__(f"{asked}: {said}: {message}" if asked else f"{said}: {message}")
