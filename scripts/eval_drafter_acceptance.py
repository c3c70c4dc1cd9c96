"""Greedy chain acceptance of EAGLE-3 heads on the target's own answers to prompts none of them trained on.

For each prompt the target answers greedily once; each head is then run over the answer as in
training-time test (teacher forcing with the answer's tokens, which at temperature 0 are exactly the
tokens a chain draft must match): at every answer position, the number of consecutive draft steps
that equal the target's tokens is what a depth-K chain would have accepted there.

    python scripts/eval_drafter_acceptance.py --heads assets/smollm2-eagle3 .bench-work/eagle3-stdlib \\
        --prompts .bench-work/drafter-data/prompts.jsonl --skip 1024 --count 24 --out FILE.json

The prompts after --skip were never answered for training (the recipe answers the first 1,024).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--heads", nargs="+", type=Path, required=True)
    ap.add_argument("--prompts", type=Path, required=True)
    ap.add_argument("--skip", type=int, default=1024)
    ap.add_argument("--count", type=int, default=24)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--depth", type=int, default=3)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    from hyspec import LLM, SamplingParams
    from hyspec.assets import default_model
    from hyspec.drafters.eagle.checkpoint import load_head
    from hyspec.drafters.eagle.recipe import ttt_unroll

    llm = LLM(str(default_model()), dtype="float32", max_model_len=1024, kv_cache_bytes=128 << 20)
    model, tok = llm.engine.model, llm.tokenizer
    records = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    records = records[args.skip:args.skip + args.count]
    prompts = []
    for r in records:
        if "messages" in r:
            prompts.append(tok.encode(tok.apply_chat_template(r["messages"]), add_special_tokens=False))
        else:
            prompts.append(tok.encode(r["prompt"]))
    prompts = [p[-512:] for p in prompts]
    answers = [o.outputs[0].token_ids for o in llm.generate(
        [{"prompt_token_ids": p} for p in prompts], SamplingParams(temperature=0, max_tokens=args.max_tokens))]
    report = {"model": str(default_model()), "prompts": len(prompts), "skip": args.skip,
              "answer_tokens": sum(len(a) for a in answers), "depth": args.depth, "heads": {}}
    for head_dir in args.heads:
        head = load_head(head_dir, model, "eagle3", dtype=torch.float32, device=model.embed_tokens.weight.device,
                         ops=llm.engine.backend.ops, max_positions=2048)
        layers = tuple(sorted(set(head.config.target_aux_layers)))
        correct = [0] * args.depth
        chain_total, positions = 0, 0
        for prompt, answer in zip(prompts, answers):
            ids = prompt + answer
            x = torch.tensor([ids])
            with torch.no_grad():
                out = model.forward_dense(x, aux_layers=layers)
                raw = torch.cat([out.aux_hidden[j] for j in head.config.target_aux_layers], -1)[:, :-1]
                steps = ttt_unroll(head, x, raw.to(head.fc.weight.dtype), args.depth)
                preds = [head.draft_to_target(head.logits(h[0]).argmax(-1)).tolist() for h in steps]
            for i in range(len(prompt) - 1, len(ids) - 2):  # pair i drafts tokens i+2, i+3, ...
                run = 0
                for j in range(args.depth):
                    if i + j + 2 >= len(ids) or preds[j][i] != ids[i + j + 2]:
                        break
                    run += 1
                for j in range(args.depth):
                    if i + j + 2 < len(ids) and preds[j][i] == ids[i + j + 2]:
                        correct[j] += 1
                chain_total += run
                positions += 1
        report["heads"][str(head_dir)] = {
            "teacher_forced_acc_per_step": [round(c / positions, 4) for c in correct],
            "chain_acceptance_length": round(1 + chain_total / positions, 4), "positions": positions}
        print(head_dir, report["heads"][str(head_dir)], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
