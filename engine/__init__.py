"""The real engine on torch: model, runner, sampling, speculative decoding, P/D instances, the
engine loop and its replay. What it shares with the simulator (request, flags, configs, scheduler,
KV block pool, records, summary) is in `engine.core`, which imports no torch."""
