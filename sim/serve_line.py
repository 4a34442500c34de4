"""The one builder of the `vllm serve` line: the advisor's recommendation, `costline simulate`'s
summary and the dashboard all print what `serve_line` returns.

The line is one vLLM 0.33 accepts: the model's Hugging Face id, only the flags that differ from
vLLM's defaults (`EngineConfig.to_vllm_args`), a speculative method that needs a checkpoint given
one in "model" (a public head where one is known, else a placeholder `<...>` to replace), and for
disaggregated prefill the `--kv-transfer-config` of every instance. How many instances run, and
behind what, is a shell comment after the line.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from engine.core.flags import FlagError, parse_size
from sim.config import ENGINE_CONFIG_FLAGS, EngineConfig
from sim.models import NEEDS_DRAFT_MODEL, draft_model, hf_model_id


@dataclass(frozen=True, slots=True)
class ServeLine:
    command: str  # the pasteable line (a trailing `# ...` comment says how many instances)
    args: str  # the flags alone, '' at vLLM's defaults
    draft_placeholder: str | None = None  # set when "model" of the speculative config is a placeholder


def with_draft_model(engine: EngineConfig, model: str) -> tuple[EngineConfig, str | None]:
    """`engine` with a draft checkpoint in its speculative config where the method needs one;
    (config, the placeholder printed, if no public head is known)."""
    spec = engine.speculative_config
    if spec is not None and spec.model:  # a draft preset (draft_model) by its Hugging Face id
        try:
            hf = hf_model_id(spec.model)
        except ValueError:  # a checkpoint path or repo: as given
            return engine, None
        return engine.model_copy(update={"speculative_config": spec.model_copy(update={"model": hf})}), None
    if spec is None or spec.method not in NEEDS_DRAFT_MODEL:
        return engine, None
    head, placeholder = draft_model(spec.method, model)
    spec = spec.model_copy(update={"model": head})
    return engine.model_copy(update={"speculative_config": spec}), head if placeholder else None


def kv_transfer_arg(connector: str) -> str:
    cfg = json.dumps({"kv_connector": connector, "kv_role": "kv_both"}, separators=(",", ":"))
    return f"--kv-transfer-config '{cfg}'"


def serve_line(model: str, engine: EngineConfig, *, baseline: EngineConfig | None = None, replicas: int = 1,
               kv_connector: str | None = None, prefill_replicas: int = 0, decode_replicas: int = 0) -> ServeLine:
    """`vllm serve HF_ID` plus only the non-default flags of `engine` (compared with `baseline`,
    vLLM's defaults when None); `replicas` > 1 or a P/D split adds a comment saying how many
    instances to start."""
    engine, placeholder = with_draft_model(engine, model)
    parts = engine.to_vllm_args(baseline)
    if kv_connector:
        parts.append(kv_transfer_arg(kv_connector))
    args = " ".join(parts)
    command = f"vllm serve {hf_model_id(model)}" + (f" {args}" if args else "")
    if prefill_replicas:
        command += f"  # {prefill_replicas} prefill + {decode_replicas} decode instances behind a P/D proxy"
    elif replicas > 1:
        command += f"  # x{replicas} replicas behind a router"
    return ServeLine(command=command, args=args, draft_placeholder=placeholder)


def parse_serve_args(text: str) -> EngineConfig:
    """The engine flags of a `vllm serve` line (`--max-num-seqs 128 --no-enable-prefix-caching`,
    `--max-num-batched-tokens=8k`; a leading `vllm serve MODEL` is skipped) as an `EngineConfig`.
    A flag the simulator does not model is refused by name (leave it out of the line)."""
    spelled: dict[str, tuple[Any, bool | None]] = {}
    for f in ENGINE_CONFIG_FLAGS:
        for s in f.spellings:
            spelled[s] = (f, True if f.type is bool else None)
        for s in f.negatives:
            spelled[s] = (f, False)
    words = shlex.split(text)
    if words[:2] == ["vllm", "serve"]:
        words = words[3:] if len(words) > 2 and not words[2].startswith("-") else words[2:]
    values: dict[str, Any] = {}
    i = 0
    while i < len(words):
        word, _, inline = words[i].partition("=")
        if word not in spelled:
            raise FlagError("serve_args", repr(words[i]), "is not an engine flag costline models; give the "
                            "scheduling and KV flags your server ran with (e.g. --max-num-seqs 256)")
        flag, boolean = spelled[word]
        if boolean is not None:
            values[flag.name], i = boolean, i + 1
            continue
        if not inline and i + 1 >= len(words):
            raise FlagError("serve_args", word, "needs a value")
        raw = inline or words[i + 1]
        values[flag.name] = parse_size(raw, flag.name) if flag.human_size else raw
        i += 1 if inline else 2
    return EngineConfig(**values)


__all__ = ["ServeLine", "kv_transfer_arg", "parse_serve_args", "serve_line", "with_draft_model"]
