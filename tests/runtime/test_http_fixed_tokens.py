"""A trace recorded over HTTP knows each call's fixed prefix: the real server reports the boundary
it used (``usage.fixed_prefix_tokens``) and ``kvflow run --record`` writes it, the same number the
embedded engine's tokenizer gives in process."""

from __future__ import annotations

import os
import subprocess
import sys

from backends.local import Engine, EngineConfig
from backends.server import create_app, serve_in_thread
from kvflow_orch.protocol import read_calls
from test_cli_run import FLOW


def test_kvflow_run_over_http_records_fixed_tokens(tmp_path) -> None:
    engine = Engine(EngineConfig.build(model="tiny-random", device_tokens=2048, host_tokens=2048))
    (tmp_path / "cli_flow.py").write_text(FLOW)
    record = tmp_path / "trace.jsonl"
    with serve_in_thread(create_app(engine)) as running:
        proc = subprocess.run(
            [sys.executable, "-m", "kvflow_orch.cli", "run", "cli_flow:workflow", "--input", '{"topic": "kv"}',
             "--backend", running.url, "--record", str(record), "--quiet"],
            capture_output=True, text=True, cwd=tmp_path,
            env={**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])},
            timeout=120,
        )
    assert proc.returncode == 0, proc.stderr
    calls = list(read_calls(record))
    assert [c.agent for c in calls] == ["writer", "editor"]
    for call, system in zip(calls, ["You write.", "You edit."], strict=True):
        expected = engine.tokenizer.encode_chat([{"role": "system", "content": system},
                                                 {"role": "user", "content": "x"}], fixed_messages=1)
        assert call.fixed_tokens == expected.fixed_prefix_tokens
        assert 0 < call.fixed_tokens < call.prompt_tokens
