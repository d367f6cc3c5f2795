"""`kvflow bench sim`: table, JSON and PNG outputs of a small run, and clear errors for bad input."""

from __future__ import annotations

import io
import json
from contextlib import redirect_stderr, redirect_stdout

from kvflow_orch.cli import main as kvflow_main


def _run(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        rc = kvflow_main(argv)
    return rc, out.getvalue(), err.getvalue()


def test_sim_prints_the_table_and_writes_json_and_plots(tmp_path):
    rc, out, _ = _run(["bench", "sim", "--fixed", "4096", "--agents", "4", "--rounds", "2",
                       "--device-tokens", "10000", "--out", str(tmp_path)])
    assert rc == 0
    header = out.splitlines()[0]
    for column in ("latency s", "vs hicache", "vs gpu-only", "gap to inf", "dev hit"):
        assert column in header
    data = json.loads((tmp_path / "results.json").read_text())
    systems = {row["system"] for row in data["rows"]}
    assert systems == {"gpu-only", "hicache", "kvflow-evict", "kvflow", "kvflow-learned", "belady", "infinite"}
    by = {row["system"]: row for row in data["rows"]}
    assert by["hicache"]["speedup_vs_hicache"] == 1.0
    assert by["kvflow"]["latency_s"] < by["gpu-only"]["latency_s"]
    png = tmp_path / "synthetic.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size < 200_000


def test_bad_input_is_a_clear_error(tmp_path):
    rc, _, err = _run(["bench", "sim", "--hardware", "tpu-v9", "--out", str(tmp_path)])
    assert rc == 2 and "no hardware profile 'tpu-v9'" in err
    rc, _, err = _run(["bench", "sim", "--fixed", "20000", "--agents", "2", "--rounds", "1",
                       "--device-tokens", "10000", "--out", str(tmp_path)])
    assert rc == 2 and "can never fit in the device pool of 10000 tokens" in err
    rc, _, err = _run(["bench"])
    assert rc == 2 and "choose a subcommand" in err
    rc, _, err = _run(["bench", "replay", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path)])
    assert rc == 2 and "missing.jsonl" in err
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"v": 1, "time": 1}\n')
    rc, _, err = _run(["bench", "replay", str(bad), "--out", str(tmp_path)])
    assert rc == 2 and "bad.jsonl:1" in err


def test_impossible_workload_sizes_are_clear_errors(tmp_path):
    for argv, message in ((["--instances", "0"], "instances must be >= 1"),
                          (["--workload", "peer", "--instances", "0"], "instances must be >= 1"),
                          (["--fixed", "-5"], "fixed must be >= 0, got -5"),
                          (["--workload", "metagpt", "--output", "32", "64"], "takes one --output value"),
                          (["--workload", "peer", "--fixed", "4096"], "no --fixed or --branches")):
        rc, _, err = _run(["bench", "sim", *argv, "--out", str(tmp_path), "--no-plots"])
        assert rc == 2 and message in err, (argv, err)
