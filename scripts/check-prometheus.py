#!/usr/bin/env python
"""A real Prometheus against a running demo fleet, with what llmfleet.cluster.monitoring writes.

    python3 scripts/check-prometheus.py [INVENTORY] [-e VAR=VALUE ...]   (after scripts/demo.sh up)

Runs playbooks/monitoring.yml for the inventory into the demo's out dir, copies the scrape config,
the target lists, the head's API key and the chat page's certificate (the CA of its self-signed
certificate) into a temporary directory, rewriting /etc/prometheus/llmfleet/ to it in that copy
only, checks it with `promtool check config`, then runs Debian's prometheus on loopback with every
job scraped every 2 s, sends one chat completion through the endpoint Prometheus scrapes (the chat
page's TLS port with llmfleet_tls), and asserts: the llama-server job is up, its counters moved,
and every PromQL expression of the Grafana dashboard evaluates, those on llamacpp metrics with
data. node-exporter is not installed on the demo hosts: that job is reported, down, not hidden.
Prometheus runs on the controller, outside the fleet's WireGuard tunnel: monitoring.yml is given
every host's LAN address (`monitoring_addresses`, read from podman), since the workers' plan
addresses are tunnel addresses, and the node targets are checked to be those LAN addresses.
`-e` values go to ansible-playbook (e.g. `-e monitoring_api_scheme=http` must make it fail).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
ETC = "/etc/prometheus/llmfleet/"
INTERVAL = "2s"
LLAMA_JOB = "llmfleet-llama-server"
# Grafana's variables, as a dashboard query would see them over the last minutes.
GRAFANA_VARS = {
    "$__rate_interval": "1m",
    "$__interval": INTERVAL,
    "$__range": "5m",
    "${__rate_interval}": "1m",
    "${__interval}": INTERVAL,
    "${__range}": "5m",
}


class CheckError(Exception):
    """What the check found wrong."""


def say(msg: str) -> None:
    print(f"check-prometheus: {msg}", flush=True)


def run(cmd: list[str], timeout: int = 120) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if result.returncode != 0:
        raise CheckError(f"{' '.join(cmd[:4])} ... failed:\n{(result.stdout + result.stderr)[-3000:]}")
    return result.stdout + result.stderr


def state_dir(inventory: str) -> Path:
    """The demo's state dir, named like scripts/demo.sh names it."""
    cache = Path(os.environ.get("CACHE", ROOT / ".cache"))
    return cache / "demo" / Path(inventory).resolve().name


def lan_addresses(hosts: list[str]) -> dict[str, str]:
    """Host -> its address on the demo network (podman's), the one the controller reaches."""
    found = {}
    for host in hosts:
        data = json.loads(run(["podman", "inspect", host]))
        networks = data[0]["NetworkSettings"]["Networks"] or {}
        addresses = [n["IPAddress"] for n in networks.values() if n.get("IPAddress")]
        if not addresses:
            raise CheckError(f"{host}: podman reports no network address for it")
        found[host] = addresses[0]
    return found


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def expand_grafana(expr: str) -> str:
    """The expression as Grafana sends it: its interval variables, and any other variable
    ($fleet, $instance, ${host}) in a label matcher as "every value"."""
    for var, value in GRAFANA_VARS.items():
        expr = expr.replace(var, value)
    regex_op = {"=": "=~", "!=": "!~", "=~": "=~", "!~": "!~"}
    expr = re.sub(r'(!=|=~|!~|=)\s*"\$\{?\w+\}?"', lambda m: regex_op[m.group(1)] + '".*"', expr)
    if "$" in expr:
        raise CheckError(f"a Grafana variable this check does not know: {expr}")
    return expr


