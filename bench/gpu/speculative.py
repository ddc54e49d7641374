#!/usr/bin/env python3
"""The mechanics of speculative decoding on a GPU: the Llama-3-8B shape, random weights
built so that acceptance is known, each speculating mode beside plain decode in the same
run (docs/SPECULATIVE.md "Measured on the H200").

    python bench/gpu/speculative.py [--json FILE]                # 8B target, 1B-shaped draft, on cuda
    python bench/gpu/speculative.py --device host --layers 2 --hidden 256 --heads 4 --kv-heads 2 \\
        --ffn 512 --vocab 1024 --draft-layers 1 --draft-hidden 128 --draft-ffn 256 --prompt 64 \\
        --new-tokens 24                                          # local smoke test on the CPU

Random weights cannot show acceptance: two random models never agree. So both models here
are *walks*: a fixed random permutation s of the vocabulary, and weights under which a
model's greedy id after x is s(x), whatever the context:
- the embedding rows are N(0, 1), the output matrix's row s(x) is x's embedding row, so
  the logit of s(x) is |e_x|^2 / rms(e_x) (about the hidden size) against N(0, hidden)
  for the others;
- every layer's matrices are N(0, --init-std) with a small std (0.002), so the residual
  stream stays close to the embedding while every layer does all its work.
Decode costs what it costs with any f16 weights of that shape (every matrix read, every
attention computed); only the values are chosen. The greedy reply is checked against the
walk (reported, not asserted).

Modes, each --repeat times alternating with plain decode (medians), greedy, --new-tokens
after a --prompt of random ids:
- plain: no speculation;
- lookup, no match: the walk of the reply is not in the prompt, so the lookup proposes
  nothing (its overhead);
- lookup, copy: the prompt ends with a walk's first ids after the whole walk earlier in the
  prompt; every proposal is right (the upper bound of lookup);
- lookup, edited copy: that earlier walk has one id in --edit-every replaced, as an edit of a
  quoted passage would;
- draft = the target: the 8B shape as its own draft (a second copy of the weights); every
  proposal right, so this is the verify step's upper bound with the draft's full cost;
- draft 1B: a Llama-3.2-1B-shaped walk with the same permutation (hidden 2048, 16 layers,
  32/8 heads of 64, ffn 8192; untied,
  as the walk needs: the same bytes per token as tied): every proposal right, so this is the cost per accepted
  token of a real small draft.
Each row: decode tok/s (ids after the first, over the decode seconds), its ratio to plain in
the same engine, decode steps, proposals accepted, the time per step, and whether the ids
equal plain decode's (they must: greedy speculation is exact).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import LLAMA3_1B, LLAMA3_8B, add_shape_args, device_name, log  # noqa: E402
from engine import build_model, save_model, weight_fingerprint  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="metalkv device (cuda, or host for the smoke test)")
    add_shape_args(ap, LLAMA3_8B)
    ap.add_argument("--vocab", type=int, default=128256)
    add_shape_args(ap, LLAMA3_1B, prefix="draft-")  # the draft's shape (default Llama-3.2-1B's)
    ap.add_argument("--init-std", type=float, default=0.002, help="std of the layers' random weights")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt", type=int, default=512, help="prompt length in ids (default 512)")
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--draft-tokens", default="4,8", help="comma-separated k (default 4,8)")
    ap.add_argument("--edit-every", type=int, default=16, help="lookup, edited copy: one id in N differs")
    ap.add_argument("--prefill-chunk", type=int, default=512)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", help="write everything here")
    return ap.parse_args(argv)


# ---- the walk models --------------------------------------------------------------
def shape_args(a, draft: bool) -> SimpleNamespace:
    p = "draft_" if draft else ""
    return SimpleNamespace(layers=getattr(a, p + "layers"), hidden=getattr(a, p + "hidden"),
                           heads=getattr(a, p + "heads"), kv_heads=getattr(a, p + "kv_heads"),
                           ffn=getattr(a, p + "ffn"), vocab=a.vocab, tied=False, init_std=a.init_std,
                           seed=a.seed + (1 if draft else 0))


def walk_model(a, perm: np.ndarray, draft: bool, tdev: str) -> Path:
    """Builds and saves the walk model of that shape (the module doc); its directory."""
    import torch

    s = shape_args(a, draft)
    model = build_model(s, tdev)
    g = torch.Generator(device=tdev).manual_seed(s.seed + 100)
    emb = model.model.embed_tokens.weight
    with torch.no_grad():
        emb.copy_(torch.randn(emb.shape, generator=g, device=tdev, dtype=torch.float32).to(emb.dtype))
        # output row perm[x] = embedding row x
        model.lm_head.weight[torch.as_tensor(perm, device=tdev)] = emb
    name = f"l{s.layers}_h{s.hidden}_q{s.heads}_kv{s.kv_heads}_f{s.ffn}_v{s.vocab}"
    path = Path(f"/tmp/metalkv-walk-{name}-s{s.seed}")
    path.mkdir(parents=True, exist_ok=True)
    probe = torch.tensor([perm[:16].tolist()], device=tdev)  # the model's greedy id after each of these
    with torch.inference_mode():
        nxt = model(probe).logits.argmax(-1)[0].cpu().numpy()
    walks = float(np.mean(nxt == perm[perm[:16]]))
    save_s = save_model(model, path, weight_fingerprint(model))
    log(f"walk model {name}: greedy follows the walk at {walks:.0%} of 16 probes (transformers); saved in {save_s:.1f} s")
    del model
    if tdev == "cuda":
        torch.cuda.empty_cache()
    return path


def walk(perm: np.ndarray, x: int, n: int) -> list[int]:
    out = []
    for _ in range(n):
        x = int(perm[x])
        out.append(x)
    return out


def prompts(a, perm: np.ndarray) -> dict[str, list[int]]:
    rng = np.random.default_rng(a.seed)
    body = rng.integers(0, a.vocab, size=a.prompt).tolist()
    x0 = int(rng.integers(0, a.vocab))
    copy = [x0] + walk(perm, x0, a.new_tokens + 16)      # the passage the reply will follow
    edited = list(copy)
    for i in range(a.edit_every // 2, len(edited), a.edit_every):
        edited[i] = int(rng.integers(0, a.vocab))
    head = copy[:4]                                        # the reply continues the passage after these
    n = a.prompt - len(copy) - len(head)
    return {"random": body,
            "copy": body[:n] + copy + head,
            "edited copy": body[:n] + edited + head}


# ---- runs -----------------------------------------------------------------------------
def run(eng, ids: list[int], a, **kw) -> dict:
    out = eng.generate_ids(ids, stop_ids=(), max_tokens=a.new_tokens, temperature=0.0, **kw)
    st = dict(eng.last_stats)
    steps = st["decode_steps"]
    return {"ids": list(out), "decode_tok_s": st["decode_tok_s"], "decode_s": st["decode_seconds"], "steps": steps,
            "ms_per_step": 1e3 * st["decode_seconds"] / steps if steps else 0.0,
            "proposed": st["draft_proposed"], "accepted": st["draft_accepted"]}


def measure(eng, modes: dict, a) -> list[dict]:
    """modes: name -> (prompt ids, generate kwargs); 'plain' first. Alternating repeats, medians."""
    for ids, kw in modes.values():
        eng.generate_ids(ids[:64], stop_ids=(), max_tokens=8, temperature=0.0, **kw)  # warm-up (graphs, draft cache)
    runs: dict[str, list[dict]] = {m: [] for m in modes}
    for _ in range(a.repeat):
        for m, (ids, kw) in modes.items():
            runs[m].append(run(eng, ids, a, **kw))
    plain = {}  # per prompt: plain decode's median tok/s and ids
    rows = []
    for m, rs in runs.items():
        ids, kw = modes[m]
        key = tuple(ids)
        tok_s = statistics.median(r["decode_tok_s"] for r in rs)
        if not kw:
            plain[key] = (tok_s, rs[0]["ids"])
        base_tok_s, base_ids = plain.get(key, (0.0, None))
        rows.append({"mode": m, "decode_tok_s": tok_s, "x_plain": tok_s / base_tok_s if base_tok_s else None,
                     "steps": rs[0]["steps"], "ms_per_step": statistics.median(r["ms_per_step"] for r in rs),
                     "proposed": rs[0]["proposed"], "accepted": rs[0]["accepted"],
                     "same_ids_as_plain": base_ids is not None and all(r["ids"] == base_ids for r in rs),
                     "runs": [{k: v for k, v in r.items() if k != "ids"} for r in rs]})
        log(f"  {m}: {tok_s:.1f} tok/s, {rows[-1]['accepted']}/{rows[-1]['proposed']} accepted")
    return rows


def main(argv=None) -> int:
    a = parse_args(argv)
    import torch

    import metalkv

    t_start = time.perf_counter()
    tdev = "cuda" if a.device != "host" else "cpu"
    perm = np.random.default_rng(a.seed + 7).permutation(a.vocab)
    target = walk_model(a, perm, False, tdev)
    draft = walk_model(a, perm, True, tdev)
    ps = prompts(a, perm)
    ks = [int(k) for k in a.draft_tokens.split(",")]
    res = {"device": device_name(tdev), "torch": torch.__version__, "metalkv": metalkv.__version__,
           "args": vars(a), "date": time.strftime("%Y-%m-%d"), "engines": []}
    follows = None
    context = a.prompt + a.new_tokens + 32
    for label, draft_dir in (("draft = the target (a second copy)", target), ("draft 1B-shaped", draft)):
        t0 = time.perf_counter()
        eng = metalkv.Engine.load(str(target), device=a.device, context=context, prefill_chunk=a.prefill_chunk,
                                  progress=False, draft=str(draft_dir))
        log(f"{label}: loaded in {time.perf_counter() - t0:.1f} s on {eng.device.name}")
        modes = {"plain": (ps["random"], {})}
        if draft_dir is target:  # the lookup modes once (they do not use the draft)
            modes |= {"plain, copy prompt": (ps["copy"], {}), "plain, edited copy prompt": (ps["edited copy"], {})}
            for k in ks:
                modes |= {f"lookup k={k}, no match": (ps["random"], dict(speculate="lookup", draft_tokens=k)),
                          f"lookup k={k}, copy": (ps["copy"], dict(speculate="lookup", draft_tokens=k)),
                          f"lookup k={k}, edited copy": (ps["edited copy"], dict(speculate="lookup", draft_tokens=k))}
        for k in ks:
            modes[f"{label.split(' (')[0]} k={k}"] = (ps["random"], dict(speculate="draft", draft_tokens=k))
        rows = measure(eng, modes, a)
        if follows is None:
            ids = eng.generate_ids(ps["random"], stop_ids=(), max_tokens=a.new_tokens, temperature=0.0)
            follows = float(np.mean(np.array(ids) == np.array(walk(perm, ps["random"][-1], len(ids)))))
        res["engines"].append({"label": label, "rows": rows})
        del eng
    res["reply_follows_walk"] = follows
    res["seconds"] = time.perf_counter() - t_start
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    print(f"{res['device']}; target l{a.layers} h{a.hidden} ffn{a.ffn} v{a.vocab}; draft l{a.draft_layers} "
          f"h{a.draft_hidden}; prompt {a.prompt}, {a.new_tokens} new ids, greedy, median of {a.repeat}; "
          f"plain reply follows the walk: {follows:.0%}")
    print(f"{'mode':<36}{'tok/s':>9}{'x plain':>9}{'steps':>7}{'ms/step':>9}{'accepted':>11}{'same ids':>10}")
    for e in res["engines"]:
        for r in e["rows"]:
            acc = f"{r['accepted']}/{r['proposed']}" if r["proposed"] else "-"
            x = f"{r['x_plain']:.2f}" if r["x_plain"] else "-"
            print(f"{r['mode']:<36}{r['decode_tok_s']:>9.1f}{x:>9}{r['steps']:>7}{r['ms_per_step']:>9.2f}{acc:>11}"
                  f"{'yes' if r['same_ids_as_plain'] else 'NO':>10}")
    ok = all(r["same_ids_as_plain"] for e in res["engines"] for r in e["rows"])
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
