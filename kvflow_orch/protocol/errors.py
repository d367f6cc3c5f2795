"""The one error the protocol raises."""

from __future__ import annotations

__all__ = ["HintError"]


class HintError(ValueError):
    """A hint or steps update that does not follow the protocol; the message names the field.

    A ValueError, so pydantic validators may raise it and report the field it belongs to.
    ``status`` is the HTTP status a server answers it with (422 unless the body was not JSON).
    """

    def __init__(self, message: str, *, status: int = 422) -> None:
        super().__init__(message)
        self.status = status
