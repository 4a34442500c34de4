"""Checks the real engine runs before any work: the device, the attention backend, the model's
size against the memory it would fill, the CPU KV size, the metrics endpoint. Each failure is a
`FlagError` (or `ValueError`) naming the flag as typed and the fix, raised before a model is
built, a warm-up run or a port opened, so a bad flag never costs minutes or gigabytes first.

- `check_device(name)`: cuda without a visible GPU, cuda:N past the last GPU;
- `check_backend(backend, device_type)`: Triton kernels need a GPU (or TRITON_INTERPRET=1, the
  slow CPU interpreter the tests use);
- `model_spec(name)`: a preset or a model folder's config.json, checked (engine/hf_config.py);
- `check_weights_fit(spec, bytes_per_param, device)`: the weights against the device's free
  memory, host memory included (a folder with a 405B config.json and no weights would otherwise
  allocate its 810 GB of parameters first); `engine.model.LlamaModel` calls it too, so every
  path to a model (presets, folders, drafts, `LLM(...)`) is covered;
- `check_cpu_kv_cache_bytes(value)`: not more than the machine's memory;
- `check_metrics_endpoint(port, host)`: a port in 1-65535 and an address this machine can listen
  on, tried with a bind, before the warm-up rather than after.

torch is imported only by the checks that need it.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from pathlib import Path
from typing import Any

from engine.core.flags import FlagError
from engine.core.host_names import is_host_name
from engine.core.model_spec import ModelSpec, get_model

GIB = 2**30
def host_memory_total() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def host_memory_available() -> int:
    """Bytes the host can give a new allocation (MemAvailable: free plus reclaimable cache)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def check_device(name: str) -> str:
    """The device type `name` resolves to ("cpu" or "cuda"), refusing one that is not there."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return "cpu"
    if not torch.cuda.is_available():
        raise FlagError("device", name, "no CUDA GPU is visible here (torch.cuda.is_available() is false: no "
                        "GPU, no driver, or a CPU build of torch); use {device} cpu, or auto")
    index = int(name.split(":")[1]) if ":" in name else 0
    count = torch.cuda.device_count()
    if index >= count:
        raise FlagError("device", name, f"this machine has {count} GPU(s), cuda:0 to cuda:{count - 1}; "
                        "choose one of them")
    return "cuda"


def check_backend(backend: str, device_type: str) -> None:
    """Triton's kernels need a GPU; on the CPU only its interpreter (TRITON_INTERPRET=1) runs them."""
    if backend != "triton":
        return
    if device_type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        raise FlagError("attention_backend", backend, "the Triton kernels need a CUDA GPU (on a CPU only "
                        "Triton's slow interpreter runs them: TRITON_INTERPRET=1); use {attention_backend} "
                        "torch, or auto")
    import importlib.util

    if importlib.util.find_spec("triton") is None:
        raise FlagError("attention_backend", backend, "triton is not installed: pip install 'costline[engine]', "
                        "or use {attention_backend} torch")


def model_spec(name: str, field: str = "model") -> ModelSpec:
    """A preset's spec, or a model folder's (config.json checked); FlagError for anything else."""
    path = Path(name)
    if path.is_dir():
        from engine.hf_config import spec_of_folder

        return spec_of_folder(path)
    try:
        return get_model(name)
    except ValueError as exc:
        raise FlagError(field, repr(name), f"neither a model folder (config.json + safetensors) nor a preset: "
                        f"{exc}") from None


def _device_free(device: Any) -> tuple[int, str]:
    """(free bytes, what) of a torch device."""
    if str(device).split(":")[0] == "cuda":
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0]), f"{device} memory has"
    return host_memory_available(), "host memory has"


def check_weights_fit(spec: ModelSpec, bytes_per_param: float, device: Any, *, field: str = "model",
                      value: Any = None) -> None:
    """Refuse, before allocating, weights larger than the device's free memory."""
    need = spec.num_params * bytes_per_param
    free, where = _device_free(device)
    if need > free:
        raise FlagError(field, value if value is not None else spec.name,
                        f"its weights need {need / GIB:,.1f} GiB ({spec.num_params / 1e9:,.2f} B parameters at "
                        f"{bytes_per_param:g} bytes each) but {where} {free / GIB:,.1f} GiB free; use a smaller "
                        "model (e.g. tiny), a lower --dtype, or a device with more memory")


def check_cpu_kv_cache_bytes(value: int) -> None:
    total = host_memory_total()
    if value > total:
        raise FlagError("cpu_kv_cache_bytes", value, f"more than this machine's {total / GIB:,.1f} GiB of "
                        "memory; lower {cpu_kv_cache_bytes} (e.g. 1G)")


DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def check_engine_args(cfg: Any) -> str:
    """Everything above for an `EngineArgs` (and its draft model); returns the device type."""
    device_type = check_device(cfg.device)
    check_backend(cfg.attention_backend, device_type)
    check_cpu_kv_cache_bytes(cfg.cpu_kv_cache_bytes)
    device = cfg.device if cfg.device != "auto" else device_type
    models = [("model", cfg.model)]
    if cfg.speculative_config is not None and cfg.speculative_config.model:
        models.append(("speculative_config", cfg.speculative_config.model))
    tp = getattr(cfg, "tensor_parallel_size", 1) or 1
    for field, name in models:
        spec = model_spec(name, field)
        dtype = spec.dtype if cfg.dtype == "auto" else cfg.dtype
        # each rank holds 1/tp of the target's weights (the draft runs unsplit: refused with TP anyway)
        share = tp if field == "model" else 1
        check_weights_fit(spec, DTYPE_BYTES[dtype] / share, device, field=field, value=name)
    return device_type


DEFAULT_METRICS_HOST = "127.0.0.1"


def check_metrics_endpoint(port: int | None, host: str) -> None:
    """A port in range and an address to listen on, tried with a bind (released at once)."""
    if port is None:
        if host != DEFAULT_METRICS_HOST:
            raise ValueError(f"--metrics-host {host!r} only applies to --metrics-port; add --metrics-port PORT "
                             "or drop --metrics-host")
        return
    if not 1 <= port <= 65535:
        raise ValueError(f"--metrics-port {port}: a TCP port is from 1 to 65535 (e.g. 8000)")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if not is_host_name(host):
            raise ValueError(f"--metrics-host {host!r}: not an IP address or host name; use 127.0.0.1 (this "
                             "machine only) or 0.0.0.0 (every interface)") from None
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise ValueError(f"--metrics-host {host!r}: not an address this machine knows ({exc}); use 127.0.0.1 "
                         "or 0.0.0.0") from None
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(addr)
        except OSError as exc:
            raise ValueError(f"--metrics-port {port} on {host}: cannot listen there ({exc.strerror}); choose a "
                             "free port (or an address of this machine)") from None


__all__ = [
    "check_backend",
    "check_cpu_kv_cache_bytes",
    "check_device",
    "check_engine_args",
    "check_metrics_endpoint",
    "check_weights_fit",
    "host_memory_available",
    "host_memory_total",
    "model_spec",
]
