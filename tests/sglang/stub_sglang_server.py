"""A stand-in for ``python -m backends.sglang_kvflow.launcher`` in the CPU rehearsal of
benchmarks/sglang_gpu.sh (``KVFLOW_STUB_LAUNCH``): it builds the launch plan from the flags with
the launcher's own parser and ``build_command``, appends it to ``$STUB_LOG`` (the test feeds each
to SGLang's parser), then serves what the script talks to: /health, a chat completion, /generate,
and the kvflow routes when the plan loads the plugin.

``STUB_MODE=die`` exits right after logging (a server that dies while the script waits for it);
``STUB_MODE=idle`` answers like kvflow but never counts a hint (a plugin that did not act).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from backends.sglang_kvflow.launcher import parse_args, plan_from_args


def main() -> int:
    args, extra = parse_args(sys.argv[1:])
    plan = plan_from_args(args, extra)  # raises on a combination SGLang cannot express
    with open(os.environ["STUB_LOG"], "a") as log:
        log.write(json.dumps({"argv": plan.argv, "env": plan.env}) + "\n")
    mode = os.environ.get("STUB_MODE", "")
    if mode == "die":
        print("stub: dying at start-up", file=sys.stderr)
        return 1
    kvflow = plan.env.get("KVFLOW_SGLANG_PLUGIN") != "off"
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

    ThreadingHTTPServer((args.host, args.port), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
