"""What differs between two `vllm serve` flag lists, spelled as vLLM spells them: the headings of
an A/B comparison (`costline simulate --compare`, the dashboard's pinned run) name the flags that
differ rather than two labels that may read the same."""

from __future__ import annotations

import shlex

from sim.config import ENGINE_CONFIG_FLAGS

_BY_SPELLING = {s: f for f in ENGINE_CONFIG_FLAGS for s in (f.cli, *f.negatives)}
_ORDER = {f.name: i for i, f in enumerate(ENGINE_CONFIG_FLAGS)}


def parse_vllm_args(args: str | None) -> dict[str, str]:
    """`--max-num-seqs 32 --disable-prefix-caching` as {flag name: its text}; a flag costline does
    not define keeps its own spelling as the name."""
    tokens, out, i = shlex.split(args or ""), {}, 0
    while i < len(tokens):
        tok = tokens[i]
        flag = _BY_SPELLING.get(tok.split("=", 1)[0])
        takes_value = "=" not in tok and i + 1 < len(tokens) and not tokens[i + 1].startswith("--") \
            and (flag is None or flag.type is not bool)
        text = f"{tok} {shlex.quote(tokens[i + 1])}" if takes_value else tok
        out[flag.name if flag else tok.split("=", 1)[0]] = text
        i += 2 if takes_value else 1
    return out


def _default_text(name: str) -> str:
    flag = next((f for f in ENGINE_CONFIG_FLAGS if f.name == name), None)
    if flag is None:
        return f"no {name}"
    spelled = " ".join(flag.vllm_args(flag.default)) if flag.default is not None else ""
    return f"{spelled or flag.cli + ' auto'} (default)"


def flag_differences(a_args: str | None, b_args: str | None) -> tuple[list[str], list[str]]:
    """The flags whose values differ, in the order vLLM's flags are defined: (A's text, B's text)
    pairwise; a flag one side leaves at vLLM's default reads `--flag value (default)`."""
    a, b = parse_vllm_args(a_args), parse_vllm_args(b_args)
    names = sorted((n for n in a.keys() | b.keys() if a.get(n) != b.get(n)), key=lambda n: (_ORDER.get(n, 99), n))
    return [a.get(n) or _default_text(n) for n in names], [b.get(n) or _default_text(n) for n in names]


def headings(a_args: str | None, b_args: str | None, *, same: str = "same vLLM flags") -> tuple[str, str]:
    """One short text per side naming what sets it apart (`same` when the flags agree)."""
    da, db = flag_differences(a_args, b_args)
    return (", ".join(da) or same), (", ".join(db) or same)


__all__ = ["flag_differences", "headings", "parse_vllm_args"]
