"""Runs inside Vidur's own environment (its venv python, cwd = Vidur's checkout); started by
`vidur_side_by_side.py`, never imported by costline.

    python vidur_runner.py SETTINGS.json  ->  one JSON object on the last line of stdout

With "mode": "train" it only constructs one `Simulator`, so that Vidur trains and caches its
predictor, and reports how long that took.

Builds Vidur's `SimulationConfig` from command-line style flags (as `python -m vidur.main`
does), then constructs one `Simulator` (set-up, which trains or loads from Vidur's
cache its execution-time predictor and fills its prediction tables; timed separately) and times
`Simulator.run()` alone with `time.process_time`. Mean TTFT / TPOT are computed afterwards from
Vidur's request records with the same definitions the costline side uses.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import time


def _vidur_argv(s: dict) -> list[str]:
    pred = s["predictor"]
    flags = {
        "replica_config_device": "a100", "replica_config_network_device": "a100_pairwise_nvlink",
        "replica_config_model_name": "meta-llama/Meta-Llama-3-8B",
        "replica_config_tensor_parallel_size": 1, "replica_config_num_pipeline_stages": 1,
        "cluster_config_num_replicas": 1,
        "replica_scheduler_config_type": "sarathi",
        "sarathi_scheduler_config_chunk_size": s["chunk_size"],
        "sarathi_scheduler_config_batch_size_cap": s["batch_size_cap"],
        "request_generator_config_type": "trace_replay",
        "trace_request_generator_config_trace_file": s["trace_file"],
        "trace_request_generator_config_max_tokens": s["max_tokens"],
        "execution_time_predictor_config_type": pred,
        f"{pred}_execution_time_predictor_config_attention_input_file": s["attention_file"],
        f"{pred}_execution_time_predictor_config_prediction_max_prefill_chunk_size": s["chunk_size"],
        f"{pred}_execution_time_predictor_config_prediction_max_batch_size": s["batch_size_cap"],
        f"{pred}_execution_time_predictor_config_prediction_max_tokens_per_request": s["max_tokens"],
        "metrics_config_output_dir": s["output_dir"], "metrics_config_cache_dir": s["cache_dir"],
        "metrics_config_store_plots": False,
        "metrics_config_enable_chrome_trace": s["chrome_trace"],
        "metrics_config_write_metrics": s["write_metrics"],
    }
    argv = []
    for k, v in flags.items():
        if isinstance(v, bool):  # Vidur's flat config takes --x / --no-x for booleans
            argv.append(f"--{k}" if v else f"--no-{k}")
        else:
            argv += [f"--{k}", str(v)]
    return argv


def _means(requests: list) -> dict:
    """TTFT = first token - arrival; TPOT = (completion - first token) / (output tokens - 1)."""
    done = [r for r in requests if r.completed]
    ttft = [r.prefill_completed_at - r.arrived_at for r in done]
    tpot = [(r.completed_at - r.prefill_completed_at) / (r.num_decode_tokens - 1)
            for r in done if r.num_decode_tokens > 1]
    return {"completed": len(done), "mean_ttft_ms": 1e3 * sum(ttft) / max(len(ttft), 1),
            "mean_tpot_ms": 1e3 * sum(tpot) / max(len(tpot), 1)}


def _train(config_cls, simulator_cls, set_seeds) -> dict:
    """First use: Vidur fits its predictor (grid search in joblib worker processes) and caches it.

    CPU of the workers is counted once they are shut down and reaped (RUSAGE_CHILDREN).
    """
    import resource

    from joblib.externals.loky import get_reusable_executor

    c0, w0 = time.process_time(), time.perf_counter()
    config = config_cls.create_from_cli_args()
    set_seeds(config.seed)
    sim = simulator_cls(config)
    atexit.unregister(sim._write_output)
    own_cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    get_reusable_executor().shutdown(wait=True)
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return {"train_wall_s": wall, "train_own_cpu_s": own_cpu, "train_workers_cpu_s": ch.ru_utime + ch.ru_stime}


def main() -> None:
    with open(sys.argv[1]) as f:
        settings = json.load(f)
    os.chdir(settings["vidur_src"])  # Vidur reads its profiles relative to its checkout
    sys.path.insert(0, settings["vidur_src"])
    sys.argv = [sys.argv[0], *_vidur_argv(settings)]
    from vidur.config import SimulationConfig
    from vidur.entities import Batch
    from vidur.simulator import Simulator
    from vidur.utils.random import set_seeds

    if settings.get("mode") == "train":
        print(json.dumps(_train(SimulationConfig, Simulator, set_seeds)))
        return
    # One simulation per process: Vidur numbers its entities with class-level counters, and a
    # second Simulator in the same process finds its replica under another id.
    c0, w0 = time.process_time(), time.perf_counter()
    config = SimulationConfig.create_from_cli_args()
    set_seeds(config.seed)
    sim = Simulator(config)
    setup_cpu, setup_wall = time.process_time() - c0, time.perf_counter() - w0
    atexit.unregister(sim._write_output)  # plots/CSV writing after the loop: not timed, not needed
    requests = [ev._request for _, ev in sim._event_queue]
    batch0 = Batch._id
    c1 = time.process_time()
    sim.run()
    run_cpu = time.process_time() - c1
    run = {"setup_cpu_s": setup_cpu, "setup_wall_s": setup_wall, "run_cpu_s": run_cpu,
           "requests": len(requests), "batches": Batch._id - batch0, **_means(requests)}
    print(json.dumps({"argv": sys.argv[1:], **run}))


if __name__ == "__main__":
    main()
