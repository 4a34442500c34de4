"""The mixture-of-experts presets on the dashboard: picked on the What-if page they run and show
what `sim.run.run` gives for the same model; on the Advisor page the report carries the MoE note
whose all-experts batch equals sim/moe.py's closed form for the model's routing."""

from __future__ import annotations

import pytest

from app.recommendation import advise_api
from app.scenario import Scenario
from app.widgets import fmt
from engine.core.model_spec import get_model
from sim.cost_model import MoeTerms
from sim.moe import ExpertRouting
from sim.profile_files import load_profile
from sim.workload_presets import get_preset
from tests.app.test_pages import api_summary, app, assert_headline

SERVE_ID = {"qwen3-30b-a3b": "Qwen/Qwen3-30B-A3B", "mixtral-8x7b": "mistralai/Mixtral-8x7B-Instruct-v0.1"}


@pytest.mark.parametrize("model", list(SERVE_ID))
def test_whatif_runs_a_moe_preset(model: str) -> None:
    at = app()
    at.run()
    at.selectbox(key="dep.model").set_value(model).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert_headline(at, api_summary(model=model))
    assert at.session_state["scenario"].model == model
    assert at.code[0].value.startswith(f"vllm serve {SERVE_ID[model]}")
    assert at.query_params["model"] == model


@pytest.mark.parametrize("model", list(SERVE_ID))
def test_advisor_page_advises_a_moe_preset_with_its_note(model: str) -> None:
    if advise_api() is None:
        pytest.skip("the advisor is not installed")
    at = app()
    at.run()
    at.switch_page("views/advisor.py").run()
    at.session_state["scenario"] = Scenario(model=model, workload="custom", spec=get_preset("lab-random")
                                            .with_overrides(num_requests=60).model_dump_json())  # the note, not the search
    at.button(key="adv.run").click().run(timeout=900)
    assert not at.exception and not at.error, [e.value for e in at.error]
    rec = at.session_state["recommendation"]
    assert {x.label: x.value for x in at.metric}["Goodput (req/s)"] == fmt(rec["best"]["metrics"]["goodput_rps"])
    assert rec["serve_command"].startswith(f"vllm serve {SERVE_ID[model]}")
    spec = get_model(model)
    skew = (load_profile(None, model, "h200").moe or MoeTerms()).routing_skew  # the profile the advice used
    full = ExpertRouting(spec.num_experts, spec.experts_per_token, skew).tokens_to_touch(0.99)
    notes = [i.value for i in at.info if "mixture of experts" in i.value]
    assert len(notes) == 1, [i.value for i in at.info]
    assert f"99% of all {spec.num_experts} from {full} tokens per step" in notes[0]


def test_whatif_runs_mixtral_with_expert_parallelism() -> None:
    from sim.config import EngineConfig

    at = app()
    at.query_params.update({"model": "mixtral-8x7b", "num_gpus": "2", "tensor-parallel-size": "2"})
    at.run()
    at.toggle(key="flag.enable_expert_parallel").set_value(True).run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    assert_headline(at, api_summary(model="mixtral-8x7b", num_gpus=2,
                                    engine=EngineConfig(tensor_parallel_size=2, enable_expert_parallel=True)))
    assert "--tensor-parallel-size 2 --enable-expert-parallel" in at.code[0].value
