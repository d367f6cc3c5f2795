"""The one exception users see from the orchestration layer."""

from __future__ import annotations

__all__ = ["WorkflowError"]


class WorkflowError(Exception):
    """A workflow is malformed or was driven in a way its graph does not allow.

    The message always names the node, edge or key at fault.
    """
