"""Build the served model (engine, warm-up, metrics, tokenizer) and run it under uvicorn.

`serve()` blocks (the command line); `ServerThread` runs the same server in a background thread
of this process on a free port (tests, notebooks).
"""

from __future__ import annotations

import gc
import socket
import sys
import threading
from collections.abc import Callable, Sequence

import uvicorn

from engine.core.config import EngineArgs
from engine.engine_loop import EngineCore
from engine.metrics import EngineMetrics
from engine.serve.api import ServedModel, build_app
from engine.serve.async_engine import AsyncEngine
from engine.serve.load_client import raise_fd_limit
from engine.serve.tokenizers import tokenizer_for


def build_served_model(cfg: EngineArgs, names: Sequence[str], *, tokenizer: str = "auto",
                       max_num_queued_reqs: int | None = None, warm_up: bool = True,
                       progress: Callable[[str], None] | None = None) -> ServedModel:
    """The engine as `engine run` builds it (server defaults), warmed up before the first request."""
    core = EngineCore(cfg, **({"progress": progress} if progress else {}))
    if warm_up:
        core.warm_up()
    metrics = EngineMetrics(names[0], core.max_model_len)
    # vLLM's /metrics also carries prometheus-client's process and Python GC collectors (its
    # default registry): GC collections per generation show pauses that land in engine steps
    from prometheus_client import GCCollector, PlatformCollector, ProcessCollector

    for collector in (GCCollector, PlatformCollector, ProcessCollector):
        collector(registry=metrics.registry)
    engine = AsyncEngine(core, metrics=metrics, max_num_queued_reqs=max_num_queued_reqs)
    return ServedModel(engine=engine, tokenizer=tokenizer_for(tokenizer, core.spec.name, core.spec.vocab_size),
                       names=tuple(names), max_model_len=core.max_model_len, vocab_size=core.spec.vocab_size)


# The engine thread and the event loop share the GIL. When the loop is busy (many streams), a
# thread waiting for the GIL gets it only after the switch interval (CPython's default: 5 ms, most
# of a decode step); a short interval hands it back to the engine thread within ~0.2 ms.
GIL_SWITCH_INTERVAL_S = 0.0002


def freeze_startup_heap() -> int:
    """vLLM's freeze after start-up (vllm/utils/gc_utils.py `freeze_gc_heap`): collect, then move
    every object alive now (torch, the model, kernel caches: hundreds of thousands) to the
    permanent generation, so the full collections the server's per-request garbage triggers scan
    only new objects instead of pausing the engine thread mid-step (engine/replay.py freezes the
    heap for a replay the same way). Returns the frozen count."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def serve(model: ServedModel, host: str, port: int, *, log_level: str = "warning") -> None:
    raise_fd_limit()  # a socket per concurrent client
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    freeze_startup_heap()  # the engine is built and warmed up: what lives now lives for good
    # one event loop, no reload, no workers: the engine lives in this process
    uvicorn.run(build_app(model), host=host, port=port, log_level=log_level, access_log=False,
                timeout_keep_alive=30)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerThread:
    """`with ServerThread(model) as url:` a live server on 127.0.0.1 for the block."""

    def __init__(self, model: ServedModel, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.model = model
        self.port = port or free_port(host)
        self.url = f"http://{host}:{self.port}"
        config = uvicorn.Config(build_app(model), host=host, port=self.port, log_level="warning",
                                access_log=False)
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, name="costline-serve", daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        while not self.server.started:
            if not self._thread.is_alive():
                raise RuntimeError(f"the server on port {self.port} did not start")
            self._thread.join(0.02)
        return self.url

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(30)
