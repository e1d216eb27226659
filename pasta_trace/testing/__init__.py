"""Test data generators: seeded synthetic captures (synthetic.py, with the
copies, NCCL calls and tensor events of synthetic_host.py, synthetic_nccl.py
and synthetic_tensors.py) and their device files, whose exact contents the
tests and scripts/bench_*.py compare against.

Nothing in the shipped package imports them: the wheel leaves this folder
out (pyproject.toml, packages.find exclude), so they run from a checkout only.
"""
