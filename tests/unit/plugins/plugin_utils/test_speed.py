"""The time-per-token model (plugins/plugin_utils/speed.py) on small cases computed by hand."""

import math

import pytest
from ansible_collections.llmfleet.cluster.plugins.plugin_utils import speed as S
from ansible_collections.llmfleet.cluster.plugins.plugin_utils.placement_hosts import Host, Model

from tests.unit.plugins.plugin_utils.test_placement import layout

# n_embd 256 -> an activation row is 1024 bytes; n_vocab 1000 -> logits 4000 bytes.
# At 8 Mbit/s one byte takes 1 microsecond: a row 1.024 ms, the logits 4.0 ms.
MODEL = Model.from_layout(layout(n_layer=8))
HEAD = Host("head", "head", 1000)
W1 = Host("w1", "worker", 1000, address="10.0.0.3")
W2 = Host("w2", "worker", 1000, address="10.0.0.4")
FIGS = {
    "head": S.Figures(2.0),
    "w1": S.Figures(1.0, rtt_ms=5.0, mbit_s=8.0),
    "w2": S.Figures(3.0, rtt_ms=1.0, mbit_s=80.0),
}


def test_one_worker_holding_the_output():
    est = S.estimate(MODEL, HEAD, [W1], 2, [6], False, FIGS, prompt_tokens=10)
    # compute 2 x 2 + 6 x 1 + the output (5 MiB: one layer's cost at least) on w1 1 = 11;
    # link: rtt 5 + one row in 1.024 + the logits back 4.0
    assert est.compute_ms == pytest.approx(11.0)
    assert est.links[0]["activation_ms"] == pytest.approx(1.024)
    assert est.links[0]["logits_ms"] == pytest.approx(4.0)
    assert est.ms_per_token == pytest.approx(21.024)
    plan = est.to_plan()
    assert plan["tokens_per_second"] == pytest.approx(1000 / 21.024, abs=0.01)
    # 10 prompt tokens: 10 x 11 compute + rtt 5 + 10 rows in 10.24 + the last token's logits 4.0
    assert plan["ttft_s"] == pytest.approx(0.12924, abs=1e-3)
    assert plan["bottleneck"].startswith("link head-w1: 10.02 ms of 21.02 ms")


def test_output_on_the_head_costs_two_rows_and_no_logits():
    est = S.estimate(MODEL, HEAD, [W1], 2, [6], True, FIGS)
    # compute 4 + the output on the head 2 + 6; rows in and out 2 x 1.024, no logits
    assert est.ms_per_token == pytest.approx(12.0 + 5.0 + 2.048)
    assert est.links[0]["logits_ms"] == 0.0


def test_two_workers_each_hop_and_the_head_alone():
    est = S.estimate(MODEL, HEAD, [W1, W2], 0, [5, 3], False, FIGS)
    # compute 5 + 9 + the output on w2 3 = 17; w1: 5 + 2.048; w2 (output, 80 Mbit/s: 0.1 us per
    # byte): 1 + 0.1024 + 0.4
    assert est.ms_per_token == pytest.approx(17 + 7.048 + 1.5024)
    alone = S.estimate(MODEL, HEAD, [], 8, [], True, FIGS)
    assert alone.ms_per_token == pytest.approx(18.0) and alone.links == []
    assert alone.to_plan()["bottleneck"] == "head compute: 18.00 ms of 18.00 ms per token (100%)"


def test_the_output_layer_costs_its_weight_in_layers_on_its_holder():
    # a 30 MiB output against 10 MiB layers: 3 layers of work, on the head (2 ms) or on w1 (1 ms)
    big = Model.from_layout(layout(n_layer=8, out_mib=30.0))
    assert S.output_layer_equivalents(big) == pytest.approx(3.0)
    on_head = S.estimate(big, HEAD, [W1], 2, [6], True, FIGS)
    assert on_head.compute_ms == pytest.approx(2 * 2 + 3 * 2 + 6 * 1)
    assert on_head.hosts[0]["output_ms"] == pytest.approx(6.0)
    on_w1 = S.estimate(big, HEAD, [W1], 2, [6], False, FIGS)
    assert on_w1.compute_ms == pytest.approx(2 * 2 + 6 * 1 + 3 * 1)
    assert "output_ms" not in on_w1.hosts[0] and on_w1.hosts[1]["output_ms"] == pytest.approx(3.0)


def test_a_host_without_figures_gives_no_estimate():
    assert S.estimate(MODEL, HEAD, [W1], 2, [6], False, {"head": FIGS["head"]}) is None


