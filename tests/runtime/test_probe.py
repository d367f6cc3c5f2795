"""The one reading of ``GET /kvflow/v1/info`` that every client uses (no I/O: the answers are
given): kvflow or not, where the hint goes, the one plain-server warning, an API key refusal, hint
locations this client does not know, and a gateway's workers."""

from __future__ import annotations

from kvflow_orch.clients.probe import InfoAnswer, read_info, read_worker_infos, workers_unknown
from kvflow_orch.protocol import CUSTOM_PARAMS, KV_TRANSFER_PARAMS

URL = "http://127.0.0.1:8000"
VLLM = {"model": "m", "hints": {"openai": [KV_TRANSFER_PARAMS, CUSTOM_PARAMS]}}
SGLANG = {"model": "m", "hints": {"openai": [CUSTOM_PARAMS]}}


def test_a_kvflow_info_names_the_location_and_the_model() -> None:
    probe = read_info(InfoAnswer(URL, 200, VLLM))
    assert (probe.kvflow, probe.hint_location, probe.model) == (True, KV_TRANSFER_PARAMS, "m")
    assert probe.warning is None and probe.refused is None and probe.location_error is None


def test_an_older_info_without_hints_reads_custom_params() -> None:
    probe = read_info(InfoAnswer(URL, 200, {"version": "0.1"}))
    assert (probe.kvflow, probe.hint_location, probe.model) == (True, CUSTOM_PARAMS, None)


def test_a_plain_server_gets_the_one_warning() -> None:
    for answer in (InfoAnswer(URL, 404, {"detail": "Not Found"}), InfoAnswer(URL, 200, None),
                   InfoAnswer(URL, 200, ["not", "an", "object"])):
        probe = read_info(answer)
        assert not probe.kvflow and probe.refused is None
        assert probe.warning == (f"{URL} has no /kvflow/v1/info: it is not a kvflow server, so requests carry "
                                 f"no hints and the cache will not follow the workflow")
    gone = read_info(InfoAnswer(URL, None))  # no answer at all: said so, not "not a kvflow server"
    assert not gone.kvflow and gone.warning.startswith(f"{URL} did not answer /kvflow/v1/info (unreachable), so")


def test_a_refusal_says_to_give_the_api_key() -> None:
    probe = read_info(InfoAnswer(URL, 401, {"error": "unauthorized"}))
    assert not probe.kvflow and probe.refused == 401
    assert "refused /kvflow/v1/info with HTTP 401" in probe.warning and "KVFLOW_API_KEY" in probe.warning


def test_only_unknown_locations_is_an_error_naming_both_lists() -> None:
    probe = read_info(InfoAnswer(URL, 200, {"hints": {"openai": ["headers.x-kvflow"]}}))
    assert probe.kvflow and probe.location_error is not None
    assert probe.location_error.startswith(f"{URL}/kvflow/v1/info: ")
    assert "[headers.x-kvflow]" in probe.location_error and KV_TRANSFER_PARAMS in probe.location_error


def test_a_gateway_puts_the_hint_where_every_kvflow_worker_reads_it() -> None:
    answers = [InfoAnswer("http://w0", 200, VLLM), InfoAnswer("http://w1", None), InfoAnswer("http://w2", 200, SGLANG)]
    probe = read_worker_infos(URL, answers)
    assert (probe.kvflow, probe.hint_location, probe.warning) == (True, CUSTOM_PARAMS, None)
    assert read_worker_infos(URL, answers[:2]).hint_location == KV_TRANSFER_PARAMS  # the one kvflow worker


def test_a_gateway_without_kvflow_workers_names_them_in_the_warning() -> None:
    probe = read_worker_infos(URL, [InfoAnswer("http://w0", 404), InfoAnswer("http://w1", None)])
    assert not probe.kvflow
    assert f"{URL} is a gateway none of whose workers (http://w0, http://w1) answers /kvflow/v1/info" in probe.warning
    unknown = workers_unknown(URL, "GET /workers answered HTTP 404")
    assert not unknown.kvflow and "whose workers are unknown: GET /workers answered HTTP 404" in unknown.warning
