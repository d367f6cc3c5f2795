"""A hinted request crosses SGLang's tokenizer -> scheduler socket with msgpack IPC
(``SGLANG_USE_PICKLE_IPC=0``, read by SGLang at import, hence a fresh interpreter): SGLang's real
``TokenizerManager._create_tokenized_object``, ``sock_send``/``sock_recv`` over a ZMQ pair, then the
plugin's scheduler hook on the decoded request."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.sglang

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent('''
    import json, sys
    from backends.sglang_kvflow.cpu_shims import install_import_shims
    install_import_shims()
    import msgspec, zmq
    from sglang.srt.managers import io_struct
    from sglang.srt.managers.io_struct import GenerateReqInput, TokenizedGenerateReqInput, sock_recv, sock_send
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.observability.req_time_stats import APIServerReqTimeStats
    from sglang.srt.plugins import load_plugins
    from sglang.srt.sampling.sampling_params import SamplingParams
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_tokenizer
    from types import SimpleNamespace

    load_plugins()
    from backends.sglang_kvflow.hints_bridge import validate_generate_request
    from backends.sglang_kvflow.state import get_state
    from backends.sglang_kvflow.tags import on_request_queued

    assert not io_struct._USE_PICKLE_IPC
    set_global_server_args_for_tokenizer(ServerArgs(model_path='dummy'))
    manager = object.__new__(TokenizerManager)
    manager.preferred_sampling_params = None
    manager.sampling_params_class = SamplingParams
    manager.tokenizer = None
    manager.model_config = SimpleNamespace(vocab_size=1000)
    manager.tokenized_generate_req_type = TokenizedGenerateReqInput
    manager.rid_to_state = {}
    ctx = zmq.Context()
    tx, rx = ctx.socket(zmq.PAIR), ctx.socket(zmq.PAIR)
    rx.bind("inproc://kvflow"); tx.connect("inproc://kvflow")

    def cross(custom_params, hook):
        ids = [5, 6, 7, 8]
        obj = GenerateReqInput(input_ids=ids, rid="r",
                               sampling_params={"max_new_tokens": 2, "custom_params": custom_params})
        obj.normalize_batch_and_arguments()
        if hook:
            validate_generate_request(manager, obj)
        manager.rid_to_state["r"] = SimpleNamespace(time_stats=APIServerReqTimeStats())
        tokenized = manager._create_tokenized_object(obj, "", ids)
        tokenized.wrap_pickle_fields()
        sock_send(tx, tokenized)
        try:
            got = sock_recv(rx)
        except msgspec.ValidationError as exc:
            return {"error": str(exc)}
        req = SimpleNamespace(sampling_params=got.sampling_params, origin_input_ids=list(got.input_ids))
        on_request_queued(None, req)
        return {"custom_params": got.sampling_params.custom_params}

    hint = json.loads(sys.argv[1])
    print(json.dumps({"raw": cross(hint, hook=False), "hooked": cross(hint, hook=True),
                      "steps": {a: get_state().hints.steps(("app", a)) for a in ("coder", "qa")},
                      "hinted": get_state().counters["hinted_requests"]}))
''')


def test_a_hinted_request_survives_msgpack_ipc():
    hint = {"kvflow": {"workflow_id": "wf-1", "namespace": "app", "agent": "coder",
                       "steps": {"coder": 0, "qa": 2, "pm": None}}, "other_plugin": 7}
    env = {**os.environ, "SGLANG_USE_PICKLE_IPC": "0", "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", SCRIPT, json.dumps(hint)], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # The documented nested hint, as the HTTP side receives it, is what SGLang's decoder rejects...
    assert "Expected `bool | int | float | str | null`, got `object`" in result["raw"]["error"]
    # ...the plugin's HTTP hook hands the scheduler a flat form that decodes and applies.
    flat = result["hooked"]["custom_params"]
    assert flat["other_plugin"] == 7 and "kvflow" not in flat
    assert flat["kvflow_steps"] == {"coder": 0, "qa": 2, "pm": None}
    assert result["steps"] == {"coder": 0, "qa": 2} and result["hinted"] == 1
