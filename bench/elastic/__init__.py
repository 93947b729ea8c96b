"""The elasticity simulation of bench_elasticity.py: workloads, tenant load, the clock,
the policies (ours: the manager's real ``decide``; the baselines)."""
