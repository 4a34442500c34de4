"""Speculative decoding's acceptance model: how many tokens each verification step yields.

Each request gets a per-token acceptance probability alpha, drawn once from a Beta
distribution chosen by its task category (code is more predictable than open chat;
n-gram lookup only pays where the output copies the prompt). Drafts are accepted one
by one until the first rejection, so with k drafts the number accepted X follows the
truncated geometric law P(X >= j) = alpha^j (j <= k), and the step emits X + 1 tokens
(the accepted drafts plus the target model's corrected/bonus token):

    E[tokens per step] = (1 - alpha^(k+1)) / (1 - alpha)

(the simulator draws per step and never needs the mean; tests check the draws against it).

Alpha may drift with simulated time (a task mix or a model that drifts away from the
draft), by `acceptance_drift_per_s` per second.

The proposer's *cost* (draft model forwards, EAGLE head, n-gram CPU time) is the cost
model's business (sim/cost_model.py); its *memory* is sim/memory.py's.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from engine.core.scheduler_output import ScheduledRequest
from sim.config import SpeculativeConfig


def _beta(mean: float, concentration: float = 20.0) -> tuple[float, float]:
    return (mean * concentration, (1 - mean) * concentration)


# Mean per-token acceptance by method and task category. First-principles priors in the
# range public reports give (EAGLE acceptance length ~1.9-2.1 at k=2..4 on chat, n-gram
# good on extractive/code and poor on open chat); calibrated tables override them through
# `speculative_config.acceptance_beta`.
_CATS = ("default", "chat", "code", "json", "reasoning", "summarize", "qa", "agent")
_MEANS: dict[str, dict[str, float]] = {
    #                          default chat  code  json  reasoning summarize qa  agent
    "ngram":       dict(zip(_CATS, (0.25, 0.20, 0.45, 0.50, 0.20, 0.55, 0.55, 0.35))),
    "draft_model": dict(zip(_CATS, (0.65, 0.62, 0.72, 0.75, 0.58, 0.68, 0.70, 0.66))),
    "eagle":       dict(zip(_CATS, (0.60, 0.58, 0.68, 0.70, 0.55, 0.62, 0.64, 0.62))),
    "eagle3":      dict(zip(_CATS, (0.68, 0.66, 0.75, 0.78, 0.62, 0.70, 0.72, 0.70))),
    "mtp":         dict(zip(_CATS, (0.75, 0.72, 0.80, 0.82, 0.70, 0.76, 0.78, 0.76))),
}
DEFAULT_ACCEPTANCE: dict[str, dict[str, tuple[float, float]]] = {
    method: {cat: _beta(m) for cat, m in means.items()} for method, means in _MEANS.items()
}

ALPHA_MIN, ALPHA_MAX = 1e-6, 1 - 1e-6
# The range a prior mean acceptance is trusted to: +-30% of it (the advisor's gain interval
# simulates both ends). Public figures for one method on one task differ by about that much
# between reports, draft sizes and temperatures; a measured table (`acceptance_beta`) replaces it.
ACCEPTANCE_RANGE = 0.30
MAX_SCALED_ACCEPTANCE = 0.98


# Acceptance measured on the engine, by (method, target model): a JSON in sim/profiles written by
# the fit of that measurement (benchmarks/spec_decode/fit_eagle.py), Beta (a, b) per task and k.
MEASURED_ACCEPTANCE_FILES = {("eagle3", "byte-lm-100m"): "eagle3-acceptance-byte-lm-100m.json"}
PROFILES_DIR = Path(__file__).with_name("profiles")


@dataclass(frozen=True, slots=True)
class AcceptanceSource:
    """The per-task Beta table a simulation draws acceptance from, and where it comes from:
    "measured" (on the engine, for this target model), "prior" (sim's table, a literature range)
    or "user" (the config's own `acceptance_beta`)."""

    table: dict[str, tuple[float, float]]
    provenance: str
    source: str


@cache
def _measured_file(name: str) -> dict | None:
    path = PROFILES_DIR / name
    return json.loads(path.read_text()) if path.is_file() else None


def acceptance_source(spec: SpeculativeConfig, model: str | None = None) -> AcceptanceSource:
    """The acceptance table for `spec` on target `model`: the config's own, else the engine's
    measurement for this method x model (the k measured nearest to the config's), else the prior."""
    prior = dict(DEFAULT_ACCEPTANCE.get(spec.method, DEFAULT_ACCEPTANCE["eagle"]))
    if spec.acceptance_beta:
        return AcceptanceSource(prior | spec.acceptance_beta, "user", "speculative_config.acceptance_beta")
    name = MEASURED_ACCEPTANCE_FILES.get((spec.method, model or ""))
    data = _measured_file(name) if name else None
    if data is None:
        return AcceptanceSource(prior, "prior", "sim/speculative.py's prior table (the range public reports give; "
                                                "EAGLE-3 after its paper's and vLLM's acceptance lengths)")
    k = min(data["by_k"], key=lambda x: (abs(int(x) - spec.num_speculative_tokens), int(x)))
    table = {task: (float(a), float(b)) for task, (a, b) in data["by_k"][k].items()}
    return AcceptanceSource(table, "measured", f"{data['source']} (k={k})")


def scaled_acceptance(spec: SpeculativeConfig, factor: float, model: str | None = None) -> dict:
    """The speculative config (as a dict) with every task's mean acceptance x `factor` (capped
    at MAX_SCALED_ACCEPTANCE), the same Beta concentration: the table `acceptance_source` picks
    (the config's own, the measured one for `model`, or the prior)."""
    table = dict(acceptance_source(spec, model).table)
    scaled = {}
    for cat, (a, b) in table.items():
        total = a + b
        mean = min(a / total * factor, MAX_SCALED_ACCEPTANCE)
        scaled[cat] = (mean * total, (1 - mean) * total)
    return spec.model_copy(update={"acceptance_beta": scaled}).model_dump()


def sample_accepted(rng: np.random.Generator, alpha: np.ndarray, k: int) -> np.ndarray:
    """Accepted drafts per request (0..k), truncated geometric: P(X >= j) = alpha^j.

    Inverse transform: X = floor(log U / log alpha) has P(X >= j) = P(U <= alpha^j).
    """
    # the two ufuncs, not clip: ndarray.clip still goes through numpy's Python wrapper (its ndim checks were
    # ~4% of the demo's simulation time in py-spy); same values for every alpha that is not NaN
    a = np.maximum(np.minimum(alpha, ALPHA_MAX), ALPHA_MIN)
    u = 1.0 - rng.random(a.shape)  # in (0, 1]: log is finite
    x = np.floor(np.log(u) / np.log(a))
    return np.minimum(x, k).astype(np.int64)


class AcceptanceModel:
    """Per-request alphas and per-step accepted counts for one simulation (seeded)."""

    def __init__(self, spec: SpeculativeConfig, seed: int, model: str | None = None) -> None:
        self.k = spec.num_speculative_tokens
        self.source = acceptance_source(spec, model)
        table = dict(self.source.table)
        for cat, (a, b) in table.items():
            if a <= 0 or b <= 0:
                raise ValueError(f"speculative_config.acceptance_beta[{cat!r}] = ({a}, {b}): "
                                 "both Beta parameters must be > 0")
        self.table = table
        self.drift_per_s = spec.acceptance_drift_per_s
        self.rng = np.random.default_rng([seed, 0x5BEC])
        self._alpha: dict[int, float] = {}

    def alpha(self, request_id: int, category: str) -> float:
        """This request's base alpha, drawn on first use from its category's Beta."""
        a = self._alpha.get(request_id)
        if a is None:
            ab = self.table.get(category) or self.table["default"]
            a = float(self.rng.beta(*ab))
            self._alpha[request_id] = a
        return a

    def tokens_per_step(self, alphas: np.ndarray, now_s: float) -> np.ndarray:
        """Tokens emitted this step by each decoding request (1..k+1)."""
        if self.drift_per_s:
            alphas = (alphas + self.drift_per_s * now_s).clip(ALPHA_MIN, ALPHA_MAX)
        return sample_accepted(self.rng, alphas, self.k) + 1


class SpecTokens:
    """Tokens each sampling request emits in a step with speculative decoding, and run totals
    (vLLM's spec_decode counters). One per simulation, shared by its replicas: the draws come
    from one seeded stream in step order, so the same seed gives the same run."""

    def __init__(self, acceptance: AcceptanceModel, category_of: Callable[[int], str]) -> None:
        self.acceptance = acceptance
        self.category_of = category_of
        self.num_drafts = self.draft_tokens = self.accepted_tokens = 0

    def counts(self, samplers: Sequence[ScheduledRequest], now_s: float) -> tuple[dict[int, int], int, int]:
        """(tokens per sampling request, drafted, accepted) for one step ending at `now_s`."""
        acc = self.acceptance
        counts: dict[int, int] = {}
        verified, alphas = [], []
        for sr in samplers:
            if sr.num_spec_tokens:
                verified.append(sr)
                alphas.append(acc.alpha(sr.request_id, self.category_of(sr.request_id)))
            else:
                counts[sr.request_id] = 1
        drafted = accepted = 0
        if verified:
            for sr, t in zip(verified, acc.tokens_per_step(np.asarray(alphas), now_s).tolist()):
                t = min(t, sr.num_spec_tokens + 1)
                counts[sr.request_id] = t
                drafted += sr.num_spec_tokens
                accepted += t - 1
            self.num_drafts += len(verified)
            self.draft_tokens += drafted
            self.accepted_tokens += accepted
        return counts, drafted, accepted


# ---------------------------------------------------------------------------- fitting
# The alpha grid the marginal likelihood is integrated on (midpoints: no 0 or 1).
_GRID = (np.arange(400) + 0.5) / 400


def steps_pmf(alpha: np.ndarray, k: int, num_steps: int) -> np.ndarray:
    """P(total accepted = s) over `num_steps` verify steps of `k` drafts each, for each alpha:
    [len(alpha), num_steps * k + 1]. One step's law is the truncated geometric
    P(X = x) = alpha^x (1 - alpha) (x < k), P(X = k) = alpha^k; steps are independent."""
    a = np.asarray(alpha, dtype=np.float64)[:, None]
    x = np.arange(k + 1)
    one = a**x * np.where(x < k, 1 - a, 1.0)
    size = num_steps * k + 1
    n_fft = 1 << (size - 1).bit_length()
    return np.fft.irfft(np.fft.rfft(one, n_fft) ** num_steps, n_fft)[:, :size].clip(min=0.0)


def _request_likelihoods(accepted: np.ndarray, steps: np.ndarray, k: int) -> np.ndarray:
    """[requests, grid]: P(request's accepted total | alpha) on the alpha grid."""
    out = np.empty((accepted.size, _GRID.size))
    for n in np.unique(steps):
        rows = np.flatnonzero(steps == n)
        pmf = steps_pmf(_GRID, k, int(n))
        out[rows] = pmf[:, accepted[rows]].T
    return np.maximum(out, 1e-300)


def fit_acceptance_beta(accepted: Sequence[int], drafted: Sequence[int], k: int,
                        num_steps: Sequence[int] | None = None) -> tuple[float, float]:
    """Beta (a, b) of the per-request acceptance alpha, by maximum likelihood, from each request's
    totals: `accepted` draft tokens out of `drafted`, over `num_steps` verify steps of `k` drafts
    (default drafted // k). A request's alpha is integrated out (the totals are a convolution of
    truncated geometrics given alpha, `steps_pmf`), so few steps per request widen the
    likelihood instead of inflating the fitted spread. The law the simulator draws from
    (`AcceptanceModel`, `sample_accepted`) is the one fitted."""
    # imported here: scipy cost every `import sim` (and each advisor worker process) ~0.35 CPU s, and
    # only this fit needs it
    from scipy import optimize, special

    acc, dr = np.asarray(accepted, dtype=np.int64), np.asarray(drafted, dtype=np.int64)
    steps = dr // k if num_steps is None else np.asarray(num_steps, dtype=np.int64)
    keep = steps > 0
    if not keep.any():
        raise ValueError("fit_acceptance_beta: no request has a verify step; nothing to fit")
    acc, steps = np.minimum(acc[keep], steps[keep] * k), steps[keep]
    lik = _request_likelihoods(acc, steps, k)
    log_g, log_1g = np.log(_GRID), np.log1p(-_GRID)

    def nll(theta: np.ndarray) -> float:
        a, b = np.exp(theta)
        w = np.exp((a - 1) * log_g + (b - 1) * log_1g - special.betaln(a, b)) / _GRID.size
        return -float(np.log(lik @ w + 1e-300).sum())

    mean = float(np.clip((acc / (steps * k)).mean(), 0.02, 0.98))
    start = np.log([mean * 10, (1 - mean) * 10])
    res = optimize.minimize(nll, start, method="Nelder-Mead", options={"xatol": 1e-4, "fatol": 1e-6})
    a, b = np.exp(res.x)
    return float(a), float(b)


__all__ = [
    "ACCEPTANCE_RANGE",
    "DEFAULT_ACCEPTANCE",
    "MEASURED_ACCEPTANCE_FILES",
    "AcceptanceModel",
    "AcceptanceSource",
    "SpecTokens",
    "acceptance_source",
    "fit_acceptance_beta",
    "sample_accepted",
    "scaled_acceptance",
    "steps_pmf",
]
