"""Benchmarks of chatrlhf on this machine: `python -m bench` (see `bench/run.py`)."""
