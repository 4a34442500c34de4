"""vLLM's `--speculative-config` JSON, as the real engine reads it. No torch: the simulator's
`sim.config.SpeculativeConfig` extends it with its acceptance model.

Keys and defaults are vLLM's (`vllm/config/speculative.py`): `method` is inferred as
"draft_model" when only `model` is given; n-gram lookup without `prompt_lookup_max` /
`prompt_lookup_min` uses 5 for both, and one given alone is copied to the other. The stored
fields stay as typed (so the config prints back as the user wrote it); `lookup_min` /
`lookup_max` give the resolved window.
"""

from __future__ import annotations

import json
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

DEFAULT_PROMPT_LOOKUP = 5
EXAMPLE = '{"method":"ngram","num_speculative_tokens":4}'


class SpeculativeConfig(BaseModel):
    """The keys the engine runs: a draft model, an EAGLE-3 head or n-gram prompt lookup, k drafts
    per decode."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    method: Literal["ngram", "draft_model", "eagle3"] | None = None
    # draft checkpoint directory or model preset name (draft_model); EAGLE-3 head directory
    # (engine/spec_decode/eagle.py's format; any other name: a seeded random head, for tests)
    model: str | None = None
    num_speculative_tokens: int = Field(ge=1, le=16)
    prompt_lookup_max: int | None = Field(None, ge=1)  # ngram only
    prompt_lookup_min: int | None = Field(None, ge=1)
    draft_tensor_parallel_size: int | None = None

    @model_validator(mode="before")
    @classmethod
    def _infer_method(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("method") is None and data.get("model"):
            data = {**data, "method": "draft_model"}
        return data

    @model_validator(mode="after")
    def _check(self) -> Any:
        if self.method is None:
            raise ValueError('needs "method" (e.g. "ngram") or a draft "model"')
        if self.method == "draft_model" and not self.model:
            raise ValueError('method "draft_model" needs "model" (a checkpoint directory or a model preset name)')
        if self.method == "eagle3" and not self.model:
            raise ValueError('method "eagle3" needs "model" (the EAGLE-3 head\'s directory, as '
                             'benchmarks/spec_decode/train_eagle.py writes it)')
        if self.draft_tensor_parallel_size not in (None, 1):
            raise ValueError(f'"draft_tensor_parallel_size" {self.draft_tensor_parallel_size}: only 1 is '
                             "supported (the engine runs on one GPU); leave it out")
        if self.lookup_min > self.lookup_max:
            raise ValueError(f'"prompt_lookup_min" {self.lookup_min} exceeds "prompt_lookup_max" '
                             f"{self.lookup_max}")
        return self

    @property
    def lookup_max(self) -> int:
        return self.prompt_lookup_max or self.prompt_lookup_min or DEFAULT_PROMPT_LOOKUP

    @property
    def lookup_min(self) -> int:
        return self.prompt_lookup_min or self.prompt_lookup_max or DEFAULT_PROMPT_LOOKUP

    def vllm_json(self) -> str:
        """The JSON to paste after `--speculative-config`."""
        return json.dumps(self.model_dump(exclude_none=True), separators=(",", ":"))


def _key_problem(err: dict[str, Any]) -> str:
    key = ".".join(map(str, err["loc"]))
    if err["type"] == "value_error":
        cause = (err.get("ctx") or {}).get("error")
        return str(cause or err["msg"])
    if err["type"] == "extra_forbidden":
        return f'key "{key}" is not a speculative-config key (check its spelling)'
    if err["type"] == "missing":
        return f'key "{key}" is required'
    return f'key "{key}" = {err["input"]!r}: {err["msg"]}'


def _flag_error(shown: str, text: str) -> Exception:
    from engine.core.flags import FlagError  # engine.core.flags imports this module

    # FlagError fills {field} placeholders in its rule: the JSON's own braces are literal
    return FlagError("speculative_config", shown, text.replace("{", "{{").replace("}", "}}"))


def parse_speculative_config(value: Any, cls: type[SpeculativeConfig] = SpeculativeConfig
                             ) -> SpeculativeConfig | None:
    """A JSON string, a dict or a config -> a `cls`; None stays None. A bad value raises one
    `FlagError` naming `--speculative-config` and the key at fault."""
    if value is None or isinstance(value, cls):
        return value
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as e:
            raise _flag_error(repr(value), f"is not valid JSON ({e.msg}); e.g. '{EXAMPLE}'") from None
        except (RecursionError, ValueError) as e:  # absurd nesting, a 4,300-digit number
            raise _flag_error(repr(value)[:60], f"is not usable JSON ({e or 'nested too deeply'}); e.g. "
                              f"'{EXAMPLE}'") from None
    if isinstance(value, BaseModel):
        value = value.model_dump(exclude_unset=True)
    if not isinstance(value, dict):
        raise _flag_error(repr(value), f"must be a JSON object, e.g. '{EXAMPLE}'")
    try:
        return cls.model_validate(value)
    except ValidationError as exc:
        problems = "; ".join(_key_problem(e) for e in exc.errors())
        raise _flag_error(json.dumps(value, separators=(",", ":")), problems) from None


__all__ = ["DEFAULT_PROMPT_LOOKUP", "SpeculativeConfig", "parse_speculative_config"]
