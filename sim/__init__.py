"""Workloads, GPU specs, the step cost model, the SimPy simulator and its metrics."""
