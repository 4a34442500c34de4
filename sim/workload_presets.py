"""Named workload presets (JSON files in `sim/presets/`), from lab-smooth to production-rough.

| preset | one line |
|---|---|
| lab-random | vLLM's random dataset: fixed 1024/128 tokens, no shared prefix, Poisson |
| lab-poisson | the lab benchmark: Poisson, fixed lengths, one fixed system prompt |
| chat-production | Gamma-bursty, lognormal lengths, Zipf system prompts, 30% dynamic prefix, task mix |
| rag-long-prompt | ~6k-token retrieved context behind a shared instruction, short answers |
| code-bursty | on/off (MMPP) bursts, Pareto prompts on a shared repository context |
| agent-multiturn | multi-turn sessions that re-send a growing context on a long tool prompt |

Each file's `description` holds its one-line summary; `costline workload presets` prints them.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from sim.workload_spec import WorkloadSpec

PRESET_DIR = Path(__file__).with_name("presets")


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


@cache
def _load(name: str) -> WorkloadSpec:
    # shipped JSON, checked by the tests; a user's spec file goes through sim.workload_source.load_spec
    return WorkloadSpec.model_validate_json((PRESET_DIR / f"{name}.json").read_text())


def get_preset(name: str) -> WorkloadSpec:
    """The preset called `name`; KeyError naming the known presets otherwise."""
    if name not in preset_names():
        raise KeyError(f"unknown workload preset {name!r}; known: {', '.join(preset_names())}")
    return _load(name)
