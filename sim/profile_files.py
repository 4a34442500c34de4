"""Cost profiles as inputs: found by name or path, read through the bounded reader, checked.

`load_profile(name_or_path, model, gpu)` is what every entry point calls (the simulation API, the
advisor, validation): "auto" (or empty) picks the shipped profile of the model and GPU, a name one
of `sim/profiles/`, anything else a JSON file. A file that is not a profile is refused naming the
file, the key path and what was expected (a JSON list where an object belongs, a coefficient that
is a string, NaN) instead of failing deep inside. `shipped_profiles()` lists the names a dashboard
may offer: it never takes a path.

`check_target(profile, model, gpu)` says whether a profile measured on one model or GPU is being
applied to another (a fitted profile's coefficients describe the engine it was fitted on).
"""

from __future__ import annotations

import functools
from pathlib import Path

from pydantic import ValidationError

from engine.core.input_files import InputFileError, read_json, validation_lines
from sim.cost_model import PROFILES_DIR, SUPPORTED_SCHEMA_VERSIONS, CostProfile

MAX_PROFILE_BYTES = 4 << 20  # a fitted profile is ~10 KB
AUTO = ("auto", "")


@functools.cache
def shipped_profiles() -> list[str]:
    """The cost profile names that ship with the package (sim/profiles/*.json holding a profile;
    the speculative-decoding acceptance data there is not one)."""
    names = []
    for p in sorted(PROFILES_DIR.glob("*.json")):
        try:
            if read_json(p, max_bytes=MAX_PROFILE_BYTES).get("schema_version") in SUPPORTED_SCHEMA_VERSIONS:
                names.append(p.stem)
        except InputFileError:
            continue
    return names


def profile_path(name_or_path: str | Path) -> Path:
    """The JSON file a profile name or path means, as `CostProfile.load` finds it."""
    p = Path(name_or_path)
    if p.suffix != ".json" and not p.is_file():  # a name; names hold dots ("h200-llama-3.1-8b")
        p = PROFILES_DIR / f"{name_or_path}.json"
    return p


def load_profile(name_or_path: str | Path | None, model: str = "*", gpu: str = "*") -> CostProfile:
    """The profile `name_or_path` names, checked (see the module's docstring)."""
    if name_or_path is None or str(name_or_path) in AUTO:
        return CostProfile.for_target(model, gpu)
    path = profile_path(name_or_path)
    if not path.exists():
        raise InputFileError(f"cost profile {str(name_or_path)!r} not found: neither a file nor one of the "
                             f"built-in profiles ({', '.join(shipped_profiles())}); give a profile JSON path, "
                             "a built-in name, or auto")
    fix = "give a cost profile JSON (`costline calibrate --out` writes one, sim/profiles/ holds examples)"
    data = read_json(path, what="cost profile", max_bytes=MAX_PROFILE_BYTES, fix=fix)
    version = data.get("schema_version")
    if isinstance(version, bool) or version not in SUPPORTED_SCHEMA_VERSIONS:
        raise InputFileError(f"{path}: key 'schema_version' is {version!r}, expected one of "
                             f"{', '.join(map(str, SUPPORTED_SCHEMA_VERSIONS))}; {fix}")
    try:
        return CostProfile.model_validate(data)
    except ValidationError as exc:
        lines = validation_lines(path, exc)
        raise InputFileError("\n".join([f"{path}: not a valid cost profile ({len(lines)} problem(s))",
                                        *lines[:8], f"Fix: {fix}"])) from None


def target_mismatch(profile: CostProfile, model: str, gpu: str) -> str | None:
    """Why `profile` does not describe `model` on `gpu` (None when it does or is generic): a fitted
    or scaled profile holds one engine's measured coefficients."""
    wrong = []
    if profile.model not in ("*", "") and profile.model.lower() != model.lower():
        wrong.append(f"model {profile.model} (not {model})")
    if profile.hardware not in ("*", "") and profile.hardware.lower() != gpu.lower():
        wrong.append(f"GPU {profile.hardware} (not {gpu})")
    if not wrong:
        return None
    return f"cost profile {profile.name} was measured on {' and '.join(wrong)}"


__all__ = ["MAX_PROFILE_BYTES", "load_profile", "profile_path", "shipped_profiles", "target_mismatch"]
