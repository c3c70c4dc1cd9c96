"""Report what this node can run: backends (npu, cuda, cpu), their ops and drafting methods, and Ray.

Prints a table, or with --json the versioned JSON of docs/probe.md.  The
selected backend follows "Ascend first" (npu > cuda > cpu) unless --backend
or HYSPEC_BACKEND forces one; forcing one that cannot run here is an error
(exit 2) that says what is missing.
"""
from __future__ import annotations

import argparse
from hyspec.backends.probe import probe

# nothing here imports torch at module level: the probe must be able to
# diagnose a torch_npu that breaks `import torch` before torch is imported


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON (schema: docs/probe.md)")
    parser.add_argument("--backend", metavar="NAME", default=None,
                        help="force a backend: cpu, cuda, npu or auto (default: $HYSPEC_BACKEND, else auto)")
    parser.add_argument("--ray-address", metavar="ADDR", default=None,
                        help="also read this Ray cluster's nodes and resources (host:port, ray://host:port, "
                             "auto); the probe never starts a cluster")


def run(args: argparse.Namespace) -> int:
    report = probe(ray_address=args.ray_address, backend=args.backend)
    print(report.to_json() if args.json else format_report(report))
    return 0


def _gib(n: int | None) -> str:
    return "unknown" if n is None else f"{n / (1 << 30):.1f} GiB"


def _value(v) -> str:
    return "unknown" if v is None else str(v)


def format_report(report) -> str:
    """The report as a human-readable table (the JSON holds every field; this the ones people read)."""
    lines = [f"hyspec {report.hyspec_version} probe (schema {report.schema_version})", ""]
    lines.append(f"{'backend':<8} {'available':<10} details")
    for b in report.backends:
        caps = b.capabilities
        detail = _summary(b.name, caps) if b.available else caps.reason
        lines.append(f"{b.name:<8} {'yes' if b.available else 'no':<10} {detail}")
        if not b.available and caps.hint:
            lines.append(f"{'':<19} -> {caps.hint}")
    how = "auto: npu > cuda > cpu" if report.requested == "auto" else f"forced by {report.requested_by}"
    lines += ["", f"selected: {report.selected} ({how})", ""]
    for b in report.backends:
        if b.available:
            lines += _details(b)
    lines += _dist(report.dist)
    return "\n".join(lines)


def _summary(name: str, caps) -> str:
    if name == "cpu":
        return (f"{_value(caps.model_name)}, {_value(caps.physical_cores)} cores / "
                f"{_value(caps.logical_cores)} threads, {_gib(caps.memory_total_bytes)}")
    if name == "cuda":
        return f"{caps.device_count} device(s): " + ", ".join(d.name for d in caps.devices)
    return f"{caps.device_count} device(s): {_value(caps.soc_name)} ({_value(caps.soc_family)})"


