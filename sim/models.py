"""Model presets by their Hugging Face ids, and the public draft heads a speculative method needs.

A preset keeps its short alias (`llama-3.1-8b`); wherever a preset name is accepted, its Hugging
Face id (`meta-llama/Llama-3.1-8B-Instruct`, or the base checkpoint `meta-llama/Llama-3.1-8B`,
the same architecture) is accepted too. The printed `vllm serve` line names the Hugging Face id.
"""

from __future__ import annotations

from engine.core.model_spec import MODEL_PRESETS

# alias -> the Hugging Face id `vllm serve` is given (the instruct checkpoint), then other ids of
# the same architecture. Presets without a public checkpoint (costline's own test models) have none.
HF_MODEL_IDS: dict[str, tuple[str, ...]] = {
    "llama-3.2-1b": ("meta-llama/Llama-3.2-1B-Instruct", "meta-llama/Llama-3.2-1B"),
    "llama-3.1-8b": ("meta-llama/Llama-3.1-8B-Instruct", "meta-llama/Llama-3.1-8B"),
    "llama-3.1-70b": ("meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Llama-3.1-70B"),
    "qwen2.5-7b": ("Qwen/Qwen2.5-7B-Instruct", "Qwen/Qwen2.5-7B"),
    "mistral-7b": ("mistralai/Mistral-7B-Instruct-v0.3", "mistralai/Mistral-7B-v0.3"),
    # Qwen3-30B-A3B is one hybrid-thinking checkpoint (the instruct one); -Base is its pretrained twin
    "qwen3-30b-a3b": ("Qwen/Qwen3-30B-A3B", "Qwen/Qwen3-30B-A3B-Base"),
    "mixtral-8x7b": ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mistralai/Mixtral-8x7B-v0.1"),
}
_PRESET_OF_ID = {hf.lower(): alias for alias, ids in HF_MODEL_IDS.items() for hf in ids}

# (alias, speculative method) -> a public draft/EAGLE checkpoint for that target, with where it is
# documented. Looked up 2026-12-02; a pair not listed prints a placeholder (`draft_placeholder`).
DRAFT_HEADS: dict[tuple[str, str], tuple[str, str]] = {
    ("llama-3.1-8b", "eagle3"): ("RedHatAI/Llama-3.1-8B-Instruct-speculator.eagle3",
                                 "vLLM docs, features/speculative_decoding/eagle (the EAGLE-3 example)"),
    ("llama-3.1-8b", "eagle"): ("yuhuili/EAGLE-LLaMA3.1-Instruct-8B", "the EAGLE authors' head for Llama-3.1-8B-Instruct"),
}
# methods whose `--speculative-config` needs a checkpoint in "model" (ngram, suffix and MTP do not)
NEEDS_DRAFT_MODEL = ("eagle", "eagle3", "draft_model")


def preset_of(name: str) -> str:
    """The preset alias for a preset name or a Hugging Face id (both case-insensitive); an
    unknown name is refused naming the presets and their ids."""
    key = name.strip().lower()
    if key in MODEL_PRESETS:
        return key
    if key in _PRESET_OF_ID:
        return _PRESET_OF_ID[key]
    ids = ", ".join(ids[0] for ids in HF_MODEL_IDS.values())
    raise ValueError(f"unknown model {name!r}; use a preset ({', '.join(MODEL_PRESETS)}) or its Hugging Face id "
                     f"({ids})")


def _known(name: str) -> str | None:
    try:
        return preset_of(name)
    except ValueError:
        return None


def hf_model_id(name: str) -> str:
    """The id `vllm serve` is given: a Hugging Face id as typed (its canonical spelling), else the
    preset's instruct checkpoint; a preset without a public checkpoint, or a model spec that is
    no preset (a test's, a user's own), keeps its name."""
    key = name.strip().lower()
    alias = _known(name)
    if alias is None:
        return name
    ids = HF_MODEL_IDS.get(alias, ())
    return next((hf for hf in ids if hf.lower() == key), ids[0] if ids else alias)


def draft_placeholder(method: str, name: str) -> str:
    """What the line prints where no public head is known: an explicit, non-loadable placeholder."""
    return f"<{method}-head-for-{hf_model_id(name)}>"


def draft_model(method: str, name: str) -> tuple[str, bool]:
    """(the draft checkpoint for `method` on model `name`, True when it is a placeholder)."""
    head = DRAFT_HEADS.get((_known(name) or name, method))
    return (head[0], False) if head else (draft_placeholder(method, name), True)


__all__ = ["DRAFT_HEADS", "HF_MODEL_IDS", "NEEDS_DRAFT_MODEL", "draft_model", "draft_placeholder", "hf_model_id",
           "preset_of"]
