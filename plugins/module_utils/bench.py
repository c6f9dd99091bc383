# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Benchmark arithmetic: server-sent events, per-request speeds, percentiles, SVG charts.

Pure functions (no I/O, no clock); ``llmfleet.cluster.api_bench`` does the HTTP and hands the
timestamps here. Runs on Python 3.9+.

Per request, from a streamed chat completion:

- time to first token (TTFT): from sending the request to the first chunk that carries
  generated text;
- output tokens/s: llama-server's own ``timings.predicted_per_second`` when present (a fast
  server's chunks can reach the client in bursts, which makes a client-side rate meaningless),
  else the completion tokens after the first one over the time from the first to the last
  content chunk (``output_tps_client``, always reported);
- prompt tokens/s: llama-server's own ``timings.prompt_per_second`` when present, else the
  prompt tokens over the TTFT (an upper bound of the time spent on the prompt);
- the server's own ``timings`` are kept as they are.
"""

from __future__ import annotations

import collections
import json
import math
from typing import Dict, Iterable, List, Mapping, Optional, Sequence, Tuple
from xml.sax.saxutils import escape

MIB = 1024 * 1024


class BenchError(Exception):
    """Input the benchmark arithmetic cannot use."""


# --------------------------------------------------------------------------- SSE


def parse_sse(lines: Iterable[str]) -> List[object]:
    """The JSON payloads of ``data:`` events, in order; ``[DONE]`` ends the stream.

    Comment lines (``:``), ``event:`` / ``id:`` fields and blank separators are skipped. A
    ``data:`` that is not JSON raises :class:`BenchError` naming it.
    """
    events = []  # type: List[object]
    for line in lines:
        line = line.rstrip("\r\n")
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            break
        if not payload:
            continue
        try:
            events.append(json.loads(payload))
        except ValueError as exc:
            raise BenchError("server-sent event is not JSON: %r (%s)" % (payload[:80], exc)) from exc
    return events


def chunk_text(event: object) -> str:
    """Generated text carried by one streamed chat-completion chunk (content or reasoning)."""
    if not isinstance(event, dict):
        return ""
    text = ""
    for choice in event.get("choices") or []:
        delta = choice.get("delta") or {} if isinstance(choice, dict) else {}
        for key in ("content", "reasoning_content"):
            value = delta.get(key)
            if isinstance(value, str):
                text += value
    return text


# --------------------------------------------------------------------------- one request


def request_result(
    started: float,
    events: Sequence[Tuple[float, object]],
    finished: float,
    status: int = 200,
    error: str = "",
) -> Dict[str, object]:
    """Measures of one streamed request from ``(arrival time, event)`` pairs.

    Times are seconds on one monotonic clock. Token counts come from the last ``usage`` or
    ``timings`` the server sent; without them every content chunk counts as one token.
    """
    result = {"ok": False, "status": status, "error": error, "seconds": round(finished - started, 4)}  # type: Dict[str, object]
    if error or status != 200:
        return result
    content_times = [t for t, e in events if chunk_text(e)]
    if not content_times:
        result["error"] = "the stream carried no generated text"
        return result
    usage = {}  # type: Dict[str, object]
    timings = {}  # type: Dict[str, object]
    for _unused, event in events:
        if isinstance(event, dict):
            if isinstance(event.get("usage"), dict):
                usage = event["usage"]
            if isinstance(event.get("timings"), dict):
                timings = event["timings"]
    completion = _int_or_none(usage.get("completion_tokens"))
    if completion is None:
        completion = _int_or_none(timings.get("predicted_n"))
    if completion is None:
        completion = len(content_times)
    prompt = _int_or_none(usage.get("prompt_tokens"))
    if prompt is None:
        prompt = _int_or_none(timings.get("prompt_n"))
    ttft = content_times[0] - started
    decode_time = content_times[-1] - content_times[0]
    result.update(
        {
            "ok": True,
            "ttft": round(ttft, 4),
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "output_tps_client": round((completion - 1) / decode_time, 3)
            if completion > 1 and decode_time > 0
            else None,
            "text_chunks": len(content_times),
        }
    )
    if isinstance(timings.get("predicted_per_second"), (int, float)):
        result["output_tps"] = round(float(timings["predicted_per_second"]), 3)  # type: ignore[arg-type]
        result["output_tps_source"] = "server"
    else:
        result["output_tps"] = result["output_tps_client"]
        result["output_tps_source"] = "client"
    if isinstance(timings.get("prompt_per_second"), (int, float)):
        result["prompt_tps"] = round(float(timings["prompt_per_second"]), 3)  # type: ignore[arg-type]
        result["prompt_tps_source"] = "server"
    elif prompt and ttft > 0:
        result["prompt_tps"] = round(prompt / ttft, 3)
        result["prompt_tps_source"] = "ttft"
    else:
        result["prompt_tps"] = None
    if timings:
        result["server_timings"] = {
            k: timings[k]
            for k in ("prompt_n", "prompt_per_second", "predicted_n", "predicted_per_second")
            if k in timings
        }
    return result


def _int_or_none(value: object) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


# --------------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between closest ranks."""
    if not values:
        raise BenchError("percentile of no values")
    if not 0 <= q <= 100:
        raise BenchError("percentile %r is outside 0-100" % q)
    ordered = sorted(float(v) for v in values)
    rank = (len(ordered) - 1) * q / 100.0
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def _stats(values: Sequence[object]) -> Optional[Dict[str, float]]:
    numbers = [float(v) for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]  # type: ignore[arg-type]
    if not numbers:
        return None
    return {
        "median": round(percentile(numbers, 50), 4),
        "p95": round(percentile(numbers, 95), 4),
        "min": round(min(numbers), 4),
        "max": round(max(numbers), 4),
        "n": len(numbers),
    }


