"""Agent tags on the radix tree: which nodes hold an agent's fixed prefix (the kvflow key's input).

An agent's fixed prefix (explicit, or inferred by :class:`~backends.kvcache.segment.Segmenter`)
is tagged on every node from the root to its end, splitting the node at the boundary, so that the
dynamic suffix below stays untagged. A moved boundary untags the old path. The table of fixed
prefixes is bounded in agents and tokens; an agent forgotten there loses its tags.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .hints import AgentRef

if TYPE_CHECKING:
    from .cache import KVCache
    from .radix import Node

__all__ = ["TaggingMixin"]


class TaggingMixin:
    def fixed_prefix(self: KVCache, agent: AgentRef) -> tuple[int, ...] | None:
        """The agent's current fixed-prefix tokens (``None`` when unknown)."""
        return self._fixed.get(agent)

    def _tag_fixed_prefix(self: KVCache, ref: AgentRef, fixed: tuple[int, ...]) -> None:
        old = self._fixed.pop(ref, None)
        if old is not None:
            self._fixed_total -= len(old)
            if old != fixed:
                self._untag(ref, old)
        if not fixed:
            self.hints.note_fixed_tokens(ref, 0)
            return
        self._fixed[ref] = fixed
        self._fixed_total += len(fixed)
        # The agent just tagged always stays (as in the Segmenter): forgetting it here would leave
        # its tags on the tree with no record to untag them by when its boundary moves.
        while len(self._fixed) > 1 and (len(self._fixed) > self.config.max_tracked_agents
                                        or self._fixed_total > self.config.tracked_tokens):
            gone, tokens = self._fixed.popitem(last=False)  # least recently seen agent
            self._fixed_total -= len(tokens)
            self._untag(gone, tokens)
        path, matched = self.tree.walk(fixed)  # splits the node at the boundary
        for node in path:
            if node.tags is None:
                node.tags = set()
            node.tags.add(ref)
        self.hints.note_fixed_tokens(ref, len(fixed))

    def _untag(self: KVCache, ref: AgentRef, fixed: tuple[int, ...]) -> None:
        self._untag_epoch += 1
        for node in self._covering(fixed):
            if node.tags:
                node.tags.discard(ref)

    def _covering(self: KVCache, tokens: tuple[int, ...]) -> list[Node]:
        """Nodes along ``tokens`` without splitting (the last may extend past the end)."""
        out, node, pos = [], self.tree.root, 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None or tokens[pos:pos + len(child)] != child.key[:len(tokens) - pos]:
                break
            out.append(child)
            pos += len(child)
            node = child
        return out
