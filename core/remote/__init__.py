"""Remote drafting: drafters on CPU workers of a Ray cluster (``draft_placement: "remote"``).

    proposer.py   RemoteProposer (the engine's Proposer)
    factory.py    build_remote_proposer: workers (Ray or given handles) + the local fallback
    protocol.py   messages target <-> worker, and the checks on every answer
    wire.py       their byte format (JSON header + raw arrays; no pickle)
    host.py       the worker side: any Proposer behind messages, pipelined drafting
    worker.py     the Ray actor, the drafter's stand-in engine, spawning workers
    transport.py  handles to workers (Ray actors, or in-process hosts)
    cluster.py    connecting to Ray or starting a local instance
    health.py     pings, failover, rejoin
    scheduler.py  per-worker thread counts (adaptive resource partitioning)
    metrics.py    counters and their Prometheus families

Nothing here imports torch or ray at package import time.
"""
