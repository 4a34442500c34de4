"""sim.flag_diff: the flags two `vllm serve` lines differ in, each side spelled as vLLM spells it."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sim.config import EngineConfig
from sim.flag_diff import flag_differences, headings, parse_vllm_args


def test_parse_takes_values_booleans_and_json() -> None:
    args = EngineConfig(max_num_seqs=32, enable_prefix_caching=False,
                        speculative_config={"method": "ngram", "num_speculative_tokens": 3}).to_vllm_args()
    parsed = parse_vllm_args(" ".join(args))
    assert parsed == {"max_num_seqs": "--max-num-seqs 32", "enable_prefix_caching": "--disable-prefix-caching",
                      "speculative_config": "--speculative-config '{\"method\":\"ngram\",\"num_speculative_tokens\":3}'"}


def test_differences_name_the_default_on_the_side_that_keeps_it() -> None:
    a, b = flag_differences("--max-num-seqs 32 --disable-prefix-caching", "--max-num-seqs 64 --kv-cache-dtype fp8")
    assert a == ["--max-num-seqs 32", "--disable-prefix-caching", "--kv-cache-dtype auto (default)"]
    assert b == ["--max-num-seqs 64", "--enable-prefix-caching (default)", "--kv-cache-dtype fp8"]
    assert headings("--block-size 32", "--block-size 32") == ("same vLLM flags", "same vLLM flags")


@settings(max_examples=40, deadline=None)
@given(seqs=st.sampled_from([None, 8, 64]), caching=st.booleans(), block=st.sampled_from([16, 32]),
       seqs2=st.sampled_from([None, 8, 64]), caching2=st.booleans(), block2=st.sampled_from([16, 32]))
def test_a_flag_is_named_exactly_when_the_configs_differ_in_it(seqs, caching, block, seqs2, caching2, block2) -> None:
    a = EngineConfig(max_num_seqs=seqs, enable_prefix_caching=caching, block_size=block)
    b = EngineConfig(max_num_seqs=seqs2, enable_prefix_caching=caching2, block_size=block2)
    da, db = flag_differences(" ".join(a.to_vllm_args()), " ".join(b.to_vllm_args()))
    differ = [n for n in ("max_num_seqs", "block_size", "enable_prefix_caching") if getattr(a, n) != getattr(b, n)]
    assert len(da) == len(db) == len(differ)
    for side, cfg in ((da, a), (db, b)):
        text = " ".join(side)
        if "max_num_seqs" in differ:
            assert (f"--max-num-seqs {cfg.max_num_seqs}" if cfg.max_num_seqs else "--max-num-seqs auto (default)") in text
        if "enable_prefix_caching" in differ:
            assert ("--enable-prefix-caching (default)" if cfg.enable_prefix_caching else "--disable-prefix-caching") in text
