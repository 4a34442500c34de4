"""`costline advise` from Python: a workload and an `AdviseRequest` in, a `Recommendation` out.

    from advisor.advise import AdviseRequest, advise
    rec = advise("chat-production", AdviseRequest(num_gpus=1, slo="ttft_p99:500 tpot_p99:50"))
    rec.best.flags, rec.serve_command, rec.model_dump_json()

Stages: search (advisor/advise/search.py), ladder and rejected options (ladder.py), cost lines
(cost_lines.py), lab -> production gap (gap.py), robustness (robustness.py), user questions
(questions.py). All simulations go through one `Evaluator` (local processes or Ray).
"""

from __future__ import annotations

from advisor.advise.records import AdviseRequest, Recommendation
from advisor.advise.run import advise, compare_gpus

__all__ = ["AdviseRequest", "Recommendation", "advise", "compare_gpus"]
