"""The AutoGen app (``apps/autogen_app.py``, unmodified) against the vLLM backend
(``kvflow serve --engine vllm --learned-hints`` on SmolLM2, with vLLM's own tool-call parsing
switched on as a vLLM user would), judged by vLLM's access log: every request it made got a 2xx;
and by the plugin's counters: the app sent no hint, every one of its chat requests reached vLLM's
scheduler with a learned hint, and ``/kvflow/v1/learned`` names the agents by their roles.
Run with ``.venv-vllm/bin/python -m pytest tests/frameworks -m vllm``."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import httpx
import pytest

from framework_runs import SETUP, logged_answers, run_app, venv_python
from vllm_server import HAVE_VLLM, SKIP_REASON, export_smollm2, vllm_server

pytestmark = [pytest.mark.vllm, pytest.mark.timeout(1500), pytest.mark.skipif(not HAVE_VLLM, reason=SKIP_REASON)]
FLAGS = ["--learned-hints", "--device-tokens", "2048", "--block-size", "32", "--dtype", "float32",
         "--enable-auto-tool-choice", "--tool-call-parser", "hermes"]


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    folder = tmp_path_factory.mktemp("vllm-frameworks")
    log = folder / "server.log"
    with vllm_server(export_smollm2(folder), log, FLAGS) as url:
        yield url, log


def test_autogen_app_completes_against_vllm(vllm: tuple[str, Path]) -> None:
    python = venv_python("frameworks")
    if python is None:
        pytest.skip(f"the frameworks venv is not built ({SETUP} builds it)")
    url, log = vllm
    since = log.stat().st_size
    before = httpx.get(url + "/kvflow/v1/stats", timeout=60).json()
    run = run_app(python, "autogen_app", url + "/v1")
    after = httpx.get(url + "/kvflow/v1/stats", timeout=60).json()
    answered = logged_answers(log, since)
    assert any(path == "/v1/chat/completions" for _, path, _ in answered), answered
    errors = [a for a in answered if a[2] >= 400]
    assert not errors, f"vLLM answered the app with errors {errors}; app output:\n{run.output[-4000:]}"
    assert run.summary["outcomes"][0]["messages"] == 5, run.summary
    chats = sum(1 for _, path, _ in answered if path == "/v1/chat/completions")
    learned = after["learner"]["learned_hint_requests"] - before["learner"]["learned_hint_requests"]
    hinted = after["hinted_requests"] - before["hinted_requests"]
    assert after["learner"]["enabled"] and learned == chats and hinted >= chats, (before, after, chats)
    view = httpx.get(url + "/kvflow/v1/learned", timeout=60).json()
    assert view["namespace"] == "learned" and len(view["agents"]) >= 2, view
