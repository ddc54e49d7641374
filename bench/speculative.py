#!/usr/bin/env python3
"""Speculative decoding by prompt lookup against plain decoding, same engine, same
prompts, greedy (docs/SPECULATIVE.md).

    python bench/speculative.py                       # default model, host executor
    python bench/speculative.py --draft-tokens 2,4,8 --repeat 3 --json out.json

Three prompts (chat template on): a code edit (rename a variable in a 30-line
function: the reply repeats most of the prompt), a quotation (copy a paragraph
of Pride and Prejudice, from ../shared/data, verbatim), and a question whose
answer repeats nothing of it (lookup's overhead when little matches). For each,
plain decoding and lookup with each --draft-tokens, --repeat times alternating
(median): decode tokens/s (generated - 1 over the decode seconds, the first
token coming with the prefill), the whole call's seconds, ids proposed and
accepted. Every lookup reply must equal the plain one id for id (checked; a
mismatch exits 1). Prints a table; --json writes every number with the machine,
device and date.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("METALKV_NO_PROGRESS", "1")
import metalkv  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

CODE = '''def summarize(records, threshold):
    """Count, total and mean of the amounts above a threshold, per category."""
    totals = {}
    counts = {}
    for x in records:
        category = x["category"]
        amount = x["amount"]
        if amount <= threshold:
            continue
        if category not in totals:
            totals[category] = 0.0
            counts[category] = 0
        totals[category] += amount
        counts[category] += 1
    result = []
    for category in sorted(totals):
        total = totals[category]
        count = counts[category]
        mean = total / count
        result.append({"category": category, "count": count, "total": total, "mean": mean})
    return result
'''


def prompts() -> dict[str, str]:
    book = ROOT.parent / "shared" / "data" / "pride_and_prejudice.txt"
    text = book.read_text(encoding="utf-8") if book.exists() else ""
    start = text.find("It is a truth universally acknowledged")
    paragraph = text[start:start + 700].rsplit(".", 1)[0] + "." if start >= 0 else CODE
    return {
        "code edit": "Rename the loop variable `x` to `record` in this Python function. Reply with the whole "
                     "function and nothing else.\n\n```python\n" + CODE + "```",
        "quotation": "Copy the following passage exactly, word for word:\n\n" + paragraph,
        "no match": "In three short sentences: why do leaves change colour in autumn?",
    }


def one(engine, prompt: str, max_tokens: int, **kw) -> dict:
    t0 = time.perf_counter()
    text = engine.generate(prompt, max_tokens=max_tokens, temperature=0.0, **kw)
    wall = time.perf_counter() - t0
    st = engine.last_stats
    decoded = st["generated_tokens"] - 1
    return {"text": text, "wall_s": wall, "generated": st["generated_tokens"], "decode_s": st["decode_seconds"],
            "decode_tok_s": decoded / st["decode_seconds"] if decoded > 0 and st["decode_seconds"] else 0.0,
            "proposed": st["draft_proposed"], "accepted": st["draft_accepted"], "steps": st["decode_steps"]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="GGUF file or HF directory (default: the default model)")
    ap.add_argument("--device", default="host")
    ap.add_argument("--draft-tokens", default="4", help="comma-separated")
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write the results here")
    a = ap.parse_args(argv)
    engine = metalkv.Engine.load(a.model, device=a.device)
    ks = [int(k) for k in a.draft_tokens.split(",")]
    rows, ok = [], True
    for name, prompt in prompts().items():
        one(engine, prompt, 8)  # warm-up (and the prompt's prefix blocks cached for every run alike)
        runs: dict[str, list[dict]] = {"plain": []} | {f"lookup k={k}": [] for k in ks}
        for _ in range(a.repeat):  # alternating, so drift in the machine's speed hits each alike
            runs["plain"].append(one(engine, prompt, a.max_tokens))
            for k in ks:
                runs[f"lookup k={k}"].append(one(engine, prompt, a.max_tokens, speculate="lookup", draft_tokens=k))
        base = statistics.median(r["decode_tok_s"] for r in runs["plain"])
        for mode, rs in runs.items():
            same = all(r["text"] == runs["plain"][0]["text"] for r in rs)
            ok = ok and same
            tok_s = statistics.median(r["decode_tok_s"] for r in rs)
            rows.append({"prompt": name, "mode": mode, "decode_tok_s": tok_s, "speedup": tok_s / base,
                         "wall_s": statistics.median(r["wall_s"] for r in rs), "generated": rs[0]["generated"],
                         "proposed": rs[0]["proposed"], "accepted": rs[0]["accepted"], "steps": rs[0]["steps"],
                         "same_text_as_plain": same, "runs": [{k: v for k, v in r.items() if k != "text"} for r in rs]})
    print(f"{engine.device.name}; {a.model or 'default model'}; greedy, up to {a.max_tokens} tokens, "
          f"median of {a.repeat}")
    print(f"{'prompt':<11}{'mode':<13}{'decode tok/s':>13}{'x plain':>9}{'call s':>8}{'tokens':>8}{'steps':>7}"
          f"{'accepted':>14}{'same':>6}")
    for r in rows:
        acc = f"{r['accepted']}/{r['proposed']}" if r["proposed"] else "-"
        print(f"{r['prompt']:<11}{r['mode']:<13}{r['decode_tok_s']:>13.1f}{r['speedup']:>9.2f}{r['wall_s']:>8.2f}"
              f"{r['generated']:>8}{r['steps']:>7}{acc:>14}{'yes' if r['same_text_as_plain'] else 'NO':>6}")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "date": datetime.date.today().isoformat(), "machine": platform.node(), "device": engine.device.name,
            "model": a.model or "default", "args": vars(a), "rows": rows}, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
