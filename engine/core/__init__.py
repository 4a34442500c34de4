"""What the simulator and the real engine share, torch-free (as vLLM keeps `v1/core` apart from
`v1/worker`): the `Request`, vLLM's flags and the configs built from them (speculative decoding,
P/D split), the model-architecture spec, the scheduler, its output, the KV block pool and block
keys, decode skip-ahead, step and request records, the run summary, CUDA-graph bucket rules, and
the checked reading of input files and writing of output folders.

Imports neither torch nor triton nor any other costline layer: `sim/`, `advisor/` and `app/` import
the engine only through here; the torch side (`engine/` outside this package) builds on it.
"""

from engine.core.block_keys import BlockKeys, HashIdKeys, TokenKeys
from engine.core.block_pool import BlockPool
from engine.core.config import EngineArgs, SchedulingArgs, scheduler_config
from engine.core.cuda_graphs import (
    VERIFY_GRAPH_MAX_TOKENS,
    decode_graph_bucket,
    decode_graph_buckets,
    mixed_graph_bucket,
    mixed_graph_buckets,
)
from engine.core.decode_skip import advance_decode, uniform_decode_steps
from engine.core.disagg_records import DisaggSplit, TransferRecord
from engine.core.flags import FLAGS_BY_NAME, Flag, FlagError
from engine.core.host_names import is_host_name
from engine.core.input_files import InputFileError, read_json
from engine.core.kv_cache_manager import KVCacheManager
from engine.core.model_spec import MODEL_PRESETS, ModelSpec, get_model
from engine.core.outputs import OutputPathError, check_output_dir, check_output_file
from engine.core.prometheus import LiveMetrics, prometheus_text
from engine.core.records import RequestRecord, StepRecord, to_columns
from engine.core.request import Request, materialize_prompt
from engine.core.request_queue import WaitingQueue
from engine.core.request_state import SchedulerRequest
from engine.core.run_summary import RunTables, summarize
from engine.core.scheduler import Scheduler
from engine.core.scheduler_config import SchedulerConfig
from engine.core.scheduler_output import (
    RequestResult,
    ScheduledRequest,
    SchedulerOutput,
    SchedulerStats,
    StepColumns,
)
from engine.core.slo import SLO
from engine.core.speculative_config import SpeculativeConfig, parse_speculative_config
from engine.core.summary_record import LatencyStats, RunSummary

__all__ = [
    "FLAGS_BY_NAME",
    "MODEL_PRESETS",
    "SLO",
    "VERIFY_GRAPH_MAX_TOKENS",
    "BlockKeys",
    "BlockPool",
    "DisaggSplit",
    "EngineArgs",
    "Flag",
    "FlagError",
    "HashIdKeys",
    "InputFileError",
    "KVCacheManager",
    "LatencyStats",
    "LiveMetrics",
    "ModelSpec",
    "OutputPathError",
    "Request",
    "RequestRecord",
    "RequestResult",
    "RunSummary",
    "RunTables",
    "ScheduledRequest",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutput",
    "SchedulerRequest",
    "SchedulerStats",
    "SchedulingArgs",
    "SpeculativeConfig",
    "StepColumns",
    "StepRecord",
    "TokenKeys",
    "TransferRecord",
    "WaitingQueue",
    "advance_decode",
    "check_output_dir",
    "check_output_file",
    "decode_graph_bucket",
    "decode_graph_buckets",
    "get_model",
    "is_host_name",
    "materialize_prompt",
    "mixed_graph_bucket",
    "mixed_graph_buckets",
    "parse_speculative_config",
    "prometheus_text",
    "read_json",
    "scheduler_config",
    "summarize",
    "to_columns",
    "uniform_decode_steps",
]