@pytest.mark.parametrize(
    ("speed", "needle"),
    [
        ({"ms_per_layer": float("nan"), "rtt_ms": 1, "mbit_s": 100}, "speed.ms_per_layer"),
        ({"ms_per_layer": 0, "rtt_ms": 1, "mbit_s": 100}, "got 0"),
        ({"ms_per_layer": -1.5, "rtt_ms": 1, "mbit_s": 100}, "got -1.5"),
        ({"ms_per_layer": 1, "rtt_ms": 1, "mbit_s": 0}, "speed.mbit_s"),
        ({"ms_per_layer": 1, "rtt_ms": math.inf, "mbit_s": 100}, "speed.rtt_ms"),
        ({"ms_per_layer": 1, "rtt_ms": 1, "mbit_s": 1e12}, "speed.mbit_s"),
        ({"ms_per_layer": 1e9, "rtt_ms": 1, "mbit_s": 100}, "<= 60000"),
        ({"ms_per_layer": True, "rtt_ms": 1, "mbit_s": 100}, "got True"),
        ({"ms_per_layer": "3", "rtt_ms": 1, "mbit_s": 100}, "got '3'"),
        ({"ms_per_layer": 1, "mbit_s": 100}, "speed.rtt_ms"),
        ({"ms_per_layer": 1, "rtt_ms": 1, "mbit_s": 100, "gbit": 1}, "unknown keys gbit"),
        ("fast", "speed must be"),
    ],
)
def test_odd_figures_are_refused_naming_the_host(speed, needle):
    with pytest.raises(ValueError, match="host nas") as err:
        S.figures_of({"name": "nas", "speed": speed}, "worker")
    assert needle in str(err.value)


def test_the_head_needs_only_its_compute_and_numbers_are_no_figures():
    assert S.figures_of({"name": "h", "speed": {"ms_per_layer": 2}}, "head") == S.Figures(2.0)
    with pytest.raises(ValueError, match=r"host h: speed\.ms_per_layer"):
        S.figures_of({"name": "h", "speed": {"rtt_ms": 1}}, "head")
    assert S.figures_of({"name": "w", "speed": 4}, "worker") is None
    assert S.figures_of({"name": "w"}, "worker") is None
    got = S.figures_for({"name": "h", "speed": {"ms_per_layer": 2}}, [{"name": "w"}])
    assert set(got) == {"h"}


def test_a_quota_d_host_below_its_cap_costs_its_cpu_time_not_cpu_over_quota():
    """w1 computes a layer in 1 ms of CPU: 6 layers + the output = 7 ms of CPU a token. Under a
    0.5 CPU quota that is a cap of 14 ms per token, below the chain (21.024 ms, the first test):
    w1 costs its 7 ms (the old figure, CPU / quota, made it 14 ms of compute: 28.024 ms). Under
    0.25 the cap is 28 ms and binds."""
    figs = dict(FIGS, w1=S.Figures(1.0, rtt_ms=5.0, mbit_s=8.0, cpu_quota=0.25))
    est = S.estimate(MODEL, HEAD, [W1], 2, [6], False, figs)
    assert est.chain_ms == pytest.approx(21.024)
    assert est.hosts[1]["cap_ms"] == pytest.approx(28.0)
    assert est.ms_per_token == pytest.approx(28.0)
    figs = dict(FIGS, w1=S.Figures(1.0, rtt_ms=5.0, mbit_s=8.0, cpu_quota=0.5))
    est = S.estimate(MODEL, HEAD, [W1], 2, [6], False, figs)
    # a 0.5 quota: cap 14 ms < the chain 21.024: the chain it is, w1 at its own 7 ms
    assert est.ms_per_token == pytest.approx(21.024)
    assert est.to_plan()["bottleneck"].startswith("link head-w1: 10.02 ms of 21.02 ms")


def test_a_quota_d_host_above_its_cap_bounds_tokens_per_second():
    """w2 under a 0.1 CPU quota holding 5 layers + the output at 3 ms of CPU a layer: 18 ms of CPU
    a token, 180 ms per token at least whatever the chain (28.55 ms): 5.56 tokens/s."""
    figs = dict(FIGS, w2=S.Figures(3.0, rtt_ms=1.0, mbit_s=80.0, cpu_quota=0.1))
    est = S.estimate(MODEL, HEAD, [W1, W2], 0, [3, 5], False, figs)
    assert est.chain_ms == pytest.approx(3 + 18 + 7.048 + 1.5024)
    assert est.ms_per_token == pytest.approx(180.0)
    plan = est.to_plan()
    assert plan["tokens_per_second"] == pytest.approx(5.56)
    assert plan["bottleneck"] == "w2 CPU quota 0.1: 18.0 ms of CPU per token caps the fleet at 5.6 tokens/s"
    # a 2-thread host: its CPU per layer is its threads' sum, twice its unthrottled time
    figs = dict(FIGS, w2=S.Figures(1.5, rtt_ms=1.0, mbit_s=80.0, cpu_quota=0.1, cpu_ms_per_layer=3.0))
    assert S.estimate(MODEL, HEAD, [W1, W2], 0, [3, 5], False, figs).ms_per_token == pytest.approx(180.0)


