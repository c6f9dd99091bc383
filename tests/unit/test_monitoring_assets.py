"""The monitoring assets of roles/monitoring are valid and reference real metrics.

Every PromQL expression of the Grafana dashboard may only use metric names that llama-server
(its recorded /metrics), vLLM or node-exporter export (tests/fixtures/monitoring/README.md).
The scrape config is rendered from the role's template and defaults with Ansible's own templar,
plain and with llmfleet_tls, and checked by `promtool check config` when it is installed.
scripts/check-prometheus.py runs a real Prometheus against the demo fleet with it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from ansible_collections.llmfleet.cluster.plugins.module_utils.monitoring import (
    MonitoringError,
    scrape_targets,
)

from tests.support.fleet_lookup import inline_fleet_lookups

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "monitoring"
FILES = ROLE / "files"
FIX = ROOT / "tests" / "fixtures" / "monitoring"

PROMQL_WORDS = {
    "sum", "avg", "min", "max", "count", "rate", "irate", "increase", "by", "without",
    "histogram_quantile", "on", "ignoring", "and", "or", "unless", "bool", "offset",
}  # fmt: skip


def _llama_server_metrics() -> set:
    names = set()
    for line in (FIX / "llama-server-metrics.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            names.add(line.split()[0].split("{")[0])
    return names


def _listed(name: str) -> set:
    return {line.strip() for line in (FIX / name).read_text().splitlines() if line.strip()}


KNOWN = _llama_server_metrics() | _listed("vllm-metrics.txt") | _listed("node-exporter-metrics.txt")


def metric_names(expr: str) -> set:
    """Metric names of a PromQL expression: identifiers outside label matchers and grouping."""
    text = re.sub(r"\{[^}]*\}", "", expr)  # label matchers
    text = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", text)  # grouping labels
    text = re.sub(r"\[[^\]]*\]", "", text)  # range selectors
    text = re.sub(r'"[^"]*"', "", text)
    names = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text))
    return {n for n in names if n not in PROMQL_WORDS and not re.fullmatch(r"[0-9.e]+", n)}


def _dashboard() -> dict:
    return json.loads((FILES / "grafana-dashboard.json").read_text())


def _exprs() -> list:
    return [(p["title"], t["expr"]) for p in _dashboard()["panels"] for t in p["targets"]]


def test_the_recorded_llama_server_metrics_are_the_ones_the_seeds_watch() -> None:
    for name in ("llamacpp:predicted_tokens_seconds", "llamacpp:prompt_tokens_seconds",
                 "llamacpp:requests_processing", "llamacpp:requests_deferred"):  # fmt: skip
        assert name in KNOWN


def test_metric_name_extraction() -> None:
    expr = 'sum by (instance) (rate(node_network_receive_bytes_total{device=~"(eth|ens).*"}[1m]))'
    assert metric_names(expr) == {"node_network_receive_bytes_total"}
    assert metric_names("a:b - c_d") == {"a:b", "c_d"}


@pytest.mark.parametrize(("title", "expr"), _exprs(), ids=[f"{t}:{e[:40]}" for t, e in _exprs()])
def test_every_expression_uses_exported_metrics(title: str, expr: str) -> None:
    names = metric_names(expr)
    assert names, f"{title}: {expr} references no metric"
    unknown = names - KNOWN
    assert not unknown, (
        f"panel {title!r}: {sorted(unknown)} not exported by llama-server, vLLM or node-exporter"
    )


def test_dashboard_has_the_panels_the_seeds_used() -> None:
    dashboard = _dashboard()
    assert dashboard["uid"] and dashboard["title"]
    used = set().union(*(metric_names(e) for _unused, e in _exprs()))
    for needed in (
        "llamacpp:predicted_tokens_seconds",
        "llamacpp:requests_processing",
        "llamacpp:requests_deferred",
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:generation_tokens_total",
        "node_cpu_seconds_total",
        "node_network_receive_bytes_total",
        "node_network_transmit_bytes_total",
    ):
        assert needed in used, needed
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"
        assert [t["refId"] for t in panel["targets"]] == [chr(65 + i) for i in range(len(panel["targets"]))]
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource"]


def test_network_panels_match_interfaces_by_pattern_not_by_name() -> None:
    network = [e for _unused, e in _exprs() if "node_network_" in e]
    assert len(network) == 2
    for expr in network:
        matcher = re.search(r'device=~"([^"]+)"', expr)
        assert matcher, expr
        pattern = re.compile(matcher.group(1))
        for name in ("eth0", "ens5", "enp3s0"):
            assert pattern.fullmatch(name), (name, expr)
        assert not pattern.fullmatch("lo")


def _trusted(value):
    """Mark strings as templates, the way Ansible treats a role's defaults files."""
    try:
        from ansible.template import trust_as_template  # ansible-core >= 2.19
    except ImportError:  # pragma: no cover - older ansible-core trusts every string
        return value
    return trust_as_template(value) if isinstance(value, str) else value


def _templar(extra: dict):
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar

    defaults = yaml.safe_load(inline_fleet_lookups((ROLE / "defaults" / "main.yml").read_text()))
    variables = {k: _trusted(v) for k, v in defaults.items()}
    variables.update(extra)
    return Templar(loader=DataLoader(), variables=variables)


def render_scrape(**extra) -> str:
    """templates/prometheus-scrape.yml.j2 as the role's template task writes it (trim_blocks)."""
    text = (ROLE / "templates" / "prometheus-scrape.yml.j2").read_text()
    return _templar(extra).template(_trusted(text), escape_backslashes=False, overrides={"trim_blocks": True})


def role_default(name: str, **extra) -> str:
    return str(_templar(extra).template(_trusted("{{ " + name + " }}")))


