"""instrument() is transparent: an instrumented graph behaves as the graph it wraps (return types,
snapshot configs, time travel, every shape LangGraph compiles), its tracking never raises into
callbacks nor floods the app with warnings, and its delivery keeps no thread, loop or run state."""

from __future__ import annotations

import gc
import json
import threading
import time
import warnings
from typing import Literal, TypedDict

import pytest
from langchain_core.runnables import RunnableLambda
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command
from lg_apps import chat_model, software_company
from pydantic import BaseModel

from kvflow_orch.langgraph import TrackingWarning, UndeclaredTargetsWarning, handler_of, instrument
from kvflow_orch.hinting import WorkflowHints
from kvflow_orch.langgraph._delivery import Delivery, Snapshot


class S(TypedDict, total=False):
    x: int
    path: list


class Model(BaseModel):
    x: int = 0


def test_typed_output_and_every_attribute_survive(server):
    g = StateGraph(Model)
    g.add_node("a", lambda s: {"x": s.x + 1})
    g.add_edge(START, "a")
    compiled = g.compile()
    app = instrument(compiled, backend_url=server.url)
    assert vars(app) == vars(compiled)  # nothing LangGraph set after construction is lost
    assert isinstance(app, type(compiled))
    plain, tracked = compiled.invoke({"x": 1}, version="v2"), app.invoke({"x": 1}, version="v2")
    assert type(tracked.value) is type(plain.value) is Model and tracked.value.x == 2
    assert handler_of(app.with_config(tags=["t"])) is handler_of(app)  # LangGraph's copies keep it


def test_destinations_dict_keys_are_targets(server, strict_tracking):
    def a(state: S) -> Command:
        return Command(goto="b")

    g = StateGraph(S)
    g.add_node("a", a, destinations={"b": "label_b", END: "stop"})
    g.add_node("b", lambda s: {"x": 1})
    g.add_edge(START, "a")
    app = instrument(g.compile(), backend_url=server.url)
    assert app.invoke({}) == {"x": 1}
    assert handler_of(app).open_runs == 0


@pytest.mark.parametrize("inner", ["plain", "instrumented"])
def test_graphs_langgraph_runs_are_never_refused(server, strict_tracking, inner):
    child = StateGraph(S)
    child.add_node("hand_off", lambda s: Command(graph=Command.PARENT, goto="finish", update={"x": 7}))
    child.add_edge(START, "hand_off")

    def boom(state: S) -> dict:
        raise ValueError("boom")

    g = StateGraph(S)
    team = child.compile()
    g.add_node("team", team if inner == "plain" else instrument(team, backend_url=server.url))
    g.add_node("finish", lambda s: {"x": s["x"] + 1})  # reached only by the hand-off
    g.add_node("risky", boom, error_handler=lambda s: Command(goto="rescue"))
    g.add_node("rescue", lambda s: {"x": s["x"] * 10})  # reached only by the error handler
    g.add_node("orphan", lambda s: {})  # no incoming edge at all
    g.add_edge(START, "team")
    g.add_edge("finish", "risky")
    compiled = g.compile()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        app = instrument(compiled, backend_url=server.url)
    assert len([w for w in caught if issubclass(w.category, UndeclaredTargetsWarning)]) == 1
    assert app.invoke({"x": 0}) == compiled.invoke({"x": 0}) == {"x": 80}
    assert handler_of(app).open_runs == 0


def test_snapshot_configs_carry_no_handler_and_time_travel_attaches_it_once(server):
    g = StateGraph(S)
    g.add_node("a", lambda s: {"path": (s.get("path") or []) + ["a"]})
    g.add_node("b", lambda s: {"path": s["path"] + ["b"]})
    g.add_edge(START, "a")
    g.add_edge("a", "b")
    app = instrument(g.compile(checkpointer=InMemorySaver()), backend_url=server.url)
    config = {"configurable": {"thread_id": "tt"}}
    app.invoke({}, config)
    snapshot = app.get_state(config)
    assert "callbacks" not in snapshot.config
    json.dumps(snapshot.config)
    before_b = next(s for s in app.get_state_history(config) if s.next == ("b",))
    starts = []
    handler = handler_of(app)
    handler.on_chain_start = lambda *a, **kw: starts.append(kw.get("name"))  # counts the root's starts
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", TrackingWarning)  # replayed from a checkpoint: steps resync later
        assert app.invoke(None, {**before_b.config, "callbacks": [handler]}) == {"path": ["a", "b"]}
    assert starts.count("LangGraph") == 1


def test_chain_node_with_path_map_router_tracks_without_errors(server, strict_tracking):
    def route(state: S) -> str:
        return "go"

    g = StateGraph(S)
    g.add_node("a", RunnableLambda(lambda s: {"x": 1}) | RunnableLambda(lambda s: {"x": s["x"] + 1}))
    g.add_node("b", lambda s: {"x": 5})
    g.add_edge(START, "a")
    g.add_conditional_edges("a", route, {"go": "b", "stop": END})
    app = instrument(g.compile(), backend_url=server.url)
    for _ in range(3):
        assert app.invoke({}) == {"x": 5}
    assert handler_of(app).open_runs == 0


