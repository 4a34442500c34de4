"""Disaggregated prefill across processes: prefill and decode instances, KV transfer records."""

from engine.disagg.records import (
    TRANSFER_COLUMNS,
    TRANSFER_MODES,
    TRANSPORTS,
    DisaggSplit,
    TransferRecord,
)

__all__ = ["TRANSFER_COLUMNS", "TRANSFER_MODES", "TRANSPORTS", "DisaggSplit", "TransferRecord"]