@pytest.mark.parametrize(
    "key, value, message",
    [
        ("cpu_quota", 0, "host nas: speed.cpu_quota must be a finite number > 0"),
        ("cpu_quota", -0.25, "host nas: speed.cpu_quota must be a finite number > 0"),
        ("cpu_quota", float("nan"), "host nas: speed.cpu_quota must be a finite number > 0"),
        ("cpu_ms_per_layer", 0.0, "host nas: speed.cpu_ms_per_layer must be a finite number > 0"),
    ],
)
def test_quota_figures_are_validated_with_the_host_named(key, value, message):
    speed = {"ms_per_layer": 1.0, "rtt_ms": 1.0, "mbit_s": 100.0, key: value}
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        S.figures_of({"name": "nas", "speed": speed}, "worker")
    fig = S.figures_of({"name": "nas", "speed": dict(speed, **{key: 0.5})}, "worker")
    assert fig is not None and getattr(fig, key) == 0.5


def test_a_measured_output_layer_and_the_heads_token_time_are_their_own_terms():
    # the output layer measured at 4 ms on w1 (its weight would say 1 layer = 1 ms) and the head's
    # 7 ms a token outside layers and links
    figs = dict(FIGS, head=S.Figures(2.0, token_ms=7.0), w1=S.Figures(1.0, 5.0, 8.0, output_ms=4.0))
    est = S.estimate(MODEL, HEAD, [W1], 2, [6], False, figs, prompt_tokens=10)
    # compute 2 x 2 + 6 x 1 + 4 = 14; link 5 + 1.024 + 4.0; the head's 7
    assert est.compute_ms == pytest.approx(14.0)
    assert est.ms_per_token == pytest.approx(14.0 + 10.024 + 7.0)
    plan = est.to_plan()
    assert plan["token_ms"] == pytest.approx(7.0)
    assert plan["hosts"][1]["output_priced"] == "figures" and plan["hosts"][1]["output_ms"] == 4.0
    # the head's time counts once for the prompt's batch: 7 + 10 x 14 + 5 + 10.24 + 4.0
    assert plan["ttft_s"] == pytest.approx(0.16624, abs=1e-3)
    # and it is named when it is the largest term
    slow_head = dict(figs, head=S.Figures(2.0, token_ms=40.0))
    assert (
        S.estimate(MODEL, HEAD, [W1], 2, [6], False, slow_head)
        .bottleneck()
        .startswith("head per-token work: 40.00 ms of")
    )


def test_a_quota_d_holder_pays_the_measured_output_cpu_in_its_cap():
    # w1 under a 0.5 quota: 6 layers x 1 ms CPU + the output layer's measured 9 CPU ms = 15 ms of
    # CPU a token, a cap of 30 ms (by weight it would be 7 ms of CPU, a cap of 14)
    figs = dict(FIGS, w1=S.Figures(1.0, 5.0, 8.0, cpu_quota=0.5, output_ms=9.0))
    est = S.estimate(MODEL, HEAD, [W1], 2, [6], False, figs)
    assert est.capped["name"] == "w1" and est.capped["cap_ms"] == pytest.approx(30.0)
    assert est.ms_per_token == pytest.approx(30.0)
    assert figs["w1"].max_layers(30.0, figs["w1"].output_cpu(1.0)) == 6


@pytest.mark.parametrize(
    ("role", "speed", "needle"),
    [
        ("worker", {"ms_per_layer": 1.0, "rtt_ms": 1.0, "mbit_s": 10.0, "token_ms": 3.0}, "head's figure"),
        ("worker", {"ms_per_layer": 1.0, "rtt_ms": 1.0, "mbit_s": 10.0, "output_ms": 0.0}, "speed.output_ms"),
        ("head", {"ms_per_layer": 1.0, "token_ms": -2.0}, "speed.token_ms"),
        ("head", {"ms_per_layer": 1.0, "output_cpu_ms": math.nan}, "speed.output_cpu_ms"),
    ],
)
def test_odd_output_and_token_figures_are_refused_naming_the_host(role, speed, needle):
    with pytest.raises(ValueError, match="host n1") as err:
        S.figures_of({"name": "n1", "speed": speed}, role)
    assert needle in str(err.value)
