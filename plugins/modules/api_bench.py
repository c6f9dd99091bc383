#!/usr/bin/python
# -*- coding: utf-8 -*-
# Copyright: llmfleet contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)

from __future__ import absolute_import, division, print_function

__metaclass__ = type

DOCUMENTATION = r"""
---
module: api_bench
short_description: Send N streamed chat completions at a given concurrency and measure them
version_added: 1.0.0
description:
  - Sends O(requests) streamed chat completions (C(stream=true)) to an OpenAI-compatible API
    (llama-server or vLLM), at most O(concurrency) at a time, and measures each one as a client
    sees it - time to first token, output tokens/s, prompt tokens/s (llama-server's own
    C(timings) when it sends them).
  - Returns every request's measures and a summary with median and p95. The arithmetic lives in
    C(plugins/module_utils/bench.py); this module only does the HTTP (Python standard library).
  - Meant to run on the controller (C(delegate_to=localhost)); C(llmfleet.cluster.bench_report)
    turns the result into bench.json and SVG charts.
author:
  - llmfleet contributors (@llmfleet)
options:
  url:
    description: Base URL of the API, without C(/v1/...).
    type: str
    required: true
  api_key:
    description: Bearer key; empty sends no C(Authorization) header.
    type: str
    default: ""
  model:
    description: Model name sent in each request (llama-server ignores it, vLLM needs it).
    type: str
    default: model
  prompt:
    description: The user message of every request.
    type: str
    default: Explain in a few sentences why the sky is blue.
  max_tokens:
    description: C(max_tokens) of every request.
    type: int
    default: 64
  requests:
    description: Number of requests.
    type: int
    default: 8
  concurrency:
    description: Requests in flight at a time.
    type: int
    default: 1
  timeout:
    description: Seconds a single request may take.
    type: int
    default: 300
  ca_data:
    description:
      - PEM certificate(s) to trust for an C(https) O(url), for example the chat page's self-signed
        certificate read from the head (the page relays the API on its TLS port with
        C(llmfleet_tls)). Empty trusts the system's CAs.
    type: str
    default: ""
  validate_certs:
    description: Check the server's certificate and name for an C(https) O(url).
    type: bool
    default: true
attributes:
  check_mode:
    support: full
    description: In check mode no request is sent; the settings are returned with an empty result.
notes:
  - The module reports C(changed=false); it only reads from the API.
  - Output tokens/s per request counts the tokens after the first over the time between the first
    and the last chunk carrying text, so it measures decoding, not the prompt.
extends_documentation_fragment:
  - llmfleet.cluster.attributes
"""

EXAMPLES = r"""
- name: Benchmark the head's API from the controller
  llmfleet.cluster.api_bench:
    url: http://10.89.0.2:8080
    api_key: "{{ __bench_key }}"
    requests: 20
    concurrency: 2
  delegate_to: localhost
  no_log: true
  register: __bench_load
"""

RETURN = r"""
settings:
  description: The settings used (without the key).
  returned: always
  type: dict
results:
  description: One entry per request - ok, status, error, seconds, ttft, prompt_tokens, completion_tokens, output_tps, prompt_tps, server_timings.
  returned: always
  type: list
  elements: dict
summary:
  description: >-
    requests, ok, failed, concurrency, wall_seconds, completion_tokens, throughput_tps, and
    median / p95 / min / max / n of ttft_seconds, output_tps, prompt_tps; failure - why requests
    failed, each distinct HTTP status and error once with its count, the key never shown (empty
    when none failed).
  returned: always
  type: dict
"""

import json
import ssl
import time
from concurrent.futures import ThreadPoolExecutor

from ansible.module_utils.basic import AnsibleModule
from ansible.module_utils.six.moves.urllib.error import HTTPError, URLError
from ansible.module_utils.urls import Request
from ansible_collections.llmfleet.cluster.plugins.module_utils.bench import (
    BenchError,
    failure_text,
    parse_sse,
    request_result,
    summarize,
)


def tls_context(url, ca_data="", validate_certs=True):
    """The TLS settings of an https URL (None for http)."""
    if not url.lower().startswith("https:"):
        return None
    context = ssl.create_default_context(cadata=ca_data or None)
    if not validate_certs:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return context


def one_request(url, api_key, body, timeout, context=None):
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if api_key:
        headers["Authorization"] = "Bearer " + api_key
    request = Request(headers=headers, timeout=timeout, context=context)
    started = time.monotonic()
    events = []
    try:
        response = request.open("POST", url, data=json.dumps(body).encode("utf-8"))
        try:
            for raw in response:
                line = raw.decode("utf-8", errors="replace")
                for event in parse_sse([line]):
                    events.append((time.monotonic(), event))
                if line.strip() == "data: [DONE]":
                    break
        finally:
            response.close()
    except HTTPError as exc:
        return request_result(
            started, events, time.monotonic(), status=exc.code, error="HTTP %d %s" % (exc.code, exc.reason)
        )
    except (URLError, OSError, ValueError) as exc:
        return request_result(
            started, events, time.monotonic(), status=0, error=str(getattr(exc, "reason", exc))
        )
    except BenchError as exc:
        return request_result(started, events, time.monotonic(), status=200, error=str(exc))
    return request_result(started, events, time.monotonic())


def main():
    module = AnsibleModule(
        argument_spec=dict(
            url=dict(type="str", required=True),
            api_key=dict(type="str", default="", no_log=True),
            model=dict(type="str", default="model"),
            prompt=dict(type="str", default="Explain in a few sentences why the sky is blue."),
            max_tokens=dict(type="int", default=64, no_log=False),
            requests=dict(type="int", default=8),
            concurrency=dict(type="int", default=1),
            timeout=dict(type="int", default=300),
            ca_data=dict(type="str", default=""),
            validate_certs=dict(type="bool", default=True),
        ),
        supports_check_mode=True,
    )
    p = module.params
    if p["requests"] < 1 or p["concurrency"] < 1 or p["max_tokens"] < 1:
        module.fail_json(
            msg="api_bench: requests (%d), concurrency (%d) and max_tokens (%d) must be >= 1"
            % (p["requests"], p["concurrency"], p["max_tokens"])
        )
    url = p["url"].rstrip("/") + "/v1/chat/completions"
    settings = dict(
        url=url,
        model=p["model"],
        prompt=p["prompt"],
        max_tokens=p["max_tokens"],
        requests=p["requests"],
        concurrency=p["concurrency"],
    )
    if module.check_mode:
        module.exit_json(
            changed=False, settings=settings, results=[], summary=summarize([], 0.0, p["concurrency"])
        )
    body = {
        "model": p["model"],
        "messages": [{"role": "user", "content": p["prompt"]}],
        "max_tokens": p["max_tokens"],
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    try:
        context = tls_context(url, p["ca_data"], p["validate_certs"])
    except (ssl.SSLError, ValueError) as exc:
        module.fail_json(msg="api_bench: ca_data is not a usable PEM certificate: %s" % exc)
    started = time.monotonic()
    with ThreadPoolExecutor(max_workers=p["concurrency"]) as pool:
        futures = [
            pool.submit(one_request, url, p["api_key"], body, p["timeout"], context)
            for _unused in range(p["requests"])
        ]
        results = [f.result() for f in futures]
    wall = time.monotonic() - started
    summary = summarize(results, wall, p["concurrency"])
    summary["failure"] = failure_text(results, p["api_key"])
    module.exit_json(changed=False, settings=settings, results=results, summary=summary)


if __name__ == "__main__":
    main()
