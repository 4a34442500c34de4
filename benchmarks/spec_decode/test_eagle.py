"""The EAGLE-3 head's training (train_eagle.py) against the engine's head, and eagle_h200.py's
measures and CPU dry run."""

from __future__ import annotations

import json

import pytest
import torch

from benchmarks.spec_decode import eagle_h200, train_eagle
from benchmarks.spec_decode.train_pair import TrainLlama
from engine.core.config import EngineArgs
from engine.core.model_spec import get_model
from engine.core.request import Request
from engine.engine_loop import EngineCore
from engine.model import LlamaModel
from engine.sampling import SamplingParams


@pytest.mark.parametrize(("p", "j", "step1", "others"), [
    (4, 1, [0, 1, 2, 3, 4], []),  # the catch-up: causal
    (4, 2, [0, 1, 2, 3], [4]),  # draft 2: the catch-up's keys before p, its own key
    (4, 3, [0, 1, 2], [3, 4]),  # draft 3: step 2's key at p - 1, its own at p
    (1, 3, [], [0, 1]),  # no catch-up prefix: left out of the loss
])
def test_step_mask_is_what_the_engine_head_attends_to(p, j, step1, others):
    """Draft j at head position P attends to the catch-up's keys up to P - j + 1 and to the keys
    draft steps 2..j wrote at P - j + 2..P (one each)."""
    t = 6
    row = train_eagle.step_mask(t, j, torch.device("cpu"))[p]
    assert row.shape == (j * t,)
    assert torch.nonzero(row[:t]).flatten().tolist() == step1
    later = [int(i) % t for i in torch.nonzero(row[t:]).flatten()]
    assert later == others[-(j - 1):] if j > 1 else later == []


def test_unrolled_training_steps_reproduce_the_engine_drafts():
    """The training model, unrolled over a request's tokens followed by the engine's drafts,
    predicts each draft at the position the engine's head proposed it from: training sees what
    inference does. fp32, the tiny target, a head with its initial (untrained) weights."""
    torch.manual_seed(0)
    target = LlamaModel(get_model("tiny"), max_positions=256, dtype=torch.float32, seed=0)
    tl = TrainLlama(target.spec, max_positions=256)
    tl.load_state_dict(target.state_dict())
    aux = (1, 0, 1)
    th = train_eagle.TrainHead(tl, aux)
    with torch.no_grad():
        for p in th.parameters():
            p.add_(0.05 * torch.randn_like(p))  # off the copied layer: drafts that vary
    head = train_eagle.to_engine_head(th, target)
    k = 4
    args = EngineArgs(model="tiny", device="cpu", dtype="float32", max_model_len=256, max_num_seqs=4,
                      max_num_batched_tokens=64, block_size=4, seed=0,
                      speculative_config={"method": "eagle3", "model": "trained", "num_speculative_tokens": k})
    core = EngineCore(args, model=target, draft_model=head)
    seen = []
    propose = core.eagle.propose

    def spy(scheduled, token_ids):
        out = propose(scheduled, token_ids)
        seen.extend((list(token_ids[s.request_id]), out[s.request_id].tokens)
                    for s in scheduled if s.num_spec_tokens == k)
        return out

    core.eagle.propose = spy
    g = torch.Generator().manual_seed(1)
    for rid, n in enumerate((9, 14)):
        prompt = torch.randint(16, 512, (n,), generator=g).tolist()
        core.add_request(Request(request_id=rid, arrival_s=0.0, prompt_len=n, output_len=12, hash_ids=(rid,)),
                         SamplingParams(max_tokens=12, ignore_eos=True), prompt)
    while core.has_unfinished():
        core.step()
    assert len(seen) >= 4
    for tokens, drafts in seen:
        c = len(tokens) - 1  # the sampled token's position: the target's next input
        ids = torch.tensor([tokens + drafts[:-1] + [0]])
        with torch.no_grad():
            outs, _ = train_eagle.unrolled_steps(th, tl, ids, k)
        got = [int(outs[0][1][0, c - 1].argmax())]
        got += [int(outs[j - 1][1][0, c + j - 2].argmax()) for j in range(2, k + 1)]
        assert got == drafts


def test_break_even_interpolates_between_the_concurrencies_around_one():
    assert eagle_h200.break_even([(1, 1.5), (4, 1.1), (16, 0.8)]) == pytest.approx(4 * 4 ** (1 / 3), abs=0.01)
    assert eagle_h200.break_even([(1, 1.2), (4, 1.1)]) is None  # pays everywhere measured
    assert eagle_h200.break_even([(1, 0.9), (4, 0.8)]) == 0.0


def test_dry_run_measures_every_config_and_keeps_greedy_outputs(tmp_path):
    eb = eagle_h200.main(["--dry-run", "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")])
    r = json.loads((tmp_path / "out" / "results.json").read_text())
    assert all(p["ok"] for p in r["phases"].values()), r["phases"]
    names = {"off", "eagle3-k2", "eagle3-k4", "draft_model-k2", "draft_model-k4", "ngram-k2", "ngram-k4"}
    assert set(r["configs"]) == names
    for name, eq in r["equality_bf16"].items():  # fp32 on the CPU: identical
        assert eq["identical"] == eq["requests"], name
    assert r["equality_fp32"]["identical"] == r["equality_fp32"]["requests"]
    for k in (2, 4):
        acc = r["configs"][f"eagle3-k{k}"]["acceptance"]
        for task in ("code", "prose", "json"):
            assert len(acc[task]["spec_decode_per_position_acceptance_rates"]) == k
            assert len(acc[task]["per_request"]["drafts"]) == eb.plan.acc_prompts
        sweep = r["configs"][f"eagle3-k{k}"]["sweep"]
        assert [row["concurrency"] for row in sweep] == list(eb.plan.concurrencies)
        assert all(row["median_propose_ms_per_forward"] > 0 for row in sweep)
    assert set(r["speedup"]) == names - {"off"}
    assert set(r["off_repeat_spread"]) == {str(c) for c in eb.plan.concurrencies}
    assert (tmp_path / "out" / "results.md").read_text().startswith("# EAGLE-3")


def test_graph_timing_inputs_are_safe_for_every_graph_kind():
    """What a decode / verify / head graph runs, over the timing's inputs after a real run left
    its own in the buffers: finite logits, no KV written (every slot -1)."""
    from engine.spec_decode.eagle import EagleHead

    target = LlamaModel(get_model("tiny"), max_positions=256, dtype=torch.float32, seed=0)
    args = EngineArgs(model="tiny", device="cpu", dtype="float32", max_model_len=256, max_num_seqs=8,
                      max_num_batched_tokens=64, block_size=4, seed=0, num_gpu_blocks_override=64,
                      speculative_config={"method": "eagle3", "model": "random", "num_speculative_tokens": 3})
    core = EngineCore(args, model=target, draft_model=EagleHead(target, seed=1))
    core.add_request(Request(request_id=0, arrival_s=0.0, prompt_len=9, output_len=8, hash_ids=(0,)),
                     SamplingParams(max_tokens=8, ignore_eos=True), list(range(20, 29)))
    while core.has_unfinished():
        core.step()
    for runner, q in ((core.runner, 1), (core.runner, 4), (core.eagle.runner, 1), (core.eagle.runner, 4)):
        eagle_h200._safe_inputs(runner, q, context=20)
        before = runner.kv_caches.clone()
        buf = torch.empty(8 * q, target.spec.vocab_size)
        with torch.inference_mode():  # as the capture runs it
            logits = runner.graph_forward(8, q, buf)
        assert torch.isfinite(logits).all()
        assert torch.equal(runner.kv_caches, before)
