"""metalkv against transformers (torch, CPU, float32) on tiny random-weight models
built offline from configs (tests/engine/tiny_hf.py): Llama (GQA, untied), Llama
(tied, llama3 rope), Qwen2 (q/k/v bias; one with YaRN), Qwen3 (q/k norms), Mistral (a sliding
window on every layer), Phi-3 (fused qkv and gate_up; one with partial rotary
and a window, one with LongRoPE), Gemma 2 (alternating windows, attention and final logit
soft-capping), Gemma3 text (sliding window 8 < the sequences, per-type rope
base, QK-norm, query_pre_attn_scalar, GeGLU, embedding scale; one variant with
linear rope scaling on the full layers); and one Llama per head size in
tiny_hf.HEAD_DIMS (32, 80, 96, 112, 160, 192: the attention kernels' sizes
beside 64, 128 and 256, which the models above use).

Tolerances. Both sides use the same weights (exact in f16), activations in
float32. What differs by design: metalkv stores K (after QK-norm and rope) and V
in float16, relative rounding error u = 2**-11 per element. Per sequence:
- z16: transformers in float64 with K/V rounded to f16 the same way (tiny_hf's
  f16kv attention): the exact answer to what metalkv computes.
- KV_EFFECT = z16 - z32 (z32: plain float32 transformers): what f16 K/V storage
  does to the logits, ~5e-4 rms, ~3e-3 max here.
- FLOOR = (the same f16-K/V model in float32) - z16: what float32 costs
  transformers. It is not ~1e-7 relative summation noise: a K/V element whose
  float32 value is off by a relative d rounds to the neighbouring half with odds
  ~d/u, and those flips (one half ulp each, on a fraction p of the elements)
  dominate; against the full rounding (uniform in +-ulp/2 on every element) their
  rms is ~sqrt(12 p). One sequence gives one sample of a random quantity (FLOOR's
  rms varies 5x between prompts), so the bound takes the larger of two scales:
      TIGHT = max(0.5 * KV_EFFECT, 2 * FLOOR), on the rms and on the max |.|.
  0.5 * KV_EFFECT is p ~ 2%: a K/V relative error before rounding of ~1e-5
  (~80 float32 ulps), what a few layers of float32 produce; 2 * FLOOR covers
  models where transformers' own float32 is noisier than that (gemma3: QK-norm,
  sqrt(hidden) embedding scale, 7 layers). Every engine output (any prefill
  chunk, any split of the sequence over a cache) must be within TIGHT of z16. A
  K or V not rounded to f16 (engine ~ z32) misses by ~KV_EFFECT > TIGHT.
- Against z32 an a-priori first-order estimate: rounding k moves a score s by
  ~u * |s| (random signs), softmax turns score changes into relative weight
  changes of at most twice the largest, rounding v adds u * max|v|: per layer the
  attention output moves by <= (2 S + 1) u relative, S = max |score| (4.0-6.3 on
  these models; S = 8 taken). Residual stream and norms carry that with gain <~ 1
  and the lm_head turns it into the same relative logit error:
  LOOSE = (2 S + 1) * u * n_layers * max|z32|. (max KV_EFFECT is 20-100x below
  it, asserted, so the estimate is checked; TIGHT is the test with teeth.)
- argmax: equal to z32's wherever its top-2 margin exceeds
  CLEAR = 2 * (TIGHT + KV_EFFECT) (maxima), the most the engine can move either logit;
  greedy decoding is required to match only on prompts whose every step is clear.
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import metalkv  # noqa: E402
from metalkv.models import load_model  # noqa: E402

from . import tiny_hf  # noqa: E402
from devices import TEST_DEVICE  # tests/ is on sys.path

U = 2.0 ** -11          # float16 unit roundoff (round to nearest)
S_MAX = 8.0             # bound on |attention score| (measured max 6.3), for LOOSE
N_PROMPT = 40           # > 4 sliding windows of 8: the rings wrap several times
N_GREEDY = 32
CONTEXT = 128           # a small cache: the tiny models never need more
PROMPT_SEEDS = range(20)  # greedy: the first prompt whose reference margins are clear


def prompt(name: str, seed: int = 0) -> list[int]:
    vocab = tiny_hf.SPECS[name]["vocab_size"]
    return np.random.default_rng([seed, sum(map(ord, name))]).integers(0, vocab, N_PROMPT).tolist()


@pytest.fixture(scope="session")
def refs(tmp_path_factory):
    return tiny_hf.build_all(tmp_path_factory.mktemp("tiny_hf"), tiny_hf.NAMES + tiny_hf.HEAD_DIM_NAMES)


@pytest.fixture(scope="module")
def engines(refs):
    """engines(name, prefill_chunk=128): one Engine per (model, chunk), loaded once."""
    cache = {}

    def get(name: str, prefill_chunk: int = 128) -> metalkv.Engine:
        key = (name, prefill_chunk)
        if key not in cache:
            cache[key] = metalkv.Engine.load(refs[name].path, device=TEST_DEVICE, context=CONTEXT,
                                             prefill_chunk=prefill_chunk, progress=False)
        return cache[key]

    return get


def rms(a: np.ndarray) -> float:
    return float(np.sqrt(np.mean(np.square(a))))


class Bounds:
    """Reference logits of one sequence and the tolerances derived from them."""

    def __init__(self, ref: tiny_hf.Reference, ids: list[int]):
        self.z32 = ref.logits(ids)
        self.z16 = ref.logits(ids, f16_kv=True, float64=True)
        floor = ref.logits(ids, f16_kv=True) - self.z16
        kv = self.z16 - self.z32
        self.scale = float(np.abs(self.z32).max())
        self.kv_effect = float(np.abs(kv).max())
        self.tight = max(0.5 * self.kv_effect, 2 * float(np.abs(floor).max()))
        self.tight_rms = max(0.5 * rms(kv), 2 * rms(floor))
        n_layers = tiny_hf.SPECS[ref.name]["num_hidden_layers"]
        self.loose = (2 * S_MAX + 1) * U * n_layers * self.scale
        self.clear_margin = 2 * (self.tight + self.kv_effect)

    def check_tight(self, got: np.ndarray, what: str) -> None:
        d = np.abs(got - self.z16)
        msg = (f"{what} vs transformers with f16 K/V (float64): {{}} (f16 K/V itself moves logits by "
               f"{self.kv_effect:.3g} max, logit scale {self.scale:.3g})")
        assert rms(d) <= self.tight_rms, msg.format(f"rms {rms(d):.3g} > {self.tight_rms:.3g}")
        assert d.max() <= self.tight, msg.format(f"{where(d)} > {self.tight:.3g}")


@pytest.fixture(scope="module")
def bounds(refs):
    memo = {}

    def get(name: str) -> Bounds:
        if name not in memo:
            memo[name] = Bounds(refs[name], prompt(name))
        return memo[name]

    return get


def where(diff: np.ndarray) -> str:
    """Where the largest difference is, for failure messages."""
    row, col = np.unravel_index(int(np.argmax(diff)), diff.shape)
    return f"max {diff.max():.3g} at position {row}, token {col}"


# ---- config ------------------------------------------------------------------------

_ARCH = {"llama": "llama", "qwen2": "llama", "mistral": "llama", "qwen3": "qwen3", "phi3": "phi3",
         "gemma2": "gemma2", "gemma3_text": "gemma3"}


def expected_config(name: str) -> dict:
    """What ModelConfig must say, written from the spec by hand."""
    s = tiny_hf.SPECS[name]
    mt = s["model_type"]
    gemma = mt.startswith("gemma")
    rp = s["rope_parameters"]
    full = rp["full_attention"] if mt == "gemma3_text" else rp
    scaling = {k: v for k, v in full.items() if k not in ("rope_type", "rope_theta", "partial_rotary_factor")}
    if full["rope_type"] != "default":
        scaling["type"] = full["rope_type"]
    if full["rope_type"] == "longrope":
        scaling.update(short_factor=tuple(full["short_factor"]), long_factor=tuple(full["long_factor"]),
                       original_max_position_embeddings=s["original_max_position_embeddings"])
    if full["rope_type"] == "yarn":  # transformers' defaults for the keys the spec leaves out
        scaling = {"beta_fast": 32.0, "beta_slow": 1.0, "truncate": True,
                   "attention_factor": pytest.approx(1 + 0.1 * np.log(full["factor"])), **scaling}
    head_dim = s.get("head_dim") or s["hidden_size"] // s["num_attention_heads"]
    partial = full.get("partial_rotary_factor", 1.0)
    n = s["num_hidden_layers"]
    if mt == "gemma3_text":
        types = tuple(t.split("_")[0] for t in s["layer_types"])
    elif mt == "gemma2":  # transformers' default: even layers slide
        types = tuple("sliding" if i % 2 == 0 else "full" for i in range(n))
    elif mt in ("mistral", "phi3") and s.get("sliding_window"):
        types = ("sliding",) * n
    else:
        types = ()
    e = dict(
        arch=_ARCH[mt], n_layers=n, hidden=s["hidden_size"],
        n_heads=s["num_attention_heads"], n_kv_heads=s["num_key_value_heads"], head_dim=head_dim,
        rotary_dim=int(head_dim * partial) if partial != 1.0 else None,
        ffn_hidden=s["intermediate_size"], vocab=s["vocab_size"], rms_eps=s["rms_norm_eps"],
        rope_theta=full["rope_theta"], rope_scaling=scaling or None, rope_style="neox",
        tie_embeddings=s.get("tie_word_embeddings", True),
        attn_bias=mt == "qwen2", hidden_act="gelu_tanh" if gemma else "silu",
        eos_ids=(), bos_id=None, context_length=s["max_position_embeddings"], layer_types=types,
        sliding_window=s["sliding_window"] if types else None,
        attn_logit_softcap=s.get("attn_logit_softcapping"), final_logit_softcap=s.get("final_logit_softcapping"))
    if gemma:
        e.update(query_pre_attn_scalar=s["query_pre_attn_scalar"],
                 rope_local_base_freq=rp["sliding_attention"]["rope_theta"] if mt == "gemma3_text" else None,
                 embedding_scale=pytest.approx(s["hidden_size"] ** 0.5), norm_weight_offset=1.0)
    else:
        e.update(query_pre_attn_scalar=None, embedding_scale=1.0, norm_weight_offset=0.0,
                 rope_local_base_freq=None)
    return e


@pytest.mark.parametrize("name", tiny_hf.NAMES)
def test_config_from_transformers_5(refs, name):
    """load_model reads the config.json transformers 5 wrote (rope_parameters, per
    layer type for gemma3; layer_types; tie_word_embeddings)."""
    cfg = load_model(refs[name].path, progress=False).config
    got = {k: getattr(cfg, k) for k in expected_config(name)}
    if set(cfg.layer_types) == {"full"}:  # transformers 5 writes them for qwen2/3: the same as none
        got["layer_types"] = ()
    assert got == expected_config(name)
    assert cfg.source_format == "safetensors"


def test_config_gemma3_multimodal_nesting():
    """Gemma3ForConditionalGeneration's config.json nests the text model's config;
    transformers 5 keeps its rope_parameters per layer type in there."""
    from metalkv.models.hf_config import config_from_hf

    text = tiny_hf.hf_config("gemma3_linear").to_dict()
    c = transformers.Gemma3Config(text_config=text).to_dict()
    assert "rope_parameters" in c["text_config"]
    cfg = config_from_hf(c, "gemma3-mm")
    e = expected_config("gemma3_linear")
    assert {k: getattr(cfg, k) for k in e} == e


# ---- logits --------------------------------------------------------------------------

@pytest.mark.parametrize("name", tiny_hf.NAMES)
def test_logits_every_position(engines, bounds, name):
    b = bounds(name)
    got = engines(name).logits(prompt(name))
    assert got.shape == b.z32.shape and got.dtype == np.float32
    assert b.kv_effect < b.loose, "the first-order estimate of f16 K/V's effect does not hold"
    assert b.tight < b.kv_effect, "float32 noise hides the f16 K/V rounding: TIGHT would not see it"
    b.check_tight(got, "engine")
    d32 = np.abs(got - b.z32)
    assert d32.max() <= b.loose, f"engine vs transformers float32: {where(d32)} > {b.loose:.3g}"
    ref_sorted = np.sort(b.z32, axis=1)
    clear = ref_sorted[:, -1] - ref_sorted[:, -2] > b.clear_margin
    assert clear.sum() >= N_PROMPT // 2, "too few rows with a clear argmax to test it"
    np.testing.assert_array_equal(got[clear].argmax(1), b.z32[clear].argmax(1))


# ---- greedy decoding -----------------------------------------------------------------

def clear_greedy_case(ref, name: str):
    """(prompt, transformers' greedy tokens, bounds) for the first prompt seed whose every
    greedy step has a top-2 margin > 2 * (TIGHT + kv_effect) over the whole trajectory:
    only then is 'identical tokens' a fair requirement. The search reads only the reference."""
    tried = []
    for seed in PROMPT_SEEDS:
        ids = prompt(name, seed)
        toks, margins = ref.greedy(ids, N_GREEDY)
        b = Bounds(ref, ids + toks[:-1])
        tried.append(float(margins.min() / b.clear_margin))
        if margins.min() > b.clear_margin:
            # generate's tokens (through its cache) are the argmax of one full forward
            assert b.z32[N_PROMPT - 1:].argmax(1).tolist() == toks
            return ids, toks, b
    pytest.fail(f"{name}: no prompt among seeds {list(PROMPT_SEEDS)} has greedy margins above the f16-K/V "
                f"bound (best margin/bound {max(tried):.2f}); greedy equality would be luck")


@pytest.fixture(scope="module")
def greedy_case(refs):
    """clear_greedy_case per model, memoized."""
    memo = {}

    def get(name: str):
        if name not in memo:
            memo[name] = clear_greedy_case(refs[name], name)
        return memo[name]

    return get


@pytest.mark.parametrize("chunk", [128, 5])
@pytest.mark.parametrize("name", tiny_hf.NAMES)
def test_greedy_matches_generate(engines, greedy_case, name, chunk):
    ids, want, b = greedy_case(name)
    got = engines(name, prefill_chunk=chunk).generate_ids(ids, max_tokens=N_GREEDY, stop_ids=())
    if got != want:
        step = next(i for i, (g, w) in enumerate(zip(got + [-1] * N_GREEDY, want)) if g != w)
        row = b.z32[N_PROMPT - 1 + step]
        pytest.fail(f"greedy differs from step {step}: engine {got[step:step + 4]}, transformers "
                    f"{want[step:step + 4]}; reference logits there {row[want[step]]:.4f} (its pick) vs "
                    f"{row[got[step]] if 0 <= got[step] < len(row) else float('nan'):.4f} (engine's)")


# ---- the cache: pieces and chunks -----------------------------------------------------

# prefill, a 1-token decode, a chunk longer than the window, a decode, the rest
SPLITS = (11, 12, 29, 30)


@pytest.mark.parametrize("store", ["compute", "blit"])
@pytest.mark.parametrize("name", tiny_hf.NAMES)
def test_decode_through_cache_equals_prefill(engines, bounds, name, store):
    eng, ids, b = engines(name), prompt(name), bounds(name)
    whole = eng.logits(ids)
    c = eng.new_cache(store=store)
    edges = (0,) + SPLITS + (len(ids),)
    pieces = [eng.logits(ids[lo:hi], cache=c) for lo, hi in zip(edges, edges[1:])]
    got = np.concatenate(pieces)
    assert got.shape == whole.shape
    # the kernels differ (decode vs prefill attention, gemv vs gemm), so float32
    # order differs and some halves round the other way: each within TIGHT of z16
    b.check_tight(whole, "one call")
    b.check_tight(got, f"pieces {edges} ({store} store)")


# 1: every token through decode attention; 5, 13: not dividing 40; 8: the window
@pytest.mark.parametrize("chunk", [1, 5, 8, 13])
@pytest.mark.parametrize("name", tiny_hf.NAMES)
def test_chunked_prefill(engines, bounds, name, chunk):
    ids, b = prompt(name), bounds(name)
    b.check_tight(engines(name, prefill_chunk=chunk).logits(ids), f"prefill_chunk={chunk}")


# ---- LongRoPE's two factor sets ----------------------------------------------------------

def test_longrope_short_factors(refs, engines):
    """Within original_max_position_embeddings transformers runs the short factors, and
    so does metalkv for a cache that holds no more (logits() sizes its cache to the ids);
    a larger cache takes the long factors for every position (llama.cpp's rule), which
    the 40-token tests above compare with transformers."""
    name = "phi3_longrope"
    ids = prompt(name)[:tiny_hf.SPECS[name]["original_max_position_embeddings"]]
    b = Bounds(refs[name], ids)
    eng = engines(name)
    b.check_tight(eng.logits(ids), f"{len(ids)} tokens, short factors")
    longer = eng.logits(ids, cache=eng.new_cache())  # CONTEXT = 128 tokens: the long factors
    assert np.abs(longer - b.z16).max() > 10 * b.tight, "a cache of 128 tokens did not switch to the long factors"


# ---- every head size the attention kernels take -----------------------------------

@pytest.mark.parametrize("name", tiny_hf.HEAD_DIM_NAMES)
def test_head_dim_parity(refs, bounds, greedy_case, name):
    """Logits at every position, greedy decoding through prefill chunks of 5 and a cache
    fed in pieces, for each head size the models above do not use (Llama layers, GQA 4/2)."""
    eng = metalkv.Engine.load(refs[name].path, device=TEST_DEVICE, context=CONTEXT, prefill_chunk=5, progress=False)
    ids, b = prompt(name), bounds(name)
    b.check_tight(eng.logits(ids), f"head_dim {tiny_hf.SPECS[name]['head_dim']}")
    c = eng.new_cache()
    edges = (0,) + SPLITS + (len(ids),)
    b.check_tight(np.concatenate([eng.logits(ids[lo:hi], cache=c) for lo, hi in zip(edges, edges[1:])]),
                  f"pieces {edges}")
    g_ids, want, _ = greedy_case(name)
    assert eng.generate_ids(g_ids, max_tokens=N_GREEDY, stop_ids=()) == want


def test_head_dims_cover_the_kernels():
    """Every head size the attention kernels take has a transformers parity model."""
    used = {s.get("head_dim", s["hidden_size"] // s["num_attention_heads"]) for s in tiny_hf.SPECS.values()}
    assert set(metalkv._core.ops.attention_head_dims()) <= used, sorted(used)
