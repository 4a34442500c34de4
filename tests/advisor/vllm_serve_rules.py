"""`vllm serve`'s argument rules as vLLM 0.33 documents them (`vllm serve --help=all`, the engine
args in vllm/engine/arg_utils.py, the config dataclasses), written down independently of
costline's own flag table so a test can parse a printed line the way vLLM would.

Only the flags a costline line may print are here; anything else is "unrecognized arguments",
as vLLM says. Defaults are vLLM's for `vllm serve` on an H100/H200-class GPU.
"""

from __future__ import annotations

import argparse
import functools
import json
import shlex
from typing import Any

KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc")
QUANTIZATION = ("awq", "fp8", "gptq", "gptq_marlin", "awq_marlin", "compressed-tensors", "modelopt", "mxfp4")
SPEC_METHODS = ("ngram", "ngram_gpu", "draft_model", "suffix", "eagle", "eagle3", "mtp")
SPEC_KEYS = {"method", "model", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
             "draft_tensor_parallel_size"}
KV_TRANSFER_KEYS = {"kv_connector", "kv_role", "kv_port", "kv_buffer_device", "engine_id",
                    "kv_connector_extra_config"}
KV_CONNECTORS = ("NixlConnector", "LMCacheConnectorV1", "MooncakeConnector", "MultiConnector", "OffloadingConnector")
# vLLM's resolved value when the flag is left out (vllm serve, H100/H200-class GPU)
DEFAULTS: dict[str, Any] = {"max_num_batched_tokens": 8192, "max_num_seqs": 1024, "block_size": 16,
                            "gpu_memory_utilization": 0.92, "kv_cache_dtype": "auto", "quantization": None,
                            "enable_prefix_caching": True, "enable_chunked_prefill": True,
                            "tensor_parallel_size": 1, "scheduling_policy": "fcfs", "long_prefill_token_threshold": 0}


def _size(text: str) -> int:
    """vLLM's human-readable integers: 8k = 8000, 8K = 8192."""
    mult = {"k": 1000, "K": 1024, "m": 10**6, "M": 2**20}.get(text[-1:], 1)
    return int(text[:-1] if mult > 1 else text) * mult


def _unit_float(text: str) -> float:
    v = float(text)
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"{v} not in (0, 1]")
    return v


def _spec(text: str) -> dict[str, Any]:
    cfg = json.loads(text)
    if not isinstance(cfg, dict) or set(cfg) - SPEC_KEYS:
        raise argparse.ArgumentTypeError(f"unknown speculative-config keys {set(cfg) - SPEC_KEYS}")
    if cfg.get("method") not in SPEC_METHODS:
        raise argparse.ArgumentTypeError(f"method {cfg.get('method')!r}")
    if cfg["method"] in ("eagle", "eagle3", "draft_model") and not cfg.get("model"):
        raise argparse.ArgumentTypeError(f"method {cfg['method']} needs a draft checkpoint in \"model\"")
    if not isinstance(cfg.get("num_speculative_tokens"), int):
        raise argparse.ArgumentTypeError("num_speculative_tokens must be an integer")
    return cfg


def _kv_transfer(text: str) -> dict[str, Any]:
    cfg = json.loads(text)
    if set(cfg) - KV_TRANSFER_KEYS or cfg.get("kv_connector") not in KV_CONNECTORS:
        raise argparse.ArgumentTypeError(f"bad kv-transfer-config {cfg}")
    if cfg.get("kv_role") not in ("kv_producer", "kv_consumer", "kv_both"):
        raise argparse.ArgumentTypeError("kv_role is required with kv_connector")
    return cfg


class _Refused(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:  # raise instead of exiting
        raise _Refused(message)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="vllm serve", add_help=False, allow_abbrev=False)
    p.add_argument("model_tag")
    p.add_argument("--max-num-batched-tokens", type=_size)
    p.add_argument("--max-num-seqs", type=_size)
    p.add_argument("--max-model-len", type=_size)
    p.add_argument("--block-size", type=int, choices=(1, 8, 16, 32, 64, 128, 256))
    p.add_argument("--gpu-memory-utilization", "--device-memory-utilization", type=_unit_float)
    p.add_argument("--num-gpu-blocks-override", type=int)
    p.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES)
    p.add_argument("--quantization", "-q", choices=QUANTIZATION)
    p.add_argument("--tensor-parallel-size", "-tp", type=int)
    p.add_argument("--long-prefill-token-threshold", type=int)
    p.add_argument("--scheduling-policy", choices=("fcfs", "priority"))
    p.add_argument("--prefix-caching-hash-algo", choices=("sha256", "sha256_cbor", "xxhash", "xxhash_cbor"))
    p.add_argument("--speculative-config", "-sc", type=_spec)
    p.add_argument("--kv-transfer-config", type=_kv_transfer)
    for name in ("prefix-caching", "chunked-prefill"):  # --enable-X / --disable-X / --no-enable-X
        dest = "enable_" + name.replace("-", "_")
        p.add_argument(f"--enable-{name}", dest=dest, action="store_true", default=None)
        p.add_argument(f"--disable-{name}", f"--no-enable-{name}", dest=dest, action="store_false")
    p.add_argument("--async-scheduling", dest="async_scheduling", action="store_true", default=None)
    p.add_argument("--no-async-scheduling", dest="async_scheduling", action="store_false")
    return p


@functools.cache
def _shared_parser() -> argparse.ArgumentParser:
    """One parser for every line (parse_args keeps no state in it): building one per line was
    most of the CPU time of the exhaustive test over the advisor's configurations."""
    return parser()


def parse_serve_line(line: str) -> dict[str, Any]:
    """The arguments of a printed `vllm serve ...` line as vLLM would parse them (the shell's
    quoting and a trailing `# comment` handled as a shell would); raises ValueError where vLLM
    would refuse the line, or where it names a flag at its default."""
    words = shlex.split(line, comments=True)
    if words[:2] != ["vllm", "serve"]:
        raise ValueError(f"not a vllm serve line: {line!r}")
    try:
        ns = _shared_parser().parse_args(words[2:])
    except (_Refused, json.JSONDecodeError, argparse.ArgumentTypeError) as exc:
        raise ValueError(f"vLLM would refuse {line!r}: {exc}") from None
    given = {k: v for k, v in vars(ns).items() if v is not None and k != "model_tag"}
    at_default = [k for k, v in given.items() if k in DEFAULTS and DEFAULTS[k] == v]
    if at_default:
        raise ValueError(f"flags at vLLM's default printed: {at_default}")
    return {"model": ns.model_tag, **given}


__all__ = ["parse_serve_line", "parser"]
