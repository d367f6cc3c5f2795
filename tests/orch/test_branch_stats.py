"""BranchStats: smoothing, decay, bounds, persistence, concurrency, bad input."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from kvflow_orch import END, BranchStats


def test_uniform_before_any_observation():
    stats = BranchStats()
    assert stats.probabilities("wf", "r", ["a", "b", END]) == pytest.approx({"a": 1 / 3, "b": 1 / 3, END: 1 / 3})
    assert stats.probabilities("wf", "r") == {}


def test_smoothed_frequencies():
    stats = BranchStats(alpha=1.0)
    for target in ["a"] * 7 + ["b"] * 1:
        stats.observe("wf", "r", target)
    probs = stats.probabilities("wf", "r", ["a", "b", "c"])
    assert probs == pytest.approx({"a": 8 / 11, "b": 2 / 11, "c": 1 / 11})
    assert sum(probs.values()) == pytest.approx(1.0)
    # another router and another workflow are untouched
    assert stats.probabilities("wf", "other", ["a", "b"]) == pytest.approx({"a": 0.5, "b": 0.5})
    assert stats.probabilities("wf2", "r", ["a", "b"]) == pytest.approx({"a": 0.5, "b": 0.5})


def test_fan_out_counts_inclusion_and_none_counts_a_decision():
    stats = BranchStats(alpha=0.5)
    stats.observe("wf", "r", ["a", "b"])
    stats.observe("wf", "r", None)
    assert stats.decisions("wf", "r") == 2
    assert stats.probabilities("wf", "r", ["a", "b"]) == pytest.approx({"a": 1.5 / 3, "b": 1.5 / 3})


def test_decay_follows_a_drifting_app():
    stats = BranchStats(decay=0.9)
    for _ in range(200):
        stats.observe("wf", "r", "old")
    for _ in range(60):
        stats.observe("wf", "r", "new")
    probs = stats.probabilities("wf", "r", ["old", "new"])
    assert probs["new"] > 0.9  # about (10 + 1) / (10 + 2): the window is ~10 decisions
    frozen = BranchStats()
    for t in ["old"] * 200 + ["new"] * 60:
        frozen.observe("wf", "r", t)
    assert frozen.probabilities("wf", "r", ["old", "new"])["new"] < 0.3


def test_bounded_routers_and_targets():
    stats = BranchStats(max_routers=3, max_targets=2)
    for i in range(10):
        stats.observe("wf", f"r{i}", "a")
    assert len(stats) == 3
    assert stats.routers() == [("wf", "r7"), ("wf", "r8"), ("wf", "r9")]
    for t in ["a", "a", "a", "b", "b", "c"]:
        stats.observe("wf", "r9", t)
    assert set(stats.to_json()["routers"][-1]["counts"]) == {"a", "c"}  # b was the rarest when c came


def test_save_load_round_trip(tmp_path):
    stats = BranchStats(alpha=0.5, decay=0.99)
    for t in ["a", "b", "a", END]:
        stats.observe("wf", "r", t)
    stats.observe("wf", "__start__", "x")
    path = tmp_path / "stats.json"
    stats.save(path)
    data = json.loads(path.read_text())
    assert data["version"] == 1
    loaded = BranchStats.load(path)
    assert loaded.alpha == 0.5 and loaded.decay == 0.99
    assert loaded.probabilities("wf", "r", ["a", "b", END]) == stats.probabilities("wf", "r", ["a", "b", END])
    assert loaded.routers() == stats.routers()
    assert not list(tmp_path.glob(".*.tmp"))


@pytest.mark.parametrize(
    "content, message",
    [
        ("not json", "not JSON"),
        ('{"version": 99}', "unsupported format version"),
        ('[1, 2]', "expected a JSON object"),
        ('{"version": 1, "routers": [{"workflow": "w"}]}', "routers[0] is malformed"),
        ('{"version": 1, "routers": [{"workflow": "w", "router": "r", "decisions": -1, "counts": {}}]}', "negative"),
    ],
)
def test_load_rejects_bad_files(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        BranchStats.load(path)


@pytest.mark.parametrize("kwargs", [{"alpha": 0}, {"alpha": float("nan")}, {"decay": 0}, {"decay": 1.5},
                                    {"max_routers": 0}, {"max_targets": True}])
def test_bad_settings(kwargs):
    with pytest.raises(ValueError):
        BranchStats(**kwargs)


def test_bad_observations():
    stats = BranchStats()
    with pytest.raises(ValueError, match="workflow"):
        stats.observe("", "r", "a")
    with pytest.raises(ValueError, match="targets"):
        stats.observe("wf", "r", [3])
    assert len(stats) == 0


def test_threads_lose_no_observation():
    stats = BranchStats()

    def worker(k):
        for i in range(500):
            stats.observe("wf", "r", f"t{(k + i) % 4}")
            stats.probabilities("wf", "r")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert stats.decisions("wf", "r") == 4000
    assert sum(stats.to_json()["routers"][0]["counts"].values()) == 4000
    assert stats.version == 4000


def test_tasks_share_one_instance():
    stats = BranchStats()

    async def main():
        async def one(k):
            for _ in range(100):
                stats.observe("wf", "r", "a" if k % 2 else "b")
                await asyncio.sleep(0)

        await asyncio.gather(*(one(k) for k in range(10)))

    asyncio.run(main())
    assert stats.probabilities("wf", "r", ["a", "b"]) == pytest.approx({"a": 0.5, "b": 0.5})
