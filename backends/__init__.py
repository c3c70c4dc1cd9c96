"""hyspec.backends: the capability probe, the registry and one module per hardware kind.

    from hyspec.backends.probe import probe
    from hyspec.backends.registry import get_backend

    report = probe()         # ProbeReport; report.to_json() follows docs/probe.md
    backend = get_backend()  # the selected Backend: npu > cuda > cpu, or --backend / HYSPEC_BACKEND

Importing this package imports nothing else: backend modules load their
vendor packages lazily and never initialise hardware at import.
"""
