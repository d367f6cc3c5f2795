"""What a run records: one :class:`NodeRecord` per node execution and one :class:`CallRecord` per
LLM call, plus the JSONL file ``kvflow run --record`` writes for replay by the simulator.

Record file format (version 1), one JSON object per line, one line per LLM call, in call order::

    {"v": 1,                       # format version
     "time": 1764470000.123,       # wall clock (Unix seconds) when the call was sent
     "offset_s": 0.52,             # seconds since the workflow started
     "duration_s": 1.9,            # seconds until the reply arrived
     "workflow_id": "metagpt-3f2a", "namespace": "default",
     "node": "qa_1", "agent": "qa",
     "hint": {...} | null,         # the KVFlowHint exactly as put on the wire (null: none sent)
     "prompt_tokens": 1234,        # as reported by the backend
     "fixed_tokens": 1100 | null,  # tokens of the agent's fixed prefix (null: backend did not say)
     "completion_tokens": 32,
     "cached_tokens": 1024}        # prompt tokens the backend did not recompute

``dynamic`` tokens of a call are ``prompt_tokens - fixed_tokens`` when ``fixed_tokens`` is known.
Readers must ignore unknown keys; a new incompatible layout bumps ``v``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

__all__ = ["FORMAT_VERSION", "NodeRecord", "CallRecord", "write_calls", "read_calls"]

FORMAT_VERSION = 1


@dataclass(frozen=True)
class NodeRecord:
    """One execution of one node; times are seconds since the workflow started."""

    node: str
    agent: str | None
    start: float
    end: float
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    llm_calls: int = 0


@dataclass(frozen=True)
class CallRecord:
    time: float
    offset_s: float
    duration_s: float
    workflow_id: str
    namespace: str
    node: str
    agent: str
    hint: dict[str, Any] | None
    prompt_tokens: int
    fixed_tokens: int | None
    completion_tokens: int
    cached_tokens: int

    def to_json(self) -> str:
        return json.dumps({"v": FORMAT_VERSION, **asdict(self)}, separators=(",", ":"))

    @classmethod
    def from_json(cls, line: str) -> "CallRecord":
        data = json.loads(line)
        if not isinstance(data, dict):
            raise ValueError(f"expected a JSON object, got {type(data).__name__}")
        version = data.pop("v", None)
        if version != FORMAT_VERSION:
            raise ValueError(f"trace record version {version!r} is not supported (expected {FORMAT_VERSION})")
        fields = cls.__dataclass_fields__
        return cls(**{k: v for k, v in data.items() if k in fields})


def write_calls(calls: Iterable[CallRecord], out: IO[str]) -> int:
    n = 0
    for call in calls:
        out.write(call.to_json() + "\n")
        n += 1
    return n


def read_calls(path: str | Path) -> Iterator[CallRecord]:
    """Records of a ``--record`` file; a malformed line raises ValueError naming its number."""
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield CallRecord.from_json(line)
            except (ValueError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not a kvflow call record: {exc}") from None