def summarize(
    results: Sequence[Mapping[str, object]], wall_seconds: float, concurrency: int
) -> Dict[str, object]:
    """Median / p95 of TTFT, output and prompt tokens/s, and the aggregate throughput."""
    ok = [r for r in results if r.get("ok")]
    completion = sum(int(r.get("completion_tokens") or 0) for r in ok)  # type: ignore[call-overload]
    return {
        "requests": len(results),
        "ok": len(ok),
        "failed": len(results) - len(ok),
        "concurrency": concurrency,
        "wall_seconds": round(wall_seconds, 3),
        "completion_tokens": completion,
        "throughput_tps": round(completion / wall_seconds, 3) if wall_seconds > 0 else None,
        "ttft_seconds": _stats([r.get("ttft") for r in ok]),
        "output_tps": _stats([r.get("output_tps") for r in ok]),
        "output_tps_client": _stats([r.get("output_tps_client") for r in ok]),
        "prompt_tps": _stats([r.get("prompt_tps") for r in ok]),
        "errors": sorted({str(r.get("error")) for r in results if not r.get("ok")}),
    }


def failure_text(results: Sequence[Mapping[str, object]], secret: str = "") -> str:
    """Why requests failed, for a person: ``"2 of 3 requests failed: HTTP 401 Unauthorized (status
    401) x2"``; ``""`` when none failed.

    Each distinct (status, error) is named once with its count; ``secret`` (the API key) is
    replaced by ``<key>`` wherever an error carries it, so the text can be shown.
    """
    failed = [r for r in results if not r.get("ok")]
    if not failed:
        return ""
    counts = collections.Counter(
        (int(r.get("status") or 0), str(r.get("error") or "no error given")) for r in failed
    )
    parts = []
    for (status, error), n in sorted(counts.items()):
        part = error + (" (status %d)" % status if status else " (no HTTP status)")
        parts.append(part + (" x%d" % n if n > 1 else ""))
    text = "%d of %d requests failed: %s" % (len(failed), len(results), "; ".join(parts))
    if secret:
        text = text.replace(secret, "<key>")
    return text


def memory_rows(
    plan: Mapping[str, object],
    samples: Mapping[str, Mapping[str, object]],
    units: Mapping[str, str],
) -> List[Dict[str, object]]:
    """Planned vs used vs peak MiB of the llama.cpp unit of every plan host.

    ``samples`` maps a host to one ``host_usage`` sample; ``units`` maps a plan role to the
    unit name.
    """
    hosts = plan.get("hosts")
    if not isinstance(hosts, list):
        raise BenchError("the plan has no list 'hosts'")
    rows = []  # type: List[Dict[str, object]]
    for host in hosts:
        name = str(host.get("name"))
        role = str(host.get("role", "worker"))
        unit = units.get(role, units.get("worker", ""))
        predicted = host.get("predicted_mib") or {}
        sample = samples.get(name) or {}
        unit_sample = (sample.get("units") or {}).get(unit) or {}  # type: ignore[union-attr]
        used = unit_sample.get("memory_bytes") if unit_sample.get("active") else None
        peak = unit_sample.get("memory_peak_bytes") if unit_sample.get("active") else None
        rows.append(
            {
                "host": name,
                "role": role,
                "unit": unit,
                "planned_mib": predicted.get("total") if isinstance(predicted, dict) else None,
                "used_mib": round(used / MIB, 1) if isinstance(used, int) else None,
                "peak_mib": round(peak / MIB, 1) if isinstance(peak, int) else None,
            }
        )
    return rows