TLS_CASES = {"plain": {}, "llmfleet_tls": {"llmfleet_tls": True}}


@pytest.mark.parametrize("case", TLS_CASES)
def test_scrape_config_jobs(case: str) -> None:
    config = yaml.safe_load(render_scrape(**TLS_CASES[case]))
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"llmfleet-llama-server", "llmfleet-vllm", "llmfleet-node"}
    llama = jobs["llmfleet-llama-server"]
    assert llama["metrics_path"] == "/metrics"
    assert llama["authorization"]["type"] == "Bearer"
    assert llama["authorization"]["credentials_file"].startswith("/")
    assert "credentials" not in llama["authorization"], "never a key inline"
    for job in jobs.values():
        (files,) = [sd["files"] for sd in job["file_sd_configs"]]
        assert len(files) == 1 and files[0].endswith(".json")
    # the role writes one target list per job, named after the file_sd path
    written = {Path(j["file_sd_configs"][0]["files"][0]).stem for j in jobs.values()}
    assert written == {"llama-server", "vllm", "node"}
    if case == "plain":
        assert "scheme" not in llama and "tls_config" not in llama
    else:
        assert llama["scheme"] == "https"
        assert llama["tls_config"] == {"ca_file": "/etc/prometheus/llmfleet/ca.crt"}
    # only the llama-server job goes through the chat page's TLS port
    for name in ("llmfleet-vllm", "llmfleet-node"):
        assert "scheme" not in jobs[name] and "tls_config" not in jobs[name]


def test_scrape_config_without_a_ca_file_trusts_the_system_cas() -> None:
    config = yaml.safe_load(render_scrape(llmfleet_tls=True, monitoring_tls_ca_file=""))
    llama = config["scrape_configs"][0]
    assert llama["scheme"] == "https" and "tls_config" not in llama


def test_api_port_and_scheme_follow_llmfleet_tls() -> None:
    assert (role_default("monitoring_api_port"), role_default("monitoring_api_scheme")) == ("8080", "http")
    tls = {"llmfleet_tls": True}
    assert (role_default("monitoring_api_port", **tls), role_default("monitoring_api_scheme", **tls)) == (
        "8088",
        "https",
    )
    assert role_default("monitoring_api_port", llmfleet_tls=True, chat_ui_port=9443) == "9443"
    assert role_default("monitoring_api_port", llmfleet_tls=False, chat_ui_port=9443) == "8080"


@pytest.mark.skipif(not shutil.which("promtool"), reason="promtool (apt prometheus, scripts/host-setup.sh)")
@pytest.mark.parametrize("case", TLS_CASES)
def test_promtool_accepts_the_scrape_config_and_the_target_lists(case: str, tmp_path: Path) -> None:
    from tests.support.tls import self_signed

    extra = TLS_CASES[case]
    text = render_scrape(**extra)
    # the files where the config expects them, in tmp_path instead of /etc/prometheus/llmfleet/
    targets = scrape_targets(PLAN, api_port=int(role_default("monitoring_api_port", **extra)))
    for job, content in targets.items():
        (tmp_path / f"{job}.json").write_text(json.dumps(content))
    (tmp_path / "api-key").write_text("not-a-real-key\n")
    cert, _unused = self_signed("10.89.0.2", tmp_path / "tls")
    shutil.copy(cert, tmp_path / "ca.crt")
    config = tmp_path / "prometheus.yml"
    config.write_text(text.replace("/etc/prometheus/llmfleet/", f"{tmp_path}/"))
    result = subprocess.run(
        ["promtool", "check", "config", str(config)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout + result.stderr
    # and it fails closed on a missing key file (so the check above means something)
    (tmp_path / "api-key").unlink()
    result = subprocess.run(
        ["promtool", "check", "config", str(config)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode != 0


PLAN = {
    "backend": "llama_cpp",
    "head": "head1",
    "hosts": [
        {"name": "head1", "role": "head", "address": "10.89.0.2"},
        {"name": "w1", "role": "worker", "address": "10.89.0.3"},
    ],
}


def test_scrape_targets_from_the_plan() -> None:
    targets = scrape_targets(PLAN, api_port=8081, node_port=9101, fleet="demo")
    assert targets["llama-server"] == [
        {"targets": ["10.89.0.2:8081"], "labels": {"fleet": "demo", "host": "head1", "role": "head"}}
    ]
    assert targets["vllm"] == []
    assert [t["targets"] for t in targets["node"]] == [["10.89.0.2:9101"], ["10.89.0.3:9101"]]
    vllm = scrape_targets(dict(PLAN, backend="vllm"))
    assert vllm["llama-server"] == [] and vllm["vllm"][0]["targets"] == ["10.89.0.2:8080"]


def test_scrape_targets_name_hosts_without_an_address() -> None:
    plan = {"head": "h", "hosts": [{"name": "h", "address": "1.2.3.4"}, {"name": "w9"}]}
    with pytest.raises(MonitoringError, match="w9"):
        scrape_targets(plan)


def test_scrape_targets_take_the_addresses_prometheus_reaches() -> None:
    # WireGuard: w1's plan address is its tunnel address; Prometheus outside the tunnel gets its LAN one
    plan = dict(PLAN, hosts=[dict(PLAN["hosts"][0]), dict(PLAN["hosts"][1], address="10.213.0.7")])
    targets = scrape_targets(plan, addresses={"w1": "10.89.0.3", "nothere": "1.1.1.1"})
    assert [t["targets"] for t in targets["node"]] == [["10.89.0.2:9100"], ["10.89.0.3:9100"]]
    assert targets["llama-server"][0]["targets"] == ["10.89.0.2:8080"]
