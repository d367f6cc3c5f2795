"""``backend=`` forms are found through the backend registry: the built-in ones are registered by
their client modules, a new one is one ``register_backend`` call, and what no backend takes is a
ValueError naming the known backends (without loading torch to find out)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from kvflow_orch import START, Workflow
from kvflow_orch.clients import LLMClient, LLMReply, backend_names, open_client, register_backend
from kvflow_orch.runtime import run


class EchoClient(LLMClient):
    """Replies with the text after ``echo:``; records that the runtime closed it."""

    opened: list["EchoClient"] = []

    def __init__(self, backend: str) -> None:
        self.name = backend
        self.reply = backend.partition(":")[2]
        self.closed = False
        EchoClient.opened.append(self)

    @property
    def supports_hints(self) -> bool:
        return False

    async def chat(self, messages, sampling, hint) -> LLMReply:
        return LLMReply(self.reply, 1, 1, 0)

    def send_steps(self, update) -> None:
        pass

    async def flush(self, timeout: float = 5.0) -> None:
        pass

    async def aclose(self) -> None:
        self.closed = True


register_backend("echo", EchoClient)


def test_the_built_in_forms_are_registered_backends() -> None:
    assert {"local", "http", "https", "smg+http", "smg+https"} <= set(backend_names())


def test_a_registered_backend_runs_a_workflow_and_is_closed_by_the_runtime() -> None:
    wf = Workflow("echoed")
    wf.add_agent("a", system="S.", prompt="p", output="x")
    wf.add_edge(START, "a")
    result = run(wf, {}, backend="echo:hello")
    assert result.state == {"x": "hello"}
    assert EchoClient.opened[-1].name == "echo:hello" and EchoClient.opened[-1].closed


def test_a_name_is_registered_once_and_has_no_colon() -> None:
    with pytest.raises(ValueError, match="already registered"):
        register_backend("echo", EchoClient)
    with pytest.raises(ValueError, match="has a ':'"):
        register_backend("echo:v2", EchoClient)


def test_what_no_backend_takes_names_the_known_backends() -> None:
    with pytest.raises(ValueError,
                       match=r"backend 'ftp://x' not understood.*known backend names: echo, http, https, local"):
        open_client("ftp://x")
    with pytest.raises(ValueError, match="backend of type object not understood"):
        open_client(object())
    with pytest.raises(ValueError, match="WORKER_URLS must be a list"):
        open_client(("http://gateway", "http://worker"))


def test_refusing_an_unknown_object_loads_no_torch() -> None:
    code = ("import sys\nfrom kvflow_orch.clients import open_client\n"
            "try:\n    open_client(object())\nexcept ValueError:\n    pass\n"
            "print('torch' in sys.modules, 'backends.local' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]