# --------------------------------------------------------------------------- SVG


def bar_chart_svg(
    title: str, bars: Sequence[Tuple[str, Optional[float]]], unit: str, width: int = 480
) -> str:
    """A small horizontal bar chart as a standalone SVG document.

    Each bar is ``(label, value)``; a value of None is drawn as "n/a". Bar lengths are
    proportional to the values (the longest bar fills the plot area).
    """
    if not bars:
        raise BenchError("a chart needs at least one bar")
    row, top, label_w, value_w = 26, 34, 130, 90
    plot_w = width - label_w - value_w - 10
    height = top + row * len(bars) + 10
    biggest = max((v for _unused, v in bars if isinstance(v, (int, float))), default=0.0) or 1.0
    colours = ("#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948")
    parts = [
        '<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" '
        'font-family="sans-serif" font-size="12">' % (width, height, width, height),
        '<rect width="100%" height="100%" fill="#ffffff"/>',
        '<text x="8" y="20" font-size="14" font-weight="bold" fill="#111111">%s</text>' % escape(title),
    ]
    for index, (label, value) in enumerate(bars):
        y = top + index * row
        parts.append('<text x="8" y="%d" fill="#111111">%s</text>' % (y + 15, escape(str(label))))
        if isinstance(value, (int, float)):
            length = max(1.0, plot_w * float(value) / biggest) if value > 0 else 0.0
            parts.append(
                '<rect class="bar" x="%d" y="%d" width="%.1f" height="18" fill="%s" data-value="%s"/>'
                % (label_w, y + 2, length, colours[index % len(colours)], _num_text(value))
            )
            text = "%s %s" % (_num_text(value), unit)
        else:
            text = "n/a"
        parts.append(
            '<text x="%d" y="%d" fill="#111111">%s</text>' % (label_w + plot_w + 6, y + 15, escape(text))
        )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _num_text(value: float) -> str:
    return ("%.1f" % value) if abs(value) < 1000 else ("%d" % round(value))


def charts(summary: Mapping[str, object], memory: Sequence[Mapping[str, object]]) -> Dict[str, str]:
    """File name -> SVG: one memory chart per host and one tokens/s chart."""
    result = {}  # type: Dict[str, str]
    for row in memory:
        result["memory-%s.svg" % _safe(str(row["host"]))] = bar_chart_svg(
            "%s (%s): memory of %s" % (row["host"], row["role"], row["unit"]),
            [
                ("planned", row.get("planned_mib")),  # type: ignore[list-item]
                ("used", row.get("used_mib")),  # type: ignore[list-item]
                ("peak", row.get("peak_mib")),  # type: ignore[list-item]
            ],
            "MiB",
        )
    bars = []  # type: List[Tuple[str, Optional[float]]]
    for key, label in (("output_tps", "output"), ("prompt_tps", "prompt")):
        stats = summary.get(key) or {}
        bars.append(("%s median" % label, stats.get("median") if isinstance(stats, dict) else None))
        bars.append(("%s p95" % label, stats.get("p95") if isinstance(stats, dict) else None))
    bars.append(("aggregate", summary.get("throughput_tps")))  # type: ignore[arg-type]
    result["tokens.svg"] = bar_chart_svg(
        "tokens/s, %s requests at concurrency %s" % (summary.get("requests"), summary.get("concurrency")),
        bars,
        "tok/s",
    )
    return result


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


def report(
    bench: Mapping[str, object],
    plan: Mapping[str, object],
    samples: Mapping[str, Mapping[str, object]],
    units: Mapping[str, str],
) -> Dict[str, object]:
    """bench.json's content and the charts, from api_bench's return and one sample per host."""
    summary = bench.get("summary")
    if not isinstance(summary, dict):
        raise BenchError("the benchmark result has no 'summary' (is it api_bench's return?)")
    memory = memory_rows(plan, samples, units)
    document = {
        "summary": summary,
        "settings": bench.get("settings", {}),
        "memory": memory,
        "requests": bench.get("results", []),
    }
    return {"json": document, "charts": charts(summary, memory)}
