#!/usr/bin/env python
# Copyright: llmfleet developers
# GNU General Public License v3.0+ (see LICENSE or https://www.gnu.org/licenses/gpl-3.0.txt)
"""Print the demo's question and the answer of one OpenAI chat completion read on stdin.

    ... | python3 scripts/demo-answer.py --question "Name three colours."

Prints ``question: "..."``, ``answer: "..."`` and a tokens/s line (llama-server's ``timings``).
Exits 1, saying why, when there is no answer to print (an error body, no choices, empty text) or
when the answer carries chat-template markers (``<|im_end|>``, ``<start_of_image>``, ...): the
sign of a model served without its template, whose "answer" reads as noise.
"""

from __future__ import annotations

import argparse
import json
import re
import sys

# Control tokens of the usual chat templates (ChatML, Gemma, Llama 3, Mistral) leaking into text.
MARKERS = re.compile(r"<\|[a-z_]+\|>|<(?:start|end)_of_[a-z]+>|\[/?INST\]|</?s>")


def answer_of(response: object) -> str:
    """The first choice's message text, or ValueError saying what the response lacks."""
    if not isinstance(response, dict):
        raise ValueError(f"the response is not a JSON object: {str(response)[:200]}")
    if response.get("error"):
        raise ValueError(f"the server answered with an error: {json.dumps(response['error'])[:300]}")
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ValueError(f"the response has no choices: {json.dumps(response)[:300]}")
    text = (choices[0].get("message") or {}).get("content")
    if not isinstance(text, str) or not text.strip():
        raise ValueError("the answer is empty")
    found = MARKERS.findall(text)
    if found:
        raise ValueError(
            f"the answer carries chat-template markers {sorted(set(found))}: {json.dumps(text)[:300]}"
        )
    return text.strip()


def report(question: str, response: dict) -> list[str]:
    text = answer_of(response)
    timings = response.get("timings") or {}
    return [
        f"question: {json.dumps(question)}",
        f"answer: {json.dumps(text)}",
        f"tokens: {int(timings.get('predicted_n') or 0)} in {float(timings.get('predicted_ms') or 0):.0f} ms"
        f" = {float(timings.get('predicted_per_second') or 0):.1f} tokens/s"
        f" (prompt {float(timings.get('prompt_per_second') or 0):.1f} tokens/s)",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--question", required=True)
    args = parser.parse_args(argv)
    raw = sys.stdin.read(1 << 20)
    try:
        lines = report(args.question, json.loads(raw))
    except json.JSONDecodeError:
        print(f"question: {json.dumps(args.question)}")
        print(f"demo: no JSON answer from the head: {raw[:300]!r}", file=sys.stderr)
        return 1
    except ValueError as exc:
        print(f"question: {json.dumps(args.question)}")
        print(f"demo: {exc}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
