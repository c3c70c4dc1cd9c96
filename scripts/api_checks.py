"""Issue figures for the API on the default model (fp32), written as JSON:

1. greedy logprobs through the official openai client (completions with echo, and chat) against
   transformers' log-softmax on the same GGUF: the largest difference, plain / ngram / EAGLE-3;
2. n = 4 at temperature 0.8: prompt tokens the engine computed and KV pages held right after the
   prefill, against four separate requests.

    python scripts/api_checks.py --out docs/results/2026-12-01/api/checks.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

PROMPT = "def fibonacci(n):\n    "
MESSAGES = [{"role": "user", "content": "Name three primary colors."}]
SPECS = {
    "plain": None,
    "ngram": {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3},
    "eagle3": {"method": "eagle3", "model": "assets/smollm2-eagle3", "num_speculative_tokens": 3,
               "controller": {"enabled": False, "profile_at_startup": False}},
}


def logprob_diffs(model: Path, oracle) -> dict:
    import openai

    from hyspec.server.app import create_app
    from hyspec.server.launcher import BackgroundServer

    out = {}
    for name, spec in SPECS.items():
        args = {"model": str(model), "dtype": "float32", "kv_cache_bytes": 64 << 20, "max_model_len": 512,
                "max_num_seqs": 4, "speculative_config": spec}
        server = BackgroundServer(create_app(args, served_model_name="smollm2")).start()
        try:
            client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=300)
            engine = server.app.state.async_engine.engine
            tok = engine.tokenizer
            r = client.completions.create(model="smollm2", prompt=PROMPT, max_tokens=64, temperature=0, logprobs=5,
                                          echo=True, extra_body={"ignore_eos": True, "return_token_ids": True})
            c = client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=64, temperature=0,
                                               logprobs=True, top_logprobs=5,
                                               extra_body={"ignore_eos": True, "return_token_ids": True})
            accepted = engine.spec.metrics.snapshot()["totals"]["accepted_tokens"] if engine.spec.enabled else 0
        finally:
            server.stop()
        ids = tok.encode(PROMPT) + r.choices[0].token_ids
        ref = oracle(ids)
        comp = max(abs(v - ref[i - 1, ids[i]].item()) for i, v in enumerate(r.choices[0].logprobs.token_logprobs)
                   if i > 0)
        rendered = tok.encode(tok.apply_chat_template(MESSAGES), add_special_tokens=False)
        chat_ids = c.choices[0].token_ids
        ref = oracle(rendered + chat_ids)
        chat = max(abs(item.logprob - ref[len(rendered) - 1 + j, t].item())
                   for j, (t, item) in enumerate(zip(chat_ids, c.choices[0].logprobs.content)))
        values = r.choices[0].logprobs.token_logprobs[1:] + [item.logprob for item in c.choices[0].logprobs.content]
        out[name] = {"completion_positions": len(ids) - 1, "completion_max_abs_diff": comp,
                     "chat_positions": len(chat_ids), "chat_max_abs_diff": chat, "accepted_draft_tokens": accepted,
                     "tokens_identical_to_plain": (r.choices[0].token_ids, chat_ids) == out["plain"]["_ids"]
                     if name != "plain" else True,
                     "max_abs_diff_vs_plain": max(abs(a - b) for a, b in zip(values, out["plain"]["_values"]))
                     if name != "plain" else 0.0,
                     "_ids": (r.choices[0].token_ids, chat_ids), "_values": values}
        print(name, {k: v for k, v in out[name].items() if not k.startswith("_")}, flush=True)
    for entry in out.values():
        entry.pop("_ids"), entry.pop("_values")
    return out


def prefill_once(model: Path) -> dict:
    from hyspec import LLM, SamplingParams
    from hyspec.engine.parallel_sampling import fan_out

    llm = LLM(str(model), dtype="float32", kv_cache_bytes=64 << 20, max_model_len=512)
    engine = llm.engine
    prompt = llm.tokenizer.encode(llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "Write a short poem about the sea, then explain its imagery."}]),
        add_special_tokens=False)
    fed = []
    run = engine.runner.run

    def counting(feeds, **kw):
        fed.append(sum(len(f.tokens) for f in feeds if len(f.tokens) > 1))
        return run(feeds, **kw)

    engine.runner.run = counting
    result = {"prompt_tokens": len(prompt), "block_size": engine.layout.block_size}
    for label, requests in (
            ("n=4 (one request)", fan_out("n4", SamplingParams(temperature=0.8, n=4, max_tokens=32, seed=0))),
            ("4 separate requests", [s for i in range(4) for s in fan_out(
                f"solo{i}", SamplingParams(temperature=0.8, max_tokens=32, seed=i))])):
        fed.clear()
        for s in requests:
            engine.add_request(prompt, s.params, s.request_id, s.share_prompt_with)
        engine.step()  # the prefill step (and, for n=4, the fork)
        pages = engine.pool.pages_by_owner()["target"]
        shared = engine.pool.num_shared
        prefill_tokens = sum(fed)
        while engine.has_unfinished_requests():
            engine.step()
        engine.pool.assert_all_free()
        result[label] = {"prompt_tokens_computed_in_first_step": prefill_tokens,
                         "prompt_tokens_computed_in_all": sum(fed),
                         "target_pages_after_prefill": pages, "shared_pages": shared}
        print(label, result[label], flush=True)
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    from hyspec.assets import default_model
    from hyspec.bench.vs_transformers import load_transformers

    model = default_model()
    hf = load_transformers(model)

    def oracle(ids):
        with torch.no_grad():
            return torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)

    report = {"model": str(model), "dtype": "float32", "logprobs_vs_transformers": logprob_diffs(model, oracle),
              "parallel_sampling": prefill_once(model)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
