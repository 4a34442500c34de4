"""Disaggregated prefill across processes: prefill and decode instances, the router, KV transfer.
The P:D split and the transfer records are torch-free, in `engine.core.disagg_records`."""
