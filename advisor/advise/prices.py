"""Dollars: the default price of a GPU-hour per GPU preset (with its source and date), and what a
recommendation costs at its SLO.

The defaults are on-demand list prices of specialty GPU clouds, the middle of the range each
source quotes; a hyperscaler charges more, a reservation less. Pass your own price with
`--gpu-hour-usd` (one number for `--gpu`, or `GPU=USD,...` for several).

| GPU | $/GPU-hour | source (date) |
|---|---|---|
| a100-80gb | 1.30 | mercatus-ai.com/blog/cloud-gpu-pricing, specialty clouds $1.10-1.50 (May 2026) |
| h100-sxm | 3.00 | mercatus-ai.com/blog/cloud-gpu-pricing, specialty clouds $2.50-3.50 (May 2026) |
| h200 | 4.00 | mercatus-ai.com/blog/cloud-gpu-pricing, specialty clouds $3.50-4.50 (May 2026) |
| b200 | 5.25 | lyceum.technology B200 cloud pricing 2026, specialized clouds $4.50-6.00 (March 2026) |

L4 and T4 have no default: give `--gpu-hour-usd` for them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.hardware import get_gpu


@dataclass(frozen=True, slots=True)
class GpuPrice:
    usd_per_gpu_hour: float
    source: str


_MERCATUS = "mercatus-ai.com/blog/cloud-gpu-pricing: specialty-cloud on-demand range {}, middle (May 2026)"
GPU_HOUR_USD: dict[str, GpuPrice] = {
    "a100-80gb": GpuPrice(1.30, _MERCATUS.format("$1.10-1.50")),
    "h100-sxm": GpuPrice(3.00, _MERCATUS.format("$2.50-3.50")),
    "h200": GpuPrice(4.00, _MERCATUS.format("$3.50-4.50")),
    "b200": GpuPrice(5.25, "lyceum.technology, B200 cloud pricing 2026: specialized-cloud on-demand $4.50-6.00, "
                     "middle (March 2026)"),
}


def parse_gpu_hour_usd(value: str | float | dict[str, float] | None, gpu: str) -> dict[str, float]:
    """`3.5` (the price of `gpu`) or `h100-sxm=2.5,h200=3.6` as {gpu preset: $/GPU-hour}; a bad
    part is refused naming it."""
    if value is None:
        return {}
    if isinstance(value, dict):
        pairs = list(value.items())
    elif isinstance(value, (int, float)):
        pairs = [(gpu, value)]
    else:
        pairs = []
        for part in value.replace(" ", ",").split(","):
            if not part:
                continue
            name, sep, raw = part.rpartition("=")
            pairs.append((name if sep else gpu, raw))
    out: dict[str, float] = {}
    for name, raw in pairs:
        try:
            usd = float(raw)
        except (TypeError, ValueError):
            raise ValueError(f"{raw!r} is not a price in dollars per GPU-hour (e.g. 3.5 or h100-sxm=2.5,h200=3.6)") from None
        if not 0 < usd < 1000:
            raise ValueError(f"{usd:g} $/GPU-hour: must be above 0 and below 1000")
        out[get_gpu(name).name] = usd  # an unknown GPU is refused naming the presets
    return out


def price_of(gpu: str, given: dict[str, float]) -> tuple[float, str] | None:
    """($/GPU-hour, where it comes from) for `gpu`: as given, else the default table, else None."""
    name = get_gpu(gpu).name
    if name in given:
        return given[name], "--gpu-hour-usd"
    default = GPU_HOUR_USD.get(name)
    return (default.usd_per_gpu_hour, default.source) if default else None


__all__ = ["GPU_HOUR_USD", "GpuPrice", "parse_gpu_hour_usd", "price_of"]
