"""A small real HTTP server on 127.0.0.1 that records what the runtime sends.

It speaks just enough of the OpenAI chat API (and, when ``kvflow=True``, the kvflow routes) for the
runtime's HTTP client; replies are deterministic (they name the agent's user message length) so
tests can assert on state. Knobs make it misbehave the ways a real backend can.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Behaviour:
    kvflow: bool = True
    garbage: bool = False
    """Answer chat requests with a body that is not a chat completion."""
    fail_status: int | None = None
    """Answer chat requests with this HTTP status."""
    delay_s: float = 0.0
    cached_tokens: int = 3
    hints: list[str] | None = None
    """The ``hints.openai`` locations /kvflow/v1/info names (None: an info without ``hints``)."""


@dataclass
class Recorded:
    method: str
    path: str
    body: Any
    at: float = field(default_factory=time.monotonic)


class RecordingServer:
    def __init__(self, behaviour: Behaviour | None = None) -> None:
        self.behaviour = behaviour or Behaviour()
        self.requests: list[Recorded] = []
        self.down = False
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _gone(self) -> bool:
                # A stopped server drops even kept-alive connections without answering.
                if server.down:
                    self.close_connection = True
                return server.down

            def do_GET(self) -> None:
                if self._gone():
                    return
                server._record(self, None)
                if self.path == "/kvflow/v1/info" and server.behaviour.kvflow:
                    info = {"version": "test", "model": "recorder", "policy": "kvflow"}
                    if server.behaviour.hints is not None:
                        info["hints"] = {"openai": server.behaviour.hints}
                    self._send(200, info)
                elif self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": "recorder-model"}]})
                else:
                    self._send(404, {"detail": "Not Found"})

            def do_POST(self) -> None:
                if self._gone():
                    return
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw.decode(errors="replace")
                server._record(self, body)
                b = server.behaviour
                if self.path == "/kvflow/v1/steps" and b.kvflow:
                    self._send(200, {"ok": True})
                elif self.path == "/v1/chat/completions":
                    if b.delay_s:
                        time.sleep(b.delay_s)
                    if b.fail_status is not None:
                        self._send(b.fail_status, {"error": {"message": "recorder told to fail"}})
                    elif b.garbage:
                        self._send_raw(200, b"<html>not json</html>", "text/html")
                    else:
                        self._send(200, _completion(body, b.cached_tokens))
                else:
                    self._send(404, {"detail": "Not Found"})

            def _send(self, status: int, payload: Any) -> None:
                self._send_raw(status, json.dumps(payload).encode(), "application/json")

            def _send_raw(self, status: int, data: bytes, ctype: str) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    def _record(self, handler: BaseHTTPRequestHandler, body: Any) -> None:
        with self.lock:
            self.requests.append(Recorded(handler.command, handler.path, body))

    def start(self) -> "RecordingServer":
        self.thread.start()
        return self

    def stop(self) -> None:
        self.down = True
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)

    # ------------------------------------------------------------- queries
    def chats(self) -> list[dict[str, Any]]:
        with self.lock:
            return [r.body for r in self.requests if r.path == "/v1/chat/completions"]

    def steps_updates(self) -> list[dict[str, Any]]:
        with self.lock:
            return [r.body for r in self.requests if r.path == "/kvflow/v1/steps"]

    def hints(self, location: str = "custom_params.kvflow") -> list[dict[str, Any] | None]:
        """The hint of every chat request at ``location`` (a dotted path), None where it has none."""
        found = []
        for body in self.chats():
            for part in location.split("."):
                body = (body or {}).get(part)
            found.append(body)
        return found


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # Clients that cancel mid-request (the cancellation tests) break the pipe; that is expected.
        pass


def _completion(body: dict[str, Any], cached: int) -> dict[str, Any]:
    messages = body["messages"]
    user = messages[-1]["content"]
    prompt_tokens = sum(len(m["content"].split()) for m in messages)
    text = f"reply to {len(user.split())} words"
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "model": body.get("model"),
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": 4,
            "total_tokens": prompt_tokens + 4,
            "prompt_tokens_details": {"cached_tokens": min(cached, prompt_tokens)},
        },
    }