class Prometheus:
    def __init__(self, base: str) -> None:
        self.base = base

    def get(self, path: str, **params: str) -> dict:
        url = self.base + path + ("?" + urllib.parse.urlencode(params) if params else "")
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.load(resp)
        except urllib.error.HTTPError as exc:  # 400/422: a query that does not parse or evaluate
            body = json.loads(exc.read() or b"{}")
        return body

    def query(self, expr: str) -> list:
        body = self.get("/api/v1/query", query=expr)
        if body.get("status") != "success":
            raise CheckError(f"{expr}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]["result"]

    def value(self, expr: str) -> float | None:
        result = self.query(expr)
        return float(result[0]["value"][1]) if result else None

    def targets(self) -> list:
        return self.get("/api/v1/targets")["data"]["activeTargets"]


def wait(what: str, timeout: float, probe):
    deadline = time.monotonic() + timeout
    while True:
        got = probe()
        if got:
            return got
        if time.monotonic() > deadline:
            raise CheckError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


def chat_completion(url: str, key: str, cafile: Path | None) -> dict:
    body = {"messages": [{"role": "user", "content": "Name one colour of the sea."}], "max_tokens": 12}
    request = urllib.request.Request(
        url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    context = ssl.create_default_context(cafile=str(cafile)) if url.startswith("https:") and cafile else None
    with urllib.request.urlopen(request, timeout=120, context=context) as resp:
        return json.load(resp)


def check(inventory: str, extra_vars: list[str]) -> None:
    started = time.monotonic()
    out = state_dir(inventory) / "out"
    if not (out / "plan.json").is_file():
        raise CheckError(f"no {out}/plan.json: bring the demo up first (bash scripts/demo.sh up {inventory})")
    for tool in ("prometheus", "promtool"):
        if not shutil.which(tool):
            raise CheckError(f"{tool} is missing: bash scripts/host-setup.sh installs Debian's prometheus")
    inv = json.loads(run(["ansible-inventory", "-i", inventory, "--list"]))
    head = inv["llm_head"]["hosts"][0]
    lans = lan_addresses([head, *inv.get("llm_workers", {}).get("hosts", [])])

    # 1. What the role writes, for this fleet, into the demo's out dir.
    cmd = ["ansible-playbook", "-i", inventory, str(ROOT / "playbooks" / "monitoring.yml")]
    cmd += ["-e", f"llmfleet_output_dir={out}", "-e", json.dumps({"monitoring_addresses": lans})]
    for value in extra_vars:
        cmd += ["-e", value]
    run(cmd, timeout=300)
    written = out / "monitoring"
    scrape_text = (written / "prometheus-scrape.yml").read_text()
    jobs = {j["job_name"]: j for j in yaml.safe_load(scrape_text)["scrape_configs"]}
    llama = jobs[LLAMA_JOB]
    scheme = llama.get("scheme", "http")
    (target,) = json.loads((written / "llama-server.json").read_text())[0]["targets"]
    say(f"monitoring.yml wrote {written}: {LLAMA_JOB} {scheme}://{target}{llama['metrics_path']}")
    node_hosts = sorted(
        t.rsplit(":", 1)[0] for g in json.loads((written / "node.json").read_text()) for t in g["targets"]
    )
    if not node_hosts or not set(node_hosts) <= set(lans.values()):
        raise CheckError(
            f"the node targets are {node_hosts}, not the hosts' LAN addresses {sorted(lans.values())}"
        )
    say(f"node targets: the LAN addresses {', '.join(f'{h} {a}' for h, a in lans.items())}")

    with tempfile.TemporaryDirectory(prefix="llmfleet-prom-") as tmp_name:
        tmp = Path(tmp_name)
        # 2. The files where the scrape config expects them, in tmp instead of /etc/prometheus/llmfleet/.
        for name in ("llama-server.json", "vllm.json", "node.json"):
            shutil.copy(written / name, tmp / name)
        key = run(["podman", "exec", head, "cat", "/etc/llmfleet/api-key"]).strip()
        (tmp / "api-key").write_text(key + "\n")
        (tmp / "api-key").chmod(0o600)
        cert = subprocess.run(
            ["podman", "exec", head, "cat", "/etc/llmfleet-chat/tls.crt"],
            capture_output=True,
            text=True,
            check=False,
        )
        cafile = None
        if cert.returncode == 0 and "BEGIN CERTIFICATE" in cert.stdout:
            cafile = tmp / "ca.crt"
            cafile.write_text(cert.stdout)
        elif llama.get("tls_config", {}).get("ca_file"):
            raise CheckError(f"{LLAMA_JOB} trusts a CA file, but {head} has no /etc/llmfleet-chat/tls.crt")
        local = scrape_text.replace(ETC, f"{tmp}/")
        if ETC.rstrip("/") in local:
            raise CheckError(f"{ETC} is still named in the copy of the scrape config")
        (tmp / "prometheus-scrape.yml").write_text(local)
        say(
            "promtool check config (the role's scrape config, paths in the temp dir): "
            + (
                run(["promtool", "check", "config", str(tmp / "prometheus-scrape.yml")])
                .strip()
                .splitlines()[-1]
            )
        )
        # The wrapper: the same jobs, scraped every 2 s so that the check stays short.
        config = yaml.safe_load(local)
        config["global"] = {
            "scrape_interval": INTERVAL,
            "scrape_timeout": INTERVAL,
            "evaluation_interval": INTERVAL,
        }
        for job in config["scrape_configs"]:
            job["scrape_interval"] = INTERVAL
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
        run(["promtool", "check", "config", str(tmp / "prometheus.yml")])

        # 3. Prometheus on loopback.
        port = free_port()
        log = (tmp / "prometheus.log").open("w")
        proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        prom = Prometheus(f"http://127.0.0.1:{port}")
        try:
            observe(prom, proc, jobs, scheme, target, key, cafile, written / "grafana-dashboard.json")
        except CheckError:
            log.flush()
            tail = (tmp / "prometheus.log").read_text().splitlines()[-12:]
            print("prometheus log (last lines):", *tail, sep="\n  ", file=sys.stderr)
            raise
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            log.close()
    say(f"passed in {time.monotonic() - started:.0f} s (prometheus stopped)")


def observe(prom, proc, jobs, scheme, target, key, cafile, dashboard_file: Path) -> None:
    def ready():
        if proc.poll() is not None:
            raise CheckError(f"prometheus exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(prom.base + "/-/ready", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    wait("prometheus to be ready", 30, ready)
    version = prom.get("/api/v1/status/buildinfo")["data"]["version"]
    say(f"prometheus {version} on {prom.base}, scraping every {INTERVAL}")

    # 4. The llama-server job's target up: its first scrapes, or the error they got.
    def llama_scraped():
        for t in prom.targets():
            if t["labels"]["job"] == LLAMA_JOB and t["health"] != "unknown":
                return t
        return None

    first = wait(f"a first scrape of {LLAMA_JOB}", 20, llama_scraped)
    if first["health"] != "up":
        time.sleep(5)  # one more chance (the endpoint may have been busy)
        first = llama_scraped()
    if first["health"] != "up":
        raise CheckError(f"{LLAMA_JOB} {first['scrapeUrl']} is {first['health']}: {first['lastError']}")
    wait("up{job=llama-server} == 1", 10, lambda: prom.value(f'up{{job="{LLAMA_JOB}"}}') == 1.0)
    before = prom.value("llamacpp:tokens_predicted_total") or 0.0

    # 5. One chat completion through the endpoint Prometheus scrapes, then the counters move.
    url = f"{scheme}://{target}"
    answer = chat_completion(url, key, cafile)
    predicted = answer.get("usage", {}).get("completion_tokens", 0)
    say(
        f"one chat completion through {url}/v1: {predicted} tokens, {json.dumps(answer['choices'][0]['message']['content'][:60])}"
    )
    after = wait(
        "llamacpp:tokens_predicted_total to move",
        20,
        lambda: (v := prom.value("llamacpp:tokens_predicted_total")) is not None and v > before and v,
    )
    tps = wait(
        "llamacpp:predicted_tokens_seconds > 0 in the last minute",
        10,
        lambda: prom.value("max_over_time(llamacpp:predicted_tokens_seconds[1m])"),
    )

    # 6. Every expression of the dashboard, as Grafana would send it.
    dashboard = json.loads(dashboard_file.read_text())
    exprs = [
        (p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", []) if t.get("expr")
    ]
    with_data, empty = [], []
    for title, expr in exprs:
        result = prom.query(expand_grafana(expr))  # raises on a parse or evaluation error
        (with_data if result else empty).append((title, expr))
        if "llamacpp:" in expr and not result:
            raise CheckError(f"panel {title!r}: {expr} returned no data from llama-server")

    # 7. What Prometheus sees.
    say("targets:")
    for t in sorted(prom.targets(), key=lambda t: (t["labels"]["job"], t["scrapeUrl"])):
        error = f" ({t['lastError']})" if t["lastError"] else ""
        say(f"  {t['labels']['job']:<22} {t['scrapeUrl']:<40} {t['health']}{error}")
    for job in jobs:
        if not any(t["labels"]["job"] == job for t in prom.targets()):
            say(f"  {job:<22} (no targets: the plan's backend is not this one)")
    node_up = prom.query('up{job="llmfleet-node"} == 1')
    if not node_up:
        say("  llmfleet-node is down on every host: the demo hosts run no node-exporter (expected)")
    say(
        f"llamacpp:tokens_predicted_total {before:.0f} -> {after:.0f}; "
        f"llamacpp:predicted_tokens_seconds (max over 1m) {tps:.1f} tokens/s"
    )
    say(f"dashboard: {len(exprs)} expressions evaluated without error, {len(with_data)} returned data:")
    for title, expr in with_data:
        say(f"  data  {title}: {expr}")
    for title, expr in empty:
        say(f"  empty {title}: {expr}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inventory", nargs="?", default="inventories/demo")
    parser.add_argument("-e", "--extra-vars", action="append", default=[], help="passed to ansible-playbook")
    args = parser.parse_args()
    os.chdir(ROOT)
    try:
        check(args.inventory, args.extra_vars)
    except (CheckError, OSError, subprocess.SubprocessError) as exc:
        print(f"check-prometheus: FAILED: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
