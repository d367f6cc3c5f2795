"""Stand-ins for SGLang's server where SGLang cannot run (no GPU), in two places:

* ``python stub_sglang_server.py LAUNCHER FLAGS``: for ``python -m backends.sglang_kvflow.launcher``
  in the CPU rehearsal of benchmarks/sglang_gpu.sh (``KVFLOW_STUB_LAUNCH``). It builds the launch
  plan from the flags with the launcher's own parser and ``build_command`` and appends it to
  ``$STUB_LOG`` (the test feeds each to SGLang's parser).
* :func:`launch_server`: for ``python -m sglang.launch_server SGLANG FLAGS``, the command
  ``kvflow serve --engine sglang`` runs (a test puts a ``sglang.launch_server`` module calling it on
  the path). It appends its command line to ``$STUB_LOG`` and, like SGLang, starts helper
  processes first: here the worst an engine can leave behind (tests/launch/engine_like.py; their
  pids go to ``$STUB_PIDS``).

Both then serve what their callers talk to: /health, a chat completion, /generate, and the kvflow
routes when the plugin is on. ``STUB_MODE=die`` exits right after logging (a server that dies while
the script waits for it); ``STUB_MODE=idle`` answers like kvflow but never counts a hint (a plugin
that did not act).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from backends.sglang_kvflow.launcher import parse_args, plan_from_args

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "launch"))
from engine_like import start_helpers


def main() -> int:
    args, extra = parse_args(sys.argv[1:])
    plan = plan_from_args(args, extra)  # raises on a combination SGLang cannot express
    _log({"argv": plan.argv, "env": plan.env})
    if _dies():
        return 1
    return serve(args.host, args.port, kvflow=plan.env.get("KVFLOW_SGLANG_PLUGIN") != "off")


def launch_server(argv: list[str] | None = None) -> int:
    """``python -m sglang.launch_server`` for ``kvflow serve --engine sglang``: log the command line,
    start the helpers, serve."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    args, _ = parser.parse_known_args(argv)
    _log({"argv": [sys.executable, "-m", "sglang.launch_server", *(sys.argv[1:] if argv is None else argv)],
          "env": {k: v for k, v in os.environ.items() if k.startswith(("KVFLOW_", "SGLANG_"))}})
    if _dies():
        return 1
    helpers = start_helpers()
    if pids := os.environ.get("STUB_PIDS"):
        with open(pids, "w") as out:
            out.write(json.dumps({"leader": os.getpid(), "helpers": helpers}))
    return serve(args.host, args.port, kvflow=os.environ.get("KVFLOW_SGLANG_PLUGIN") != "off")


def _log(record: dict) -> None:
    if path := os.environ.get("STUB_LOG"):
        with open(path, "a") as log:
            log.write(json.dumps(record) + "\n")


def _dies() -> bool:
    if os.environ.get("STUB_MODE", "") == "die":
        print("stub: dying at start-up", file=sys.stderr)
        return True
    return False


def serve(host: str, port: int, *, kvflow: bool) -> int:
    mode = os.environ.get("STUB_MODE", "")
    counters: Counter[str] = Counter()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *_: object) -> None:
            pass

        def _reply(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _count(self, custom: dict | None) -> bool:
            hint = (custom or {}).get("kvflow")
            if hint is None:
                return True
            if any(v is not None and v < 0 for v in hint.get("steps", {}).values()):
                return False
            if kvflow and mode != "idle":
                counters["hinted_requests"] += 1
                counters["tagged_requests"] += 1
            return True

        def do_GET(self) -> None:
            if self.path == "/health":
                self._reply(200, {})
            elif self.path == "/kvflow/v1/info" and kvflow:
                self._reply(200, {"backend": "sglang", "policy": "kvflow"})
            elif self.path == "/kvflow/v1/stats" and kvflow:
                self._reply(200, {"counters": dict(counters)})
            else:
                self._reply(404, {"detail": "Not Found"})

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if self.path == "/v1/chat/completions":
                if not self._count(body.get("custom_params")):
                    return self._reply(400, {"error": {"message": "steps.geo: must be >= 0"}})
                self._reply(200, {"choices": [{"message": {"content": "The capital of France is Paris."}}]})
            elif self.path == "/generate":
                sampling = body["sampling_params"]
                self._count(sampling.get("custom_params"))
                self._reply(200, {"text": "", "meta_info": {"completion_tokens": sampling["max_new_tokens"]}})
            elif self.path == "/kvflow/v1/steps" and kvflow:
                self._reply(200, {"ok": True})
            else:
                self._reply(404, {"detail": "Not Found"})

    ThreadingHTTPServer((host, port), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
