"""Map-reduce: a plain ``split`` node cuts ``state["text"]`` into ``n`` chunks, ``n`` mapper nodes
summarise them concurrently (one agent identity, ``mapper``, so they share one cached fixed
prompt), and an AND-join waits for all of them before the ``reducer`` agent combines the partial
summaries.

State keys: ``text`` (input), ``chunk_<i>``, ``partial_<i>``, ``summary``.
"""

from __future__ import annotations

from typing import Any, Mapping

from kvflow_orch import START, Workflow

__all__ = ["map_reduce", "workflow"]

MAPPER = """\
You summarise one chunk of a longer document for a colleague who will merge several such summaries.
Keep every fact, number and name that a reader of the full document would need; drop examples,
repetition and rhetoric. Write at most five bullet points in the order the facts appear, each one
self-contained, because the colleague will not see the chunk itself.
"""

REDUCER = """\
You merge partial summaries of consecutive chunks of one document into a single summary. Remove
duplicates across chunks, keep the original order of events, resolve references that span chunks,
and write one paragraph of at most eight sentences followed by a line "Key numbers:" listing the
figures that matter most.
"""


def _splitter(n: int):
    def split(state: Mapping[str, Any]) -> dict[str, Any]:
        words = str(state.get("text", "")).split()
        size = -(-len(words) // n) if words else 0
        return {f"chunk_{i}": " ".join(words[i * size : (i + 1) * size]) for i in range(n)}

    return split


def map_reduce(n: int = 4, max_tokens: int = 128) -> Workflow:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"map_reduce: n must be a positive integer, got {n!r}")
    wf = Workflow(f"map-reduce-{n}")
    wf.add_node("split", _splitter(n))
    mappers = [f"map_{i}" for i in range(n)]
    for i, name in enumerate(mappers):
        wf.add_agent(
            name, system=MAPPER, agent="mapper", prompt=f"Chunk {i + 1} of {n}:\n{{chunk_{i}}}", output=f"partial_{i}",
            max_tokens=max_tokens,
        )
        wf.add_edge("split", name)

    def reducer_prompt(state: Mapping[str, Any]) -> str:
        return "\n\n".join(f"Summary of chunk {i + 1}:\n{state[f'partial_{i}']}" for i in range(n))

    wf.add_agent("reducer", system=REDUCER, prompt=reducer_prompt, output="summary", max_tokens=max_tokens)
    wf.add_edge(START, "split")
    wf.add_edge(mappers, "reducer")
    return wf


#: ``kvflow graph workflows.map_reduce:workflow``
workflow = map_reduce()
