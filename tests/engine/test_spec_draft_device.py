"""Greedy drafts chained on the device (one read-back per proposal) are the drafts the
per-round host path proposes: same accepted counts step by step, for a draft that disagrees
with the target often (so rejections and rollbacks happen) and through preemptions."""

from __future__ import annotations

import pytest
import torch

from engine.core.scheduler_output import ScheduledRequest
from engine.sampling import SamplingParams
from engine.spec_decode.proposers import DraftModelProposer, WithDrafts
from tests.engine.test_spec_decode import drive, engine, tiny_model, workload


def near_draft(noise: float) -> torch.nn.Module:
    """The target's weights with seeded relative noise: agrees with the target often, not always."""
    m = tiny_model(0)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(noise * p.std() * torch.randn(p.shape, generator=g))
    return m


NEAR_DRAFT = near_draft(0.6)


def accepted_per_step(monkeypatch, host_path: bool, blocks: int | None) -> tuple[list[int], dict]:
    if host_path:  # the per-round path: each draft read back before the next round
        monkeypatch.setattr(DraftModelProposer, "_propose_greedy_on_device", _host_rounds)
    core = engine({"model": "tiny", "num_speculative_tokens": 3}, NEAR_DRAFT, num_gpu_blocks_override=blocks)
    seen: list[int] = []
    step = core.step

    def recording_step():
        res = step()
        seen.append(core.scheduler.num_spec_accepted_tokens)
        return res

    core.step = recording_step
    out = drive(core, workload(1))
    return seen, out


def _host_rounds(self, entries, wanted, token_ids, out):
    """Reference: the per-round host path for greedy requests (drafts read back each round)."""
    greedy = SamplingParams(max_tokens=1)
    params = {s.request_id: greedy for s in entries}

    class _Argmax:  # the sampler's greedy choice, read back per round
        def propose(self, logits, rids, ps):
            return logits.argmax(dim=-1).tolist(), [None] * len(rids)

    self._draft_round(entries, token_ids, [s.request_id for s in wanted], params, _Argmax(), out)
    for i in range(1, max(s.num_spec_tokens for s in wanted)):
        live = [s for s in wanted if s.num_spec_tokens > i]
        step = [ScheduledRequest(s.request_id, 1, s.num_computed_tokens + i, 0, 0, False, True, s.block_ids, ())
                for s in live]
        views = {s.request_id: WithDrafts(token_ids[s.request_id], out[s.request_id].tokens) for s in live}
        self._draft_round(step, views, [s.request_id for s in live], params, _Argmax(), out)



@pytest.mark.parametrize("blocks", [None, 13])
def test_device_chained_drafts_equal_host_rounds(monkeypatch, blocks):
    dev_counts, dev_out = accepted_per_step(monkeypatch, False, blocks)
    monkeypatch.undo()
    host_counts, host_out = accepted_per_step(monkeypatch, True, blocks)
    assert dev_out == host_out
    assert dev_counts == host_counts
    drafted = 3 * len(dev_counts)  # at most k drafts per step
    assert 0 < dev_counts[-1] < drafted  # some drafts accepted, some rejected: both paths exercised
