"""Scripts run with the benchmark-only virtualenv (.bench-venv): peers' workers and producers.

They import nothing from fairqueue or benchmarks: they run under another interpreter, with PgQueuer
and Procrastinate installed (benchmarks/requirements-peers.txt), never in fairqueue's environment.
"""
