"""The routes a gateway probes, on a real server: SGLang's shapes with the engine's own figures."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from scaleout_helpers import in_process_worker, wait_for


@pytest.fixture(scope="module")
def url():
    with in_process_worker(device_tokens=2048) as worker:
        yield worker.url


def test_model_info_and_version_name_the_model(url: str) -> None:
    for route in ("/model_info", "/get_model_info"):
        info = httpx.get(url + route).json()
        assert info["model_path"] == info["served_model_name"] == "tiny-random"
        assert info["is_generation"] is True
    assert httpx.get(url + "/version").json()["version"] == httpx.get(url + "/kvflow/v1/info").json()["version"]
    for route in ("/server_info", "/get_server_info"):
        info = httpx.get(url + route).json()
        assert info["served_model_name"] == "tiny-random"
        assert info["max_total_num_tokens"] == 2048
        assert info["kvflow"]["policy"] == "kvflow"


def test_loads_report_running_requests_and_tokens_in_use(url: str) -> None:
    idle = httpx.get(url + "/v1/loads").json()["loads"][0]
    assert idle["num_running_reqs"] == idle["num_waiting_reqs"] == 0
    assert idle["num_total_tokens"] == 2048
    body = {"model": "tiny-random", "messages": [{"role": "user", "content": "x" * 200}],
            "max_tokens": 400, "ignore_eos": True}
    thread = threading.Thread(target=lambda: httpx.post(url + "/v1/chat/completions", json=body, timeout=120))
    thread.start()
    try:
        seen: list[dict] = []

        def busy() -> bool:
            seen.append(httpx.get(url + "/get_load").json()[0])
            return seen[-1]["num_reqs"] >= 1

        wait_for(busy, 30, "/get_load to show the running request")
        assert seen[-1]["num_tokens"] > 200 and seen[-1]["load"] >= 1
        loads = httpx.get(url + "/loads", params={"model": "tiny-random"}).json()["loads"][0]
        assert loads["num_running_reqs"] + loads["num_waiting_reqs"] >= 1 or not thread.is_alive()
    finally:
        thread.join(120)
    after = httpx.get(url + "/v1/loads").json()["loads"][0]
    assert after["num_running_reqs"] == 0 and after["num_used_tokens"] > 0  # the prompt stays cached
    assert 0 < after["token_usage"] <= 1


def test_health_generate_runs_one_token(url: str) -> None:
    started = time.monotonic()
    answer = httpx.get(url + "/health_generate", timeout=60)
    assert answer.status_code == 200 and answer.json() == {"status": "ok", "generated": True}
    assert time.monotonic() - started < 30


@pytest.mark.parametrize(("route", "params", "status", "code", "param"), [
    ("/loads", {"model": "other-model"}, 404, "model_not_found", "model"),
    ("/v1/loads", {"dp_rank": 1}, 400, "invalid_value", "dp_rank"),
    ("/v1/loads", {"format": "prometheus"}, 400, "invalid_value", "format"),
    ("/v1/loads", {"dp_rank": "x"}, 400, "invalid_value", "dp_rank"),
])
def test_bad_requests_get_the_openai_error_shape(url: str, route: str, params: dict, status: int, code: str,
                                                 param: str | None) -> None:
    answer = httpx.get(url + route, params=params)
    assert answer.status_code == status
    error = answer.json()["error"]
    assert error["code"] == code and error["param"] == param and error["message"]


def test_flush_cache_empties_the_cache_and_the_next_prompt_is_computed_again(url: str) -> None:
    body = {"model": "tiny-random", "messages": [{"role": "user", "content": "flush me " * 20}], "max_tokens": 8,
            "temperature": 0}
    first = httpx.post(url + "/v1/chat/completions", json=body, timeout=60).json()
    assert httpx.get(url + "/kvflow/v1/stats").json()["device_used"] > 0
    answer = httpx.post(url + "/flush_cache")  # bodiless, as smg fans it out
    assert answer.status_code == 200 and answer.json()["status"] == "ok"
    assert answer.json()["flushed_tokens"] == answer.json()["freed_device_tokens"] > 0
    stats = httpx.get(url + "/kvflow/v1/stats").json()
    assert stats["device_used"] == stats["host_used"] == stats["nodes"] == 0
    again = httpx.post(url + "/v1/chat/completions", json=body, timeout=60).json()
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert again["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]


def test_flush_cache_while_a_request_runs_is_refused_and_changes_nothing(url: str) -> None:
    body = {"model": "tiny-random", "messages": [{"role": "user", "content": "y" * 100}],
            "max_tokens": 1500, "ignore_eos": True}
    thread = threading.Thread(target=lambda: httpx.post(url + "/v1/chat/completions", json=body, timeout=120))
    thread.start()
    try:
        wait_for(lambda: httpx.get(url + "/get_load").json()[0]["num_reqs"] >= 1, 30, "the request to run")
        used = httpx.get(url + "/kvflow/v1/stats").json()["device_used"]
        answer = httpx.post(url + "/flush_cache")
        assert answer.status_code == 400
        error = answer.json()["error"]
        assert error["code"] == "server_busy" and "1 running" in error["message"]
        assert httpx.get(url + "/kvflow/v1/stats").json()["device_used"] >= used
    finally:
        thread.join(120)
    assert httpx.post(url + "/flush_cache").status_code == 200
