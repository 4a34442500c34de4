"""The metadata one step's attention needs, passed explicitly from the runner to the model.

The kernels that read it (paged attention, the KV-cache writes) are entries of the model's
`kernels.Backend`; this module only describes the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(slots=True)
class AttentionMetadata:
    """Everything one flattened mixed batch needs for attention; tensors live on the model's device.

    `max_query_len` / `max_seq_len` are host ints the runner already knows, so no kernel
    has to read them back from the device (no sync).
    """

    slot_mapping: torch.Tensor  # int64 [num_tokens]; slot < 0 = padding, not written
    block_tables: torch.Tensor  # int32 [num_seqs, max_blocks_per_seq]
    seq_lens: torch.Tensor  # int32 [num_seqs], context including this step's tokens
    query_start_loc: torch.Tensor  # int32 [num_seqs + 1]
    max_query_len: int
    max_seq_len: int
    # sequences of at most kernels.DECODE_MAX_QUERY_LEN query tokens, when the runner knows it
    # (an eager step); None in a CUDA graph, whose batches vary: the kernel then plans for both
    num_decode_seqs: int | None = None
    # the kernels' work lists of this step (kernels.paged_attention.AttentionWork), when the
    # backend takes them and the step has prefill chunks; None otherwise
    work: object | None = None
