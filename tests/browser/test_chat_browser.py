"""The chat page in a real browser: Debian's chromium, headless, driven over the DevTools protocol.

Log in through the browser's own HTTP Basic challenge, send a prompt, watch the answer
arrive in pieces, and check that both themes (dark emulated with prefers-color-scheme)
give text/bubble contrast of at least 4.5:1. Screenshots go to tests/output/.

What it runs against (environment variables):

- nothing set: the app (roles/chat_ui/files/llmfleet_chat.py) on loopback in front of a
  fake upstream that streams slowly (tests/support/fake_openai.py);
- ``LLMFLEET_CHAT_UPSTREAM=http://host:port`` (+ ``LLMFLEET_CHAT_API_KEY`` or
  ``LLMFLEET_CHAT_API_KEY_FILE``): the app on loopback in front of that server, for
  example the demo fleet's llama-server or vLLM;
- ``LLMFLEET_CHAT_URL=https://head:8443/chat/`` with ``LLMFLEET_CHAT_USER`` and
  ``LLMFLEET_CHAT_PASSWORD`` (+ ``LLMFLEET_CHAT_API_KEY`` to check it never shows up): a
  chat page already deployed by the role (a self-signed certificate is accepted).

``LLMFLEET_CHAT_PROMPT`` changes the prompt, ``LLMFLEET_CHAT_TIMEOUT`` the seconds to wait
for the whole answer (default 300: CPU inference is slow), ``LLMFLEET_CHAT_MAX_TOKENS`` the
answer length of the app started here (default 256), ``LLMFLEET_CHROMIUM`` the browser.
"""

from __future__ import annotations

import base64
import contextlib
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import pytest

from tests.support.cdp import CDPError, Chromium, Page, find_chromium
from tests.support.chat_app import serve_chat_app
from tests.support.fake_openai import FakeUpstream

ROOT = Path(__file__).resolve().parents[2]
OUTPUT = Path(os.environ.get("LLMFLEET_TEST_OUTPUT", ROOT / "tests" / "output"))
FAKE_TOKENS = ["Hello ", "from ", "every ", "host ", "of ", "the ", "fleet."]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(find_chromium() is None, reason="no chromium (Debian: apt-get install -y chromium)"),
]


@dataclass
class Target:
    url: str
    user: str
    password: str
    api_key: str
    expected: Optional[str]  # the exact answer, when the upstream is the fake one
    insecure_tls: bool = False


def _api_key() -> str:
    if os.environ.get("LLMFLEET_CHAT_API_KEY_FILE"):
        return Path(os.environ["LLMFLEET_CHAT_API_KEY_FILE"]).read_text().strip()
    return os.environ.get("LLMFLEET_CHAT_API_KEY", "")


@pytest.fixture(scope="module")
def target() -> Iterator[Target]:
    deployed = os.environ.get("LLMFLEET_CHAT_URL")
    if deployed:
        yield Target(
            url=deployed if deployed.endswith("/") else deployed + "/",
            user=os.environ.get("LLMFLEET_CHAT_USER", "llmfleet"),
            password=os.environ["LLMFLEET_CHAT_PASSWORD"],
            api_key=_api_key(),
            expected=None,
            insecure_tls=deployed.startswith("https:"),
        )
        return
    password = "browser-test-password"
    upstream_url = os.environ.get("LLMFLEET_CHAT_UPSTREAM")
    with contextlib.ExitStack() as stack:
        if upstream_url:
            api_key, expected = _api_key(), None
        else:
            api_key = "sk-browser-test-key-42"
            fake = stack.enter_context(FakeUpstream(tokens=FAKE_TOKENS, delay=0.15, api_key=api_key))
            upstream_url, expected = fake.url, "".join(FAKE_TOKENS)
        server = stack.enter_context(
            serve_chat_app(
                upstream=upstream_url,
                password=password,
                username="tester",
                api_key=api_key,
                prefix="/chat",
                title="llmfleet chat (browser test)",
                max_tokens=int(os.environ.get("LLMFLEET_CHAT_MAX_TOKENS", "256")),
            )
        )
        yield Target(
            url=f"http://127.0.0.1:{server.server_address[1]}/chat/",
            user="tester",
            password=password,
            api_key=api_key,
            expected=expected,
        )


@pytest.fixture(scope="module")
def browser(target: Target) -> Iterator[Chromium]:
    extra = ["--ignore-certificate-errors"] if target.insecure_tls else []
    with Chromium(extra_args=extra) as chromium:
        yield chromium


