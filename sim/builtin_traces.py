"""Real production traces shipped inside the package (`sim/traces_data/`), loadable by name.

A name here works wherever a workload is taken (a preset name, a spec file or a trace file), so
the README, the docs and the tests never depend on files outside the repository. Sources,
licences and checksums: `sim/traces_data/README.md`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TRACES_DIR = Path(__file__).with_name("traces_data")


@dataclass(frozen=True, slots=True)
class BuiltinTrace:
    name: str
    file: str  # in TRACES_DIR
    description: str
    licence: str
    hash_block_size: int = 16  # tokens per hash id as loaded (Mooncake: 512; the CSV traces: fresh 16s)

    @property
    def path(self) -> Path:
        return TRACES_DIR / self.file


BUILTIN_TRACES: dict[str, BuiltinTrace] = {t.name: t for t in (
    BuiltinTrace("mooncake-conversation", "mooncake_conversation_trace.jsonl.gz",
                 "real trace: Kimi conversations (Mooncake FAST'25), 12,031 requests in 59 min, prompts "
                 "mean 12k tokens, 37% prefix reuse known per 512-token block", "Apache-2.0", 512),
    BuiltinTrace("azure-code-2023", "AzureLLMInferenceTrace_code.csv.gz",
                 "real trace: Azure coding service (Splitwise, ISCA'24), 8,819 requests in 57 min, very "
                 "bursty, prompts mean 2k tokens, outputs median 13", "CC-BY-4.0"),
)}


def builtin_trace_path(name: str) -> Path | None:
    """The shipped file of trace `name`, or None when no built-in trace has that name."""
    t = BUILTIN_TRACES.get(name)
    return t.path if t else None


__all__ = ["BUILTIN_TRACES", "TRACES_DIR", "BuiltinTrace", "builtin_trace_path"]
