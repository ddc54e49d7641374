import json, metalkv
from metalkv.ppl import score, text_ids, format_table
eng = metalkv.Engine.load(None, kv_memory=None, context=2049, progress=False)
ids = text_ids(eng, "../shared/data/pride_and_prejudice.txt", 2048)
res = score(eng, ids, {"q4/q4 rot": dict(kv_k="q4", kv_v="q4", kv_rotate=True),
                       "q4/q4 rot r128": dict(kv_k="q4", kv_v="q4", kv_rotate=True, kv_residual=128),
                       "q2/q2 rot r128": dict(kv_k="q2", kv_v="q2", kv_rotate=True, kv_residual=128)}, chunk=16)
print(format_table(res))
print(json.dumps([r.row() for r in res], indent=1))
