"""``kvflow graph --server URL``: the agents and transitions a server learned, as text or Mermaid."""

from __future__ import annotations

import sys
from typing import Any

from ..protocol import LEARNED_ROUTE

__all__ = ["print_learned", "describe", "to_mermaid"]
END_LABEL = "END"


def print_learned(url: str, *, api_key: str | None, mermaid: bool) -> int:
    """Exit status: 0 printed, 1 the server answered with an error, 2 it could not be reached."""
    import httpx

    headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        response = httpx.get(url.rstrip("/") + LEARNED_ROUTE, headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        print(f"kvflow graph: cannot reach {url}: {exc}", file=sys.stderr)
        return 2
    if response.status_code != 200:
        try:
            message = response.json()["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = response.text[:200]
        print(f"kvflow graph: {url} answered {response.status_code}: {message}", file=sys.stderr)
        return 1
    learned = response.json()
    sys.stdout.write(to_mermaid(learned) if mermaid else describe(learned))
    return 0


def describe(learned: dict[str, Any]) -> str:
    stats = learned.get("stats", {})
    agents = learned.get("agents", [])
    out = [f"learned agents: {len(agents)} (live sessions {stats.get('live_sessions', 0)}; requests: "
           f"{stats.get('learned_hint_requests', 0)} learned-hint, {stats.get('declared_hint_requests', 0)} "
           f"declared-hint, {stats.get('unhinted_requests', 0)} unhinted)"]
    width = max((len(a["name"]) for a in agents), default=0)
    out += [f"  {a['name']:<{width}}  {a['requests']} requests" for a in agents]
    for namespace, model in sorted(learned.get("namespaces", {}).items()):
        out += ["", f"transitions in namespace {namespace} (probability, decayed count):"]
        for t in model["transitions"]:
            out.append(f"  {t['from']} -> {t['to'] or END_LABEL}  {t['probability']:.3f} ({t['weight']:g})")
    return "\n".join(out) + "\n"


def to_mermaid(learned: dict[str, Any]) -> str:
    """A flowchart with one node per agent (ids ``a0``, ``a1``... so that any name is safe) and an
    edge per transition labelled with its probability."""
    ids: dict[str | None, str] = {None: "END"}
    lines = ["flowchart LR"]

    def node(name: str | None) -> str:
        if name not in ids:
            ids[name] = f"a{len(ids) - 1}"
            lines.append(f'    {ids[name]}["{_label(name)}"]')
        return ids[name]

    for agent in learned.get("agents", []):
        node(agent["name"])
    edges = []
    for model in learned.get("namespaces", {}).values():
        for t in model["transitions"]:
            edges.append(f"    {node(t['from'])} -->|{t['probability']:.2f}| {node(t['to'])}")
    if any(t["to"] is None for m in learned.get("namespaces", {}).values() for t in m["transitions"]):
        lines.append(f"    END(({END_LABEL}))")
    return "\n".join(lines + edges) + "\n"


def _label(name: str | None) -> str:
    return str(name).replace('"', "'")