class Login:
    """Answers the browser's HTTP Basic challenges (CancelAuth until credentials are set)."""

    def __init__(self, page: Page):
        self.page = page
        self.credentials: Optional[tuple[str, str]] = None
        self.challenges = 0
        page.on(
            "Fetch.requestPaused", lambda p: page.send("Fetch.continueRequest", {"requestId": p["requestId"]})
        )
        page.on("Fetch.authRequired", self._auth)
        page.call("Fetch.enable", {"handleAuthRequests": True, "patterns": [{"urlPattern": "*"}]})

    def _auth(self, params: dict[str, Any]) -> None:
        self.challenges += 1
        if self.credentials is None:
            response = {"response": "CancelAuth"}
        else:
            response = {
                "response": "ProvideCredentials",
                "username": self.credentials[0],
                "password": self.credentials[1],
            }
        self.page.send(
            "Fetch.continueWithAuth", {"requestId": params["requestId"], "authChallengeResponse": response}
        )


# Colours and contrast (WCAG 2.x) ------------------------------------------------

_RGB = re.compile(r"rgba?\(\s*([\d.]+)[,\s]+([\d.]+)[,\s]+([\d.]+)(?:\s*[,/]\s*([\d.]+%?))?\s*\)")


def parse_colour(css: str) -> tuple[float, float, float, float]:
    match = _RGB.fullmatch(css.strip())
    if not match:
        raise ValueError(f"not an rgb() colour: {css!r}")
    r, g, b = (float(match.group(i)) for i in (1, 2, 3))
    alpha = match.group(4)
    if alpha is None:
        a = 1.0
    elif alpha.endswith("%"):
        a = float(alpha[:-1]) / 100
    else:
        a = float(alpha)
    return r, g, b, a


def over(top: tuple[float, float, float, float], below: tuple[float, float, float, float]):
    """``top`` painted over an opaque ``below`` (alpha compositing)."""
    a = top[3]
    r, g, b = (top[i] * a + below[i] * (1 - a) for i in range(3))
    return r, g, b, 1.0


def luminance(colour: tuple[float, ...]) -> float:
    def channel(c: float) -> float:
        c /= 255
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(c) for c in colour[:3])
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: tuple[float, ...], b: tuple[float, ...]) -> float:
    la, lb = sorted((luminance(a), luminance(b)), reverse=True)
    return (la + 0.05) / (lb + 0.05)


def test_contrast_formula_matches_wcag_reference_values() -> None:
    black, white = (0, 0, 0, 1), (255, 255, 255, 1)
    assert contrast(black, white) == pytest.approx(21.0)
    assert contrast(white, white) == pytest.approx(1.0)
    assert contrast(parse_colour("rgb(118, 118, 118)"), white) == pytest.approx(4.54, abs=0.01)
    assert over(parse_colour("rgba(0, 0, 0, 0)"), white)[:3] == (255, 255, 255)


# Reading the page ---------------------------------------------------------------

COLOURS_JS = """(() => {
  const style = (sel) => { const e = document.querySelector(sel); return e ? getComputedStyle(e) : null; };
  const pair = (textSel, bgSel) => {
    const t = style(textSel), b = style(bgSel || textSel);
    return t && b ? { fg: t.color, bg: b.backgroundColor } : null;
  };
  return {
    page: pair("body"),
    user: pair(".msg.user .text", ".msg.user"),
    assistant: pair(".msg.assistant .text", ".msg.assistant"),
    status: pair("#status", "body"),
    model: pair("#model", "body"),
    send: pair("#send"),
    prompt: pair("#prompt"),
    secondary: pair("#stop", "body"),
  };
})()"""

LAST_ANSWER_JS = """(() => {
  const all = document.querySelectorAll(".msg.assistant");
  const m = all[all.length - 1];
  if (!m) return null;
  return { state: m.dataset.state || "", text: m.querySelector(".text").textContent,
           error: m.classList.contains("error"), status: document.getElementById("status").textContent };
})()"""


def check_contrast(page: Page, scheme: str) -> dict[str, float]:
    page.call("Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": scheme}]})
    assert page.evaluate(f"matchMedia('(prefers-color-scheme: {scheme})').matches") is True
    colours = page.evaluate(COLOURS_JS)
    body_bg = parse_colour(colours["page"]["bg"])
    ratios = {}
    for name, pair in colours.items():
        assert pair is not None, f"{scheme}: no element for {name}"
        bg = over(parse_colour(pair["bg"]), body_bg)
        fg = over(parse_colour(pair["fg"]), bg)
        ratios[name] = round(contrast(fg, bg), 2)
    low = {name: r for name, r in ratios.items() if r < 4.5}
    assert not low, f"{scheme} theme: contrast below 4.5:1 for {low} (all: {ratios}, colours: {colours})"
    # The theme really switched: a dark page in dark mode, a light one otherwise.
    if scheme == "dark":
        assert luminance(body_bg) < 0.05 and luminance(parse_colour(colours["page"]["fg"])) > 0.6, colours
    else:
        assert luminance(body_bg) > 0.8, colours
    return ratios


