"""Goodput targets (`vllm bench serve --goodput ttft:X tpot:Y e2el:Z`) as one object that every
layer passes along: parsed once from text, written back as {"ttft": ms, ...} only in JSON.

Torch-free: the simulator imports it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from engine.core.flags import FlagError

SLO_KEYS = ("ttft", "tpot", "e2el")


@dataclass
class SLO:
    """Goodput targets in milliseconds, as `vllm bench serve --goodput ttft:X tpot:Y e2el:Z`."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    @classmethod
    def parse(cls, text: str | None) -> SLO | None:
        """`"ttft:500 tpot:50"` as an `SLO`; a malformed pair, an unknown key, a negative or
        non-finite value is refused naming the pair, as `vllm bench serve --goodput` refuses it."""
        if text is None or not text.strip():
            return None
        values: dict[str, float] = {}
        for part in text.replace(",", " ").split():
            key, _, raw = part.partition(":")
            if key not in SLO_KEYS or not raw:
                raise FlagError("slo", repr(part), f"use KEY:MS pairs with KEY in {', '.join(SLO_KEYS)} "
                                '(e.g. {slo} "ttft:500 tpot:50")')
            try:
                ms = float(raw)
            except ValueError:
                raise FlagError("slo", repr(part),
                                f"{raw!r} is not a number of milliseconds (e.g. {key}:500)") from None
            if not math.isfinite(ms) or ms < 0:
                raise FlagError("slo", repr(part), "an SLO must be a finite number of milliseconds >= 0 "
                                f"(vLLM refuses negative ones); e.g. {key}:500")
            values[f"{key}_ms"] = ms
        return cls(**values)

    def as_dict(self) -> dict[str, float]:
        return {k.removesuffix("_ms"): v for k, v in self.__dict__.items() if v is not None}


__all__ = ["SLO", "SLO_KEYS"]
