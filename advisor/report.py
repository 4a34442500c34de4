"""Terminal lines about a finished run that the summary table alone would let a user miss."""

from __future__ import annotations

from advisor.console import console as plain_console
from advisor.console import styled
from engine.core.summary_record import RunSummary

# What lifts each limit the scheduler rejects a request for (engine/core/run_summary.rejection_kind).
_FIXES = {
    "max_model_len": "raise --max-model-len (up to the model's context length) or send shorter requests",
    "num_gpu_blocks": "give the KV cache more room: a higher --gpu-memory-utilization, a larger --gpu or "
                      "--tensor-parallel-size, or --num-gpu-blocks-override",
}


def _fix_for(kind: str) -> str:
    return next((fix for limit, fix in _FIXES.items() if limit in kind), "see the requests table for each reason")


def unserved_lines(summary: RunSummary) -> list[str]:
    """One line per reason some requests could never be served (or did not finish), with the fix;
    empty when every request finished."""
    total = summary.num_prompts or 0
    lines = []
    for kind, count in (summary.rejected_reasons or {}).items():
        lines.append(f"{count:,} of {total:,} requests could never be served: {kind}; {_fix_for(kind)}")
    for reason, count in (summary.unfinished_reasons or {}).items():
        lines.append(f"{count:,} of {total:,} requests did not finish: {reason}")
    return lines


def warn_unserved(summary: RunSummary) -> None:
    """`unserved_lines` on stderr (stdout may carry the summary JSON)."""
    console = plain_console(stderr=True)
    for line in unserved_lines(summary):
        console.print(styled(("warning:", "bold yellow"), " ", line), soft_wrap=True)


__all__ = ["unserved_lines", "warn_unserved"]
