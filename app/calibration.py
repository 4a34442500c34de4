"""Which cost profile a run used, how well it was validated, and whether it was scaled from
another GPU: from the run summary's `profile` / `profile_status` fields and the profile JSON's
optional `validation` field. A summary without them ran the first-principles profile.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.core.input_files import read_json
from sim.cost_model import PROFILES_DIR
from sim.profile_files import MAX_PROFILE_BYTES

FIRST_PRINCIPLES = "first principles"
SCALED = "scaled, not validated"


@dataclass(slots=True)
class ProfileInfo:
    """What the Calibration page shows about the profile a run used."""

    name: str
    status: str
    validation: list[dict[str, Any]] = field(default_factory=list)
    provenance: dict[str, Any] = field(default_factory=dict)

    @property
    def scaled(self) -> bool:
        return self.status == SCALED


def profile_file(name: str) -> Path | None:
    """The shipped profile `name` names (sim/profiles/NAME.json); never a path elsewhere: a run's
    summary and a URL can carry any text, and the page must not read server files by it."""
    if not name or Path(name).name != name or name.startswith("."):
        return None
    q = PROFILES_DIR / f"{name}.json"
    return q if q.is_file() else None


def read_profile(name: str) -> dict[str, Any]:
    path = profile_file(name)
    if path is None:
        return {}
    try:
        return read_json(path, max_bytes=MAX_PROFILE_BYTES)
    except ValueError:
        return {}


def validation_rows(validation: Any) -> list[dict[str, Any]]:
    """The profile's validation error per metric as table rows, whatever its nesting: a list of
    rows, {metric: error}, or {metric: {figure: value}}."""
    if isinstance(validation, list):
        return [dict(r) if isinstance(r, Mapping) else {"value": r} for r in validation]
    if not isinstance(validation, Mapping):
        return []
    by_metric = validation.get("median_abs_error_by_metric")
    if isinstance(by_metric, Mapping):  # what `costline validate --write-profile-validation` writes
        return _validate_summary_rows(validation, by_metric)
    rows = []
    for metric, value in validation.items():
        if isinstance(value, Mapping):
            rows.append({"metric": metric, **{k: v for k, v in value.items() if not isinstance(v, (dict, list))}})
        elif not isinstance(value, list):
            rows.append({"metric": metric, "error": value})
    return rows


def _pct(x: Any) -> str:
    # one text column: Arrow refuses a column mixing numbers and the "k of n" row
    return f"{x:.1%}" if isinstance(x, (int, float)) else "-"


def _validate_summary_rows(validation: Mapping[str, Any], by_metric: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per metric (median |error| over the validation runs), then the overall figures."""
    runs, passed = validation.get("runs") or [], validation.get("runs_passed") or []
    rows = [{"metric": m, "median |error| over runs": _pct(v)} for m, v in by_metric.items()]
    rows.append({"metric": "all metrics (median)", "median |error| over runs": _pct(validation.get("median_abs_error"))})
    rows.append({"metric": "worst p99 (any run)", "median |error| over runs": _pct(validation.get("worst_p99_abs_error"))})
    rows.append({"metric": f"runs meeting every target ({validation.get('date', '')})",
                 "median |error| over runs": f"{len(passed)} of {len(runs)}"})
    return rows


PROVENANCE_KEYS = ("hardware", "model", "engine", "source", "schema_version", "date", "engine_commit")


def profile_info(requested: str, *, used: str | None = None, status: str | None = None,
                 validation: Mapping[str, Any] | None = None) -> ProfileInfo:
    """The profile a run used (its summary's `profile`, `profile_status`, `profile_validation`;
    `requested` when the summary does not say), its status and validation."""
    name = used or requested
    data = read_profile(name)
    status = status or FIRST_PRINCIPLES
    validation = validation or data.get("validation")
    provenance = {k: data[k] for k in PROVENANCE_KEYS if k in data}
    return ProfileInfo(name=name, status=status, validation=validation_rows(validation), provenance=provenance)


__all__ = ["FIRST_PRINCIPLES", "SCALED", "ProfileInfo", "profile_info", "read_profile", "validation_rows"]