def test_log_in_send_a_prompt_and_see_the_streamed_answer(browser: Chromium, target: Target) -> None:
    page = browser.page()
    page.call("Page.enable")
    page.call("Network.enable")
    login = Login(page)
    page.call("Emulation.setEmulatedMedia", {"features": [{"name": "prefers-color-scheme", "value": "dark"}]})

    # Without the password the browser gets 401 and no page.
    since = len(page.events)
    page.navigate(target.url)
    statuses = [
        e["params"]["response"]["status"]
        for e in page.events[since:]
        if e["method"] == "Network.responseReceived" and e["params"]["type"] == "Document"
    ]
    assert statuses and statuses[-1] == 401, statuses
    assert login.challenges >= 1
    assert page.evaluate("document.getElementById('prompt') === null")

    # Log in through the same challenge.
    login.credentials = (target.user, target.password)
    page.navigate(target.url)
    assert page.evaluate("document.getElementById('prompt') !== null"), "the chat page did not load"
    deadline = time.monotonic() + 30
    while not page.evaluate("document.getElementById('model').textContent") and time.monotonic() < deadline:
        page.pump(0.1)
    model = page.evaluate("document.getElementById('model').textContent")

    # Type a prompt and press Enter, as a person would.
    prompt = os.environ.get("LLMFLEET_CHAT_PROMPT", "In one sentence: what is a fleet of computers?")
    page.evaluate("document.getElementById('prompt').focus()")
    page.call("Input.insertText", {"text": prompt})
    for kind in ("keyDown", "keyUp"):
        page.call(
            "Input.dispatchKeyEvent",
            {"type": kind, "key": "Enter", "code": "Enter", "windowsVirtualKeyCode": 13, "text": "\r"},
        )

    timeout = float(os.environ.get("LLMFLEET_CHAT_TIMEOUT", "300"))
    deadline = time.monotonic() + timeout
    partials: list[str] = []
    answer: dict[str, Any] = {}
    t0 = time.monotonic()
    first_piece_at = None
    while time.monotonic() < deadline:
        answer = page.evaluate(LAST_ANSWER_JS) or {}
        if answer.get("state") == "streaming" and answer.get("text"):
            if first_piece_at is None:
                first_piece_at = time.monotonic() - t0
            if not partials or partials[-1] != answer["text"]:
                partials.append(answer["text"])
        if answer.get("state") == "done":
            break
        page.pump(0.05)
    elapsed = time.monotonic() - t0
    assert answer.get("state") == "done", f"no complete answer within {timeout} s: {answer}"
    assert not answer["error"], answer
    text = answer["text"]
    assert text.strip(), "the answer is empty"
    if target.expected is not None:
        assert text == target.expected
    # Streamed: the page showed growing prefixes of the answer before it was complete.
    assert len(partials) >= 2, f"the answer did not arrive in pieces: {partials}"
    assert all(text.startswith(p) for p in partials), partials
    assert len(partials[0]) < len(text)
    assert "tokens/s" in answer["status"], answer["status"]

    # The API key is nowhere in what the browser got.
    if target.api_key:
        html = page.evaluate("document.documentElement.outerHTML")
        assert target.api_key not in html
        for event in page.events:
            if event["method"] == "Network.responseReceived":
                assert target.api_key not in str(event["params"]["response"].get("headers"))
            if event["method"] == "Network.loadingFinished":
                try:
                    body = page.call("Network.getResponseBody", {"requestId": event["params"]["requestId"]})
                except CDPError:  # some bodies (the 401s, redirects) are not kept
                    continue
                data = body["body"]
                if body.get("base64Encoded"):
                    data = base64.b64decode(data).decode("utf-8", "replace")
                assert target.api_key not in data

    dark = check_contrast(page, "dark")
    shot_dark = page.screenshot(OUTPUT / "chat-dark.png")
    light = check_contrast(page, "light")
    shot_light = page.screenshot(OUTPUT / "chat-light.png")
    print(
        f"\nchat browser test: {browser.version()} against {target.url} (model {model!r})"
        f"\n  answer of {len(text)} chars in {elapsed:.2f} s, first piece after {first_piece_at:.2f} s,"
        f" seen in {len(partials)} growing pieces; status: {answer['status']}"
        f"\n  contrast dark: {dark}\n  contrast light: {light}"
        f"\n  screenshots: {shot_dark} {shot_light}"
    )
