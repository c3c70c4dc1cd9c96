"""bench_ab.sh's two helpers.

    python bench_ab.py plain-tokens                 # plain decoding's tokens on --quick's prompts (JSON on stdout)
    python bench_ab.py merge RAW_DIR OUT.json       # the runs in RAW_DIR as one file; prints the summary table

Plain decoding's tokens come from whichever hyspec is imported: the bench checks every method against plain
decoding within a run, so equal plain tokens in the two trees make every method's tokens equal across them.
"""
import json
import statistics
import sys
from pathlib import Path


def plain_tokens() -> None:
    from hyspec import LLM, SamplingParams
    from hyspec.bench.prompts import humaneval_prompts
    from hyspec.bench.settings import QUICK

    prompts = humaneval_prompts()[:QUICK.num_prompts]
    params = SamplingParams(temperature=0.0, max_tokens=QUICK.max_tokens, ignore_eos=True)
    outs = LLM().generate(prompts, params, use_tqdm=False)
    print(json.dumps([list(o.outputs[0].token_ids) for o in outs]))


def merge(raw: Path, out: Path) -> None:
    runs = {}
    for path in sorted(raw.glob("*-[0-9].json")):
        tree, _, rnd = path.stem.partition("-")
        result = json.loads(path.read_text())
        runs[f"{tree}-{rnd}"] = {"identity": result["identity"], "machine": result["machine"],
                                 "rows": [{k: r[k] for k in ("label", "status", "tokens_per_s")}
                                          for r in result["results"] if r["engine"] == "hyspec"]}
    tokens = {tree: json.loads((raw / f"{tree}-plain-tokens.json").read_text()) for tree in ("before", "after")}
    same = tokens["before"] == tokens["after"]
    out.write_text(json.dumps({"runs": runs, "plain_tokens_identical": same,
                               "plain_tokens": tokens["after"]}, indent=1))
    rates: dict[tuple[str, str], list[float]] = {}
    for name, run in runs.items():
        for row in run["rows"]:
            if row["status"] == "ok":
                rates.setdefault((row["label"], name.split("-")[0]), []).append(row["tokens_per_s"]["median"])
    print("| method | before tok/s | after tok/s | after / before |")
    print("|---|---:|---:|---:|")
    for label in dict.fromkeys(label for label, _ in rates):
        b, a = rates.get((label, "before"), []), rates.get((label, "after"), [])
        ratio = statistics.median(a) / statistics.median(b) if a and b else float("nan")
        print(f"| {label} | {', '.join(f'{x:.1f}' for x in b)} | {', '.join(f'{x:.1f}' for x in a)} | {ratio:.2f} |")
    for name, run in runs.items():
        print(f"{name}: every method identical to plain decoding: {run['identity']['all_identical']} "
              f"({run['identity']['checked']} checked)")
    print(f"plain decoding's tokens, before vs after: {'identical' if same else 'DIFFERENT'} "
          f"({len(tokens['after'])} prompts, {sum(map(len, tokens['after']))} tokens)")


if __name__ == "__main__":
    if sys.argv[1:2] == ["plain-tokens"]:
        plain_tokens()
    else:
        merge(Path(sys.argv[2]), Path(sys.argv[3]))
