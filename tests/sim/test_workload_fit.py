"""`fit`: a spec fitted to a trace regenerates the trace's rate, burstiness, lengths and reuse."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from costline.cli import app
from sim.arrivals import arrival_times
from sim.describe import index_of_dispersion, interarrival_cv, prefix_reuse
from sim.fit import fit_arrival, fit_spec, shared_prefix_tokens
from sim.generate import generate
from sim.traces import load_trace
from sim.workload_spec import (
    ConstantArrival,
    GammaArrival,
    OnOffArrival,
    PoissonArrival,
    WorkloadSpec,
)

K = 5.0


def rate_rel_se(arrival, n: int, span_s: float) -> float:
    """Relative SE of requests/span for the fitted process (closed forms)."""
    if isinstance(arrival, PoissonArrival):
        return 1 / math.sqrt(n)
    if isinstance(arrival, GammaArrival):
        return 1 / math.sqrt(arrival.burstiness * n)  # CV / sqrt(n)
    l1, l0, m1, m0 = arrival.on_rate_rps, arrival.off_rate_rps, arrival.mean_on_s, arrival.mean_off_s
    ea, el = l1 * m1 + l0 * m0, m1 + m0
    var_a = l1 * m1 + l1**2 * m1**2 + l0 * m0 + l0**2 * m0**2
    var_l, cov = m1**2 + m0**2, l1 * m1**2 + l0 * m0**2
    return math.sqrt((var_a / ea**2 + var_l / el**2 - 2 * cov / (ea * el)) / (span_s / el))


def assert_quantiles_close(trace: np.ndarray, gen: np.ndarray):
    """Distribution-free: the generated p-quantile lies between the trace's quantiles at
    p -/+ K * sqrt(2 p (1 - p) / n) (two independent samples of size n)."""
    n = min(trace.size, gen.size)
    for p in (0.5, 0.9, 0.99):
        d = K * math.sqrt(2 * p * (1 - p) / n)
        lo, hi = np.quantile(trace, [max(0.0, p - d), min(1.0, p + d)])
        assert lo <= np.quantile(gen, p) <= hi, (p, lo, np.quantile(gen, p), hi)


def reuse_se(wl, prefix_tokens: int) -> float:
    """Delta-method SE of sum(reused) / sum(prompt) over the generated prompts, where a request
    reuses the min(L, p) // bs full blocks of the one shared prefix of L tokens."""
    bs = wl.hash_block_size
    x = np.minimum(prefix_tokens, wl.prompt_len) // bs * bs
    r = x.sum() / wl.prompt_len.sum()
    return float(np.std(x - r * wl.prompt_len) / np.sqrt(len(wl)) / wl.prompt_len.mean())


@pytest.mark.parametrize("name, kind", [("mooncake_conversation_trace.jsonl.gz", "gamma"),
                                        ("AzureLLMInferenceTrace_code.csv.gz", "onoff")])
def test_fitted_spec_regenerates_the_trace(traces_dir, name, kind):
    trace = load_trace(traces_dir / name)
    spec = fit_spec(trace)
    assert spec.arrival.kind == kind
    gen = generate(spec)
    assert len(gen) == len(trace)
    want_rate = len(trace) / trace.duration_s
    got_rate = len(gen) / gen.duration_s
    assert abs(got_rate / want_rate - 1) < K * rate_rel_se(spec.arrival, len(gen), gen.duration_s)
    assert abs(interarrival_cv(gen.arrival_s) / interarrival_cv(trace.arrival_s) - 1) < 0.15
    assert_quantiles_close(trace.prompt_len, gen.prompt_len)
    assert_quantiles_close(trace.output_len, gen.output_len)
    want_reuse = prefix_reuse(trace)["token_fraction"]
    got_reuse = prefix_reuse(gen)["token_fraction"]
    if want_reuse == 0:
        assert got_reuse == 0 and spec.system_prompts is None
    else:
        assert abs(got_reuse - want_reuse) < K * reuse_se(gen, spec.system_prompts.tokens.tokens) + 16 / trace.prompt_len.mean()
    if kind == "onoff":  # the on/off fit also keeps the clustering the gamma misses
        assert abs(index_of_dispersion(gen.arrival_s) / index_of_dispersion(trace.arrival_s) - 1) < 0.3


def test_fit_arrival_picks_the_model_by_cv():
    rng = np.random.default_rng(0)
    assert isinstance(fit_arrival(arrival_times(ConstantArrival(rate_rps=3), 500, rng)), ConstantArrival)
    p = fit_arrival(arrival_times(PoissonArrival(rate_rps=3), 20_000, rng))
    assert isinstance(p, PoissonArrival) and abs(p.rate_rps / 3 - 1) < K / math.sqrt(20_000)
    g = fit_arrival(arrival_times(GammaArrival(rate_rps=3, burstiness=4.0), 20_000, rng))
    assert isinstance(g, GammaArrival) and abs(1 / math.sqrt(g.burstiness) - 0.5) < 0.05


def test_onoff_fit_recovers_a_known_process():
    truth = OnOffArrival(on_rate_rps=20.0, off_rate_rps=0.0, mean_on_s=5.0, mean_off_s=30.0)
    t = arrival_times(truth, 300_000, np.random.default_rng(5))
    got = fit_arrival(t)
    assert isinstance(got, OnOffArrival)
    for f in ("on_rate_rps", "mean_on_s", "mean_off_s"):
        assert abs(getattr(got, f) / getattr(truth, f) - 1) < 0.15, (f, getattr(got, f))


def test_shared_prefix_length_solves_the_reuse_equation():
    p = np.array([100, 1000, 5000])
    length = shared_prefix_tokens(p, 0.2, 16)
    share = lambda n: float(((np.minimum(n, p) // 16) * 16).sum()) / p.sum()
    assert share(length) >= 0.2 > share(length - 1)


def test_cli_fit_writes_a_spec_that_scales(traces_dir, tmp_path):
    out = tmp_path / "spec.json"
    runner = CliRunner()
    res = runner.invoke(app, ["workload", "fit", str(traces_dir / "AzureLLMInferenceTrace_code.csv.gz"), "-o", str(out)])
    assert res.exit_code == 0, res.output
    spec = WorkloadSpec.model_validate(json.loads(out.read_text()))
    res2 = runner.invoke(app, ["workload", "fit", str(traces_dir / "AzureLLMInferenceTrace_code.csv.gz"), "--rate-scale", "2"])
    doubled = WorkloadSpec.model_validate_json(res2.output)
    assert doubled.arrival.kind == spec.arrival.kind == "onoff"
    assert doubled.arrival.rate_rps == pytest.approx(2 * spec.arrival.rate_rps)  # long-run rate
    assert doubled.arrival.mean_on_s == spec.arrival.mean_on_s  # same burst timing, twice the users
    assert doubled.num_requests == 2 * spec.num_requests
    d = json.loads(runner.invoke(app, ["workload", "describe", str(out), "--json"]).output)
    assert d["requests"] == spec.num_requests