def test_tracking_warnings_are_one_per_kind_and_filterable(server):
    def a(state: S) -> Command[Literal["b"]]:
        return Command(goto="c")  # not what it declares

    g = StateGraph(S)
    g.add_node("a", a)
    g.add_node("b", lambda s: {})
    g.add_node("c", lambda s: {})
    g.add_edge(START, "a")
    app = instrument(g.compile(), backend_url=server.url)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(20):
            app.invoke({})
    kinds = [str(w.message) for w in caught if issubclass(w.category, TrackingWarning)]
    assert 1 <= len(kinds) <= 3 and len(set(kinds)) == len(kinds)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", category=TrackingWarning)
        warnings.filterwarnings("ignore", category=UndeclaredTargetsWarning)
        app2 = instrument(g.compile(), backend_url=server.url)
        app2.invoke({})


def test_backend_url_may_be_the_openai_base_url(server, strict_tracking):
    app = instrument(software_company(server.url), namespace="shop", backend_url=server.url + "/v1/")
    app.invoke({"run": "v1"}, {"metadata": {"kvflow_workflow_id": "wf-v1"}})
    handler_of(app).backend.flush()
    assert all(h is not None and h["workflow_id"] == "wf-v1" for h in server.hints())
    assert server.steps_updates() and server.steps_updates()[-1]["done"] is True


def _kvflow_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("kvflow-langgraph")]


def _wait_idle(timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while _kvflow_threads() and time.monotonic() < deadline:
        time.sleep(0.02)


def test_nested_instrumented_graph_keeps_no_run_state_or_thread(server):
    llm = chat_model(server.url)

    def ask(state: S) -> dict:
        llm.invoke("hi")
        return {"x": 1}

    inner_g = StateGraph(S)
    inner_g.add_node("ask", ask)
    inner_g.add_edge(START, "ask")
    inner = instrument(inner_g.compile(), backend_url=server.url)
    outer_g = StateGraph(S)
    outer_g.add_node("call", lambda s: inner.invoke({}))
    outer_g.add_edge(START, "call")
    outer = instrument(outer_g.compile(), backend_url=server.url)
    for _ in range(10):
        assert outer.invoke({}) == {"x": 1}
    handler_of(outer).backend.flush()
    assert len(server.steps_updates()) >= 10
    inner = outer = None  # drop the graphs (the lambda still names `inner`)
    _wait_idle()
    gc.collect()
    kinds = {type(o).__name__ for o in gc.get_objects() if type(o).__name__ in ("SyncPregelLoop", "LiveWorkflow")}
    assert kinds == set()
    assert _kvflow_threads() == []


def test_delivery_queue_is_bounded_coalesced_and_drops_unannounced_workflows():
    gate = threading.Event()
    d = Delivery(max_pending=2, idle_s=0.2)

    def probe() -> bool:
        gate.wait(5)
        return False  # nothing is posted: the test watches the queue only

    def update(wid: str, done: bool = False) -> Snapshot:
        return Snapshot(WorkflowHints(wid), {"a": 1.0}, done)

    d.put("http://x", (), update("w0"), probe, announced=True)  # taken by the thread, held by the gate
    time.sleep(0.1)
    for wid in ("w1", "w1", "w2", "w3"):
        d.put("http://x", (), update(wid), probe, announced=True)
    assert d.pending() == 2 and d.dropped == 1  # w1 coalesced, then dropped for w3
    d.put("http://x", (), update("w3", done=True), probe, announced=False)
    assert d.pending() == 1  # w3 ended before the server heard of it
    gate.set()
    assert d.flush(5)
    time.sleep(0.5)
    assert not d.running


def test_a_graph_called_in_a_node_keeps_the_runs_callbacks(server):
    from langchain_core.callbacks import BaseCallbackHandler

    class Runs(BaseCallbackHandler):
        def __init__(self) -> None:
            self.starts: list[str] = []

        def on_chain_start(self, serialized, inputs, *, run_id, parent_run_id=None, **kw) -> None:
            self.starts.append(kw.get("name"))

    inner_g = StateGraph(S)
    inner_g.add_node("inner_node", lambda s: {"x": 1})
    inner_g.add_edge(START, "inner_node")
    inner = instrument(inner_g.compile(), backend_url=server.url)
    outer_g = StateGraph(S)
    outer_g.add_node("call", lambda s: inner.invoke({}))
    outer_g.add_edge(START, "call")
    runs = Runs()
    outer_g.compile().invoke({}, {"callbacks": [runs]})
    assert "inner_node" in runs.starts  # the inner graph's runs still reach the caller's tracer