def _details(b) -> list[str]:
    caps = b.capabilities
    rows: list[tuple[str, str]] = []
    if b.name == "cpu":
        isa = caps.isa.to_dict()
        have = [f for f, v in isa.items() if v]
        lacking = [f for f, v in isa.items() if v is False]
        rows += [
            ("model", f"{_value(caps.vendor)} / {_value(caps.model_name)} ({caps.arch})"),
            ("cores", f"{_value(caps.physical_cores)} physical, {_value(caps.logical_cores)} logical, "
                      f"{_value(caps.usable_cores)} usable by this process"),
            ("memory", f"{_gib(caps.memory_total_bytes)} total, {_gib(caps.memory_available_bytes)} available"),
            ("isa", (" ".join(have) or "none") + (f"  (absent: {' '.join(lacking)})" if lacking else "")
             if caps.isa.known else "unknown"),
            ("torch cpu", _value(caps.torch_cpu_capability)),
            ("onnxruntime", f"{caps.onnxruntime_version} ({', '.join(caps.onnxruntime_providers)})"
             if caps.onnxruntime_version else caps.onnxruntime_reason),
        ]
        if caps.unknown_fields:
            rows.append(("unknown", f"{', '.join(caps.unknown_fields)} (read from {caps.source})"))
    elif b.name == "cuda":
        for d in caps.devices:
            rows.append((f"cuda:{d.index}", f"{d.name}, sm {d.compute_capability[0]}.{d.compute_capability[1]}, "
                         f"{_gib(d.total_memory_bytes)}, bf16 {'yes' if d.bf16_supported else 'no'}"))
        rows += [("torch cuda", _value(caps.torch_cuda_version)),
                 ("triton", f"{_value(caps.triton_version)}, compiles: "
                            f"{'yes' if caps.triton_can_compile else caps.triton_reason}")]
    else:
        for d in caps.devices:
            rows.append((f"npu:{d.index}", f"{d.name}, {_gib(d.total_memory_bytes)}"))
        rows += [("soc", f"{_value(caps.soc_name)} (version {_value(caps.soc_version)}, "
                         f"family {_value(caps.soc_family)})"),
                 ("cann", _value(caps.cann_version)),
                 ("torch_npu", f"{caps.torch_npu_version} for torch {caps.torch_npu_built_for_torch}; "
                               f"torch {caps.torch_version}" + ("  MISMATCH" if caps.version_mismatch else ""))]
        if caps.hint:
            rows.append(("note", caps.hint))
        plan = caps.op_plan or {}
        if "ops" in plan:
            atb = plan["atb"]
            rows += [("op-plugin", f"{plan['op_plugin']} ({plan['op_plugin_choice']})"),
                     ("atb", "loaded" if atb["loaded"] else f"NOT loaded: {atb['detail']}")]
            for op, choice in plan["ops"].items():
                rows.append((f"{op}", " > ".join(choice["uses"])))
                rows += [("", f"  not {name}: {why}") for name, why in choice["rejected"].items()]
        elif "error" in plan:
            rows.append(("op plan", plan["error"]))
    native = ", ".join(b.native_ops) or "none"
    reference = ", ".join(op for op, source in b.op_sources if source == "reference") or "none"
    rows += [("native ops", native), ("reference ops", reference)]
    if b.ops_note:
        rows.append(("ops note", b.ops_note))
    if b.available:
        legend = {"int4": "int4 (group-wise)", "int8": "int8 (per row)",
                  "gguf-blocks-fp32": "gguf-blocks-fp32 (Q4_0/Q4_1/Q8_0 as stored, fp32 math)",
                  "gguf-blocks-a8": "gguf-blocks-a8 (the same blocks times 8-bit activations: --quantization a8)"}
        rows.append(("quantization", ", ".join(legend.get(k, k) for k in b.quantization)
                     if b.quantization else "none: quantized checkpoints are dequantized"))
    rows.append(("methods", " ".join(b.methods)))
    return [b.name] + [f"  {key:<14} {value}" for key, value in rows] + [""]


def _dist(dist) -> list[str]:
    ray = f"{dist.ray_version} installed" if dist.ray_installed else "not installed (pip install 'hyspec[dist]')"
    lines = ["dist", f"  {'ray':<14} {ray}"]
    if dist.address is None:
        lines.append(f"  {'cluster':<14} not asked (--ray-address ADDR)")
    elif not dist.connected:
        lines.append(f"  {'cluster':<14} {dist.reason}")
    else:
        total = ", ".join(f"{k} {v:g}" for k, v in dist.cluster_resources if not k.startswith("node:"))
        lines.append(f"  {'cluster':<14} {dist.address}: {len(dist.nodes)} node(s); {total}")
        for n in dist.nodes:
            res = ", ".join(f"{k} {v:g}" for k, v in n.resources if not k.startswith("node:"))
            lines.append(f"  {'':<14} {n.address} {'alive' if n.alive else 'dead'}: {res}")
    return lines
