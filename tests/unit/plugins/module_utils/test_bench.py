"""Tests of the benchmark arithmetic (plugins/module_utils/bench.py).

tests/fixtures/bench/llama-server-stream.txt is a real streamed chat completion recorded from
llama-server (the project's b0c1e570 build, Gemma 3 270M Q4_K_M, max_tokens 8,
stream_options.include_usage) with curl -N.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from ansible_collections.llmfleet.cluster.plugins.module_utils import bench
from hypothesis import given
from hypothesis import strategies as st

STREAM = (Path(__file__).resolve().parents[3] / "fixtures" / "bench" / "llama-server-stream.txt").read_text()
SVG = "{http://www.w3.org/2000/svg}"


def test_parse_sse_of_a_real_llama_server_stream() -> None:
    events = bench.parse_sse(STREAM.splitlines(keepends=True))
    assert all(e["object"] == "chat.completion.chunk" for e in events)
    texts = [bench.chunk_text(e) for e in events]
    assert sum(1 for t in texts if t) >= 1
    last = events[-1]
    assert last["usage"]["completion_tokens"] == 8
    assert last["timings"]["predicted_n"] == 8


def test_parse_sse_stops_at_done_and_skips_comments() -> None:
    lines = [": keep-alive\n", "event: x\n", 'data: {"a": 1}\n', "\n", "data: [DONE]\n", 'data: {"b": 2}\n']
    assert bench.parse_sse(lines) == [{"a": 1}]


def test_parse_sse_names_a_bad_payload() -> None:
    with pytest.raises(bench.BenchError, match="not JSON"):
        bench.parse_sse(["data: {oops\n"])


def _chunk(text: str) -> dict:
    return {"choices": [{"index": 0, "delta": {"content": text}}]}


def test_request_result_from_the_real_stream_uses_server_counts_and_timings() -> None:
    events = bench.parse_sse(STREAM.splitlines())
    timed = [(10.0 + 0.1 * i, e) for i, e in enumerate(events)]
    result = bench.request_result(9.5, timed, 12.0)
    first_text = next(i for i, e in enumerate(events) if bench.chunk_text(e))
    assert result["ok"] is True
    assert result["ttft"] == pytest.approx(0.5 + 0.1 * first_text)
    assert result["completion_tokens"] == 8
    assert result["prompt_tokens"] == events[-1]["usage"]["prompt_tokens"]
    assert result["prompt_tps_source"] == "server"
    assert result["prompt_tps"] == pytest.approx(events[-1]["timings"]["prompt_per_second"], rel=1e-3)
    assert result["output_tps_source"] == "server"
    assert result["output_tps"] == pytest.approx(events[-1]["timings"]["predicted_per_second"], rel=1e-3)


def test_request_result_without_server_numbers_counts_chunks() -> None:
    # vLLM-like: usage only at the end, no timings
    events = [(1.0, _chunk("a")), (1.5, _chunk("b")), (2.0, _chunk("c")), (2.5, _chunk(""))]
    events.append((2.6, {"choices": [], "usage": {"prompt_tokens": 20, "completion_tokens": 3}}))
    result = bench.request_result(0.0, events, 3.0)
    assert result["ttft"] == pytest.approx(1.0)
    assert result["completion_tokens"] == 3
    # 2 tokens after the first over 1.0 s between the first and the last text chunk
    assert result["output_tps"] == pytest.approx(2.0)
    assert result["output_tps_source"] == "client"
    # 20 prompt tokens over a 1.0 s TTFT
    assert (result["prompt_tps"], result["prompt_tps_source"]) == (pytest.approx(20.0), "ttft")


def test_request_result_of_a_failed_or_empty_request() -> None:
    assert bench.request_result(0.0, [], 1.0, status=401, error="HTTP 401")["ok"] is False
    empty = bench.request_result(0.0, [(0.5, _chunk(""))], 1.0)
    assert empty["ok"] is False
    assert "no generated text" in empty["error"]


def test_percentile_interpolates_between_ranks() -> None:
    values = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert bench.percentile(values, 50) == pytest.approx(5.5)
    assert bench.percentile(values, 95) == pytest.approx(9.55)
    assert bench.percentile([7], 95) == 7
    with pytest.raises(bench.BenchError):
        bench.percentile([], 50)


@given(st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=50), st.floats(0, 100))
def test_percentile_lies_between_min_and_max_and_is_monotonic(values: list, q: float) -> None:
    p = bench.percentile(values, q)
    assert min(values) - 1e-6 <= p <= max(values) + 1e-6
    assert bench.percentile(values, min(100.0, q + 1)) >= p - 1e-6


def test_summarize_counts_failures_and_throughput() -> None:
    results = [
        {"ok": True, "ttft": 0.2, "output_tps": 10.0, "prompt_tps": 100.0, "completion_tokens": 30},
        {"ok": True, "ttft": 0.4, "output_tps": 20.0, "prompt_tps": None, "completion_tokens": 30},
        {"ok": False, "error": "HTTP 503 busy"},
    ]
    summary = bench.summarize(results, wall_seconds=6.0, concurrency=2)
    assert (summary["requests"], summary["ok"], summary["failed"]) == (3, 2, 1)
    assert summary["throughput_tps"] == pytest.approx(10.0)
    assert summary["ttft_seconds"]["median"] == pytest.approx(0.3)
    assert summary["output_tps"]["p95"] == pytest.approx(19.5)
    assert summary["prompt_tps"]["n"] == 1
    assert summary["errors"] == ["HTTP 503 busy"]


PLAN = {
    "hosts": [
        {"name": "head1", "role": "head", "predicted_mib": {"total": 240.0}},
        {"name": "w1", "role": "worker", "predicted_mib": {"total": 80.0}},
    ]
}
UNITS = {"head": "h.service", "worker": "r.service"}
SAMPLES = {
    "head1": {
        "units": {"h.service": {"active": True, "memory_bytes": 200 * 1048576, "memory_peak_bytes": None}}
    },
    "w1": {
        "units": {
            "r.service": {"active": True, "memory_bytes": 31 * 1048576, "memory_peak_bytes": 60 * 1048576}
        }
    },
}


def test_memory_rows_pick_each_roles_unit() -> None:
    rows = bench.memory_rows(PLAN, SAMPLES, UNITS)
    assert rows == [
        {
            "host": "head1",
            "role": "head",
            "unit": "h.service",
            "planned_mib": 240.0,
            "used_mib": 200.0,
            "peak_mib": None,
        },
        {
            "host": "w1",
            "role": "worker",
            "unit": "r.service",
            "planned_mib": 80.0,
            "used_mib": 31.0,
            "peak_mib": 60.0,
        },
    ]


def _bars(svg: str) -> list:
    root = ET.fromstring(svg)
    return [
        (float(r.get("width")), float(r.get("data-value")))
        for r in root.iter(SVG + "rect")
        if r.get("class") == "bar"
    ]


def test_bar_chart_is_valid_svg_with_proportional_bars() -> None:
    svg = bench.bar_chart_svg("t <&>", [("a", 10.0), ("b", 40.0), ("c", None), ("d", 20.0)], "MiB")
    bars = _bars(svg)
    assert [v for _unused, v in bars] == [10.0, 40.0, 20.0]
    longest = max(w for w, _unused in bars)
    for width, value in bars:
        assert width == pytest.approx(longest * value / 40.0, abs=0.1)
    assert "n/a" in svg
    assert "t &lt;&amp;&gt;" in svg


def test_report_has_one_memory_chart_per_host_and_a_tokens_chart() -> None:
    results = [{"ok": True, "ttft": 0.2, "output_tps": 12.0, "prompt_tps": 90.0, "completion_tokens": 10}]
    load = {"summary": bench.summarize(results, 1.0, 1), "settings": {"requests": 1}, "results": results}
    out = bench.report(load, PLAN, SAMPLES, UNITS)
    assert sorted(out["charts"]) == ["memory-head1.svg", "memory-w1.svg", "tokens.svg"]
    # planned 80, used 31, peak 60 MiB on w1
    assert [v for _unused, v in _bars(out["charts"]["memory-w1.svg"])] == [80.0, 31.0, 60.0]
    assert [v for _unused, v in _bars(out["charts"]["tokens.svg"])] == [12.0, 12.0, 90.0, 90.0, 10.0]
    assert out["json"]["memory"][1]["peak_mib"] == 60.0
    assert out["json"]["requests"] == results
    with pytest.raises(bench.BenchError, match="summary"):
        bench.report({}, PLAN, SAMPLES, UNITS)


# Why a measuring request failed, for a person (tune.yml's rounds hide api_bench's output: the key).


def test_failures_are_named_once_with_their_status_and_count() -> None:
    from ansible_collections.llmfleet.cluster.plugins.module_utils.bench import failure_text

    results = [
        {"ok": False, "status": 401, "error": "HTTP 401 Unauthorized"},
        {"ok": True, "status": 200, "error": ""},
        {"ok": False, "status": 401, "error": "HTTP 401 Unauthorized"},
        {"ok": False, "status": 0, "error": "[Errno 111] Connection refused"},
    ]
    assert failure_text(results) == (
        "3 of 4 requests failed: [Errno 111] Connection refused (no HTTP status); "
        "HTTP 401 Unauthorized (status 401) x2"
    )
    assert failure_text([{"ok": True}]) == ""


def test_a_failure_never_shows_the_key() -> None:
    from ansible_collections.llmfleet.cluster.plugins.module_utils.bench import failure_text

    key = "s3cretKEY0123456789"
    text = failure_text([{"ok": False, "status": 400, "error": "bad header: Bearer " + key}], secret=key)
    assert key not in text and "Bearer <key>" in text and "(status 400)" in text
