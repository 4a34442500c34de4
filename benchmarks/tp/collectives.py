"""All-reduce time by message size on a pair of GPUs, through the engine's path and through a plain
NCCL bus-bandwidth loop in the same processes, plus what the engine's step broadcast costs.

Modes per message size (bf16 elements; sizes of the model's [tokens, hidden] all-reduces and a
power-of-two ladder up to 256 MiB):

  plain   nccl-tests style: dist.all_reduce back to back, CUDA events around the loop, time / n
  engine  the engine's `TPGroup.all_reduce` (the call the layers make); on GPUs captured K times
          in one CUDA graph and replayed, as the engine's decode and mixed graphs run them
  (bus bandwidth = bytes / time x 2 (n - 1) / n, nccl-tests' definition for all-reduce)

and the other per-step traffic: rank 0's pickled step message over the gloo control group
(`broadcast_object_list`, 1-64 KiB), the LM head's logits all-gather (1-256 rows of a 128K vocabulary)
and the sampled-token buffer's device broadcast.
"""

from __future__ import annotations

import json
import pickle
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from engine.tensor_parallel import TPGroup
from engine.tp_worker import free_port, init_group, leave_group

GRAPH_REPEATS = 16  # all-reduces per captured graph


def sizes_bytes(dry: bool) -> list[tuple[str, int]]:
    """(label, bytes): the model's messages (tokens x hidden x 2 bytes) and a 2^k ladder."""
    if dry:
        return [(f"2^{k}", 2**k) for k in range(12, 21, 2)] + [("t8xh64", 8 * 64 * 4)]
    out = [(f"2^{k}", 2**k) for k in range(12, 29)]  # 4 KiB .. 256 MiB
    for h in (4096, 8192):
        out += [(f"t{t}xh{h}", t * h * 2) for t in (1, 8, 32, 128, 512, 2048, 8192)]
    return out


def _time_loop(fn, n: int, device: torch.device) -> float:
    """Seconds per call of `fn` over `n` back-to-back calls (CUDA events on a GPU)."""
    if device.type == "cuda":
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(n):
            fn()
        b.record()
        b.synchronize()
        return a.elapsed_time(b) / 1e3 / n
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def _engine_graph_s(tp: TPGroup, x: torch.Tensor, replays: int) -> float:
    """Seconds per all-reduce with GRAPH_REPEATS of them captured in one CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            tp.all_reduce(x)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(GRAPH_REPEATS):
            tp.all_reduce(x)
    g.replay()
    torch.cuda.synchronize()
    return _time_loop(g.replay, replays, x.device) / GRAPH_REPEATS


def measure_sizes(tp: TPGroup, device: torch.device, dry: bool) -> list[dict]:
    rows = []
    n_ranks = tp.world_size
    for label, nbytes in sizes_bytes(dry):
        dtype = torch.float32 if dry else torch.bfloat16
        x = torch.ones(max(1, nbytes // dtype.itemsize), dtype=dtype, device=device)
        reps = 5 if dry else (200 if nbytes <= 1 << 20 else 50 if nbytes <= 1 << 24 else 10)
        for _ in range(3):  # warm-up
            dist.all_reduce(x, group=tp.device_group)
        modes = {"plain": lambda x=x: dist.all_reduce(x, group=tp.device_group),
                 "engine": lambda x=x: tp.all_reduce(x)}
        for mode, fn in modes.items():
            if mode == "engine" and device.type == "cuda":
                sec = _engine_graph_s(tp, x, max(2, reps // GRAPH_REPEATS))
            else:
                dist.barrier(group=tp.control_group)
                sec = _time_loop(fn, reps, device)
            algbw = nbytes / sec / 1e9
            rows.append({"label": label, "bytes": nbytes, "mode": mode, "us": sec * 1e6, "algbw_gb_per_s": algbw,
                         "busbw_gb_per_s": algbw * 2 * (n_ranks - 1) / n_ranks, "reps": reps,
                         "graph": mode == "engine" and device.type == "cuda"})
    return rows


def measure_control(tp: TPGroup, device: torch.device, max_num_seqs: int) -> list[dict]:
    """Rank 0's step message (pickled bytes of a size) over gloo, and the sampled tokens' broadcast."""
    rows = []
    for kib in (1, 16, 64):
        payload = bytes(kib * 1024)
        box = [payload]

        def send(box=box) -> None:
            dist.broadcast_object_list(box, src=0, group=tp.control_group)

        for _ in range(3):
            send()
        sec = _time_loop(send, 50, torch.device("cpu"))
        rows.append({"what": "step message (gloo broadcast_object_list)", "bytes": len(pickle.dumps(payload)),
                     "us": sec * 1e6})
    vocab = 512 if device.type == "cpu" else 128256  # Llama 3's vocabulary
    dtype = torch.float32 if device.type == "cpu" else torch.bfloat16
    for rows_n in (1, 64, 256):  # the LM head's logits all-gather (TPGroup.gather_vocab), per step
        local = torch.ones(rows_n, -(-vocab // tp.world_size), dtype=dtype, device=device)
        for _ in range(3):
            tp.gather_vocab(local, vocab)
        sec = _time_loop(lambda local=local: tp.gather_vocab(local, vocab), 20, device)
        rows.append({"what": f"logits all-gather ({rows_n} rows x {vocab} vocab)",
                     "bytes": local.numel() * local.element_size(), "us": sec * 1e6})
    tokens = torch.zeros(max_num_seqs, dtype=torch.int64, device=device)
    for _ in range(3):
        dist.broadcast(tokens, src=0, group=tp.device_group)
    sec = _time_loop(lambda: dist.broadcast(tokens, src=0, group=tp.device_group), 100, device)
    rows.append({"what": "sampled tokens (device broadcast)", "bytes": tokens.numel() * 8, "us": sec * 1e6})
    return rows


def _rank(rank: int, world: int, address: str, device: str, dry: bool, out: str) -> None:
    dev = torch.device(device) if device == "cpu" else torch.device("cuda", rank)
    tp = init_group(rank, world, address, dev)
    rows = measure_sizes(tp, dev, dry)
    control = measure_control(tp, dev, 128)
    if rank == 0:
        Path(out).write_text(json.dumps({"world_size": world, "sizes": rows, "control": control}) + "\n")
    if dev.type == "cuda":
        torch.cuda.synchronize()
    leave_group()


def run(world: int, device: str, dry: bool, out: Path) -> dict:
    """Spawn `world` ranks, measure, and summarize: per size the engine path over the plain loop."""
    address = f"tcp://127.0.0.1:{free_port()}"
    mp.start_processes(_rank, args=(world, address, device, dry, str(out)), nprocs=world, join=True,
                       start_method="spawn")
    data = json.loads(out.read_text())
    by = {}
    for r in data["sizes"]:
        by.setdefault((r["label"], r["bytes"]), {})[r["mode"]] = r["us"]
    ratios = [{"label": k[0], "bytes": k[1], "plain_us": v["plain"], "engine_us": v["engine"],
               "engine_over_plain": v["engine"] / v["plain"]} for k, v in by.items()]
    big = [r["engine_over_plain"] for r in ratios if r["bytes"] >= 1 << 20]
    return {"rows": len(data["sizes"]), "ratios": ratios, "control": data["control"],
            "engine_over_plain_p50_from_1MiB": statistics.median(big) if big else None,
            "within_1_2x_from_1MiB": all(x <= 1.2 for x in big) if big else None}


__all__ = ["measure_control", "measure_sizes", "run", "sizes_bytes"]
