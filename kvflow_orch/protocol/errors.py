"""The errors the protocol raises."""

from __future__ import annotations

__all__ = ["HintError", "HintLocationError"]


class HintError(ValueError):
    """A hint or steps update that does not follow the protocol; the message names the field.

    A ValueError, so pydantic validators may raise it and report the field it belongs to.
    ``status`` is the HTTP status a server answers it with (422 unless the body was not JSON).
    """

    def __init__(self, message: str, *, status: int = 422) -> None:
        super().__init__(message)
        self.status = status


class HintLocationError(ValueError):
    """A server's ``/kvflow/v1/info`` names no hint location this client knows (or names them in
    a shape it cannot read); the message names the server's locations and the client's."""
