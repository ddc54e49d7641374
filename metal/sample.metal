// Token sampling on the device: one threadgroup of kThreads threads per row.
//
// No sort: top-k and top-p thresholds are found by searching the
// order-preserving integer key of a float, kSamplePivots keys tested a pass
// over the row (sample_search: at most 11 passes each, where bisection took
// 32), whatever k is. Tokens tied with the threshold are all kept.
//
// Two shapes (ops/sample.cpp picks): sample_f32, 1024 threads, for GPUs; and
// sample_f32_simd, one SIMD-group, where lanes are fibers (the host executor):
// each search pass's two threadgroup barriers there switch through every
// thread, and 1024 threads made top-k or top-p cost ~17 ms a token.
#include "mkv_kernel.h"
#include "sample_params.h"

// Monotonic map float -> uint: a < b  <=>  key(a) < key(b).
inline uint order_key(float x) {
  const uint bits = as_type<uint>(x);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// Threadgroup-wide sum / max through one slot per SIMD-group.
template <uint kSimds>
inline float group_sum(float v, threadgroup float* slots, uint simd, uint lane) {
  v = simd_sum(v);
  if (lane == 0) slots[simd] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const float total = simd_sum(lane < kSimds ? slots[lane] : 0.0f);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return total;
}
template <uint kSimds>
inline float group_max(float v, threadgroup float* slots, uint simd, uint lane) {
  v = simd_max(v);
  if (lane == 0) slots[simd] = v;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const float m = simd_max(lane < kSimds ? slots[lane] : -INFINITY);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return m;
}

// The threshold searches: the largest key t in [a, b] with pred(t), given
// pred(a). pred(t): the count (kMass false) or the mass exp(x - m) (kMass
// true) of the row's x with key(x) >= t is at least want. A pass tests P keys
// spread over [a, b] at once and keeps the part between the last that passes
// and the first that fails, ceil(span / (P + 1)) of it: 32 bits take 11
// passes at P = 8, 32 at P = 1 (bisection). An x below every pivot adds
// nothing and costs no exp. The sums are each thread's in index order, then
// the SIMD-group's and the threadgroup's, so pred is monotone in t as
// computed (rounding is monotone, and a larger t only drops terms) and every
// P finds the same t.

// Pivots a pass (on this host, 2026-12-07: top-k at 262,144 logits 10 ms a
// call at 8, 10-13 at 4 and 16; bench/sampler.py).
constant constexpr uint kSamplePivots = 8;

template <uint kSimds, uint P, bool kMass>
inline uint sample_search(const device float* work, uint vocab, uint first, uint stride, uint a, uint b, float m,
                          float want, threadgroup float* slots,  // (P * kSimds)
                          uint simd, uint lane) {
  while (a < b) {
    const ulong span = ulong(b - a) + 1;
    uint piv[P];  // nondecreasing, in (a, b]
    MKV_UNROLL for (uint j = 0; j < P; ++j) piv[j] = a + uint(min((ulong(j + 1) * span + P) / (P + 1), span - 1));
    float c[P];
    MKV_UNROLL for (uint j = 0; j < P; ++j) c[j] = 0.0f;
    for (uint i = first; i < vocab; i += stride) {
      const float x = work[i];
      const uint key = order_key(x);
      if (key < piv[0]) continue;
      const float w = kMass ? exp(x - m) : 1.0f;
      MKV_UNROLL for (uint j = 0; j < P; ++j) c[j] += key >= piv[j] ? w : 0.0f;
    }
    MKV_UNROLL for (uint j = 0; j < P; ++j) {
      c[j] = simd_sum(c[j]);
      if (lane == 0) slots[j * kSimds + simd] = c[j];
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    MKV_UNROLL for (uint j = 0; j < P; ++j) c[j] = simd_sum(lane < kSimds ? slots[j * kSimds + lane] : 0.0f);
    threadgroup_barrier(mem_flags::mem_threadgroup);  // before the next pass writes slots
    uint next_a = a, next_b = b;
    for (uint j = 0; j < P; ++j) {
      if (!(c[j] >= want)) {  // pred falls as t rises: every later pivot fails too
        next_b = piv[j] - 1;
        break;
      }
      next_a = piv[j];
    }
    a = next_a;
    b = next_b;
  }
  return a;
}

// The draw's walk, by one SIMD-group, over the chunk masses (kThreads
// chunks of `chunk` tokens, the draft's mass left out): lane l takes chunks
// l S .. l S + S - 1 (S = kThreads / 32); the prefix sum over the lanes finds
// the lane, its serial walk the chunk, and the chunk's tokens, cut into 32
// runs, the token the same way. Every lane returns the pick (or the draft).
// Where rounding leaves the target past what the sums reach: the last kept
// token of the run (or of the row) that fell short.
template <uint kThreads>
inline uint sample_walk(constant mkv_params::Sample& p, const device float* work, threadgroup const float* chunk_sums,
                        uint chunk, uint lo, float m, uint d, float dmass, uint lane) {
  constexpr uint S = kThreads / 32;
  constexpr uint kNone = 0xffffffffu;
  float lane_sum = 0.0f;
  for (uint s = 0; s < S; ++s) lane_sum += chunk_sums[lane * S + s];
  const float before = simd_prefix_exclusive_sum(lane_sum);
  const float rest = simd_broadcast(before + lane_sum, ushort(31));
  if (dmass > 0.0f && p.accept * (rest + dmass) < dmass) return d;
  const float target = p.uniform * rest;
  const uint at = simd_min(before + lane_sum > target ? lane : 32u);
  uint pick = kNone;
  if (at < 32) {
    // Lane `at`'s chunks, walked by every lane alike: the chunk and the mass before it.
    float acc = simd_shuffle(before, ushort(at));
    uint t = at * S;
    for (; t + 1 < (at + 1) * S && acc + chunk_sums[t] <= target; ++t) acc += chunk_sums[t];
    const uint b0 = min(t * chunk, p.vocab), e0 = min(b0 + chunk, p.vocab), run = (chunk + 31) / 32;
    const uint rb = min(b0 + lane * run, e0), re = min(rb + run, e0);
    float part = 0.0f;
    for (uint i = rb; i < re; ++i)
      if (order_key(work[i]) >= lo && i != d) part += exp(work[i] - m);
    const float pre = acc + simd_prefix_exclusive_sum(part);
    const uint holder = simd_min(pre + part > target ? lane : 32u);
    if (lane == holder) {
      float a = pre;
      uint last = kNone;
      for (uint i = rb; i < re && pick == kNone; ++i) {
        if (order_key(work[i]) < lo || i == d) continue;
        last = i;
        a += exp(work[i] - m);
        if (a > target) pick = i;
      }
      if (pick == kNone) pick = last;  // (rounding: the run's sum passed the target, its steps did not)
    }
    pick = simd_min(pick);
  }
  if (pick == kNone) {  // rounding left the target at the very end: the row's last kept token
    uint found = 0;       // a lane's last kept token + 1, over ids lane, lane + 32, ...
    for (uint i = lane; i < p.vocab; i += 32)
      if (order_key(work[i]) >= lo && i != d) found = i + 1;
    found = simd_max(found);
    pick = found == 0 ? kNone : found - 1;
  }
  return pick;
}

template <uint kThreads>
kernel void sample_f32(constant mkv_params::Sample& p [[buffer(0)]],
                       const device float* logits [[buffer(1)]],        // (vocab)
                       const device uint* penalty_ids [[buffer(2)]],    // (n_penalty_ids)
                       device float* work [[buffer(3)]],                // (vocab) scratch
                       device uint* token [[buffer(4)]],                // (1) result
                       const device uint2* counted [[buffer(5)]],       // (n_counted) (id, count)
                       const device uint* extra [[buffer(6)]],          // (n_extra) ids counted once more each
                       const device uint* mask [[buffer(7)]],           // (ceil(vocab / 32)) allowed ids' bits
                       const device uint2* bias [[buffer(8)]],          // (n_bias) (id, float bits)
                       uint tid [[thread_index_in_threadgroup]],
                       uint simd [[simdgroup_index_in_threadgroup]],
                       uint lane [[thread_index_in_simdgroup]]) {
  constexpr uint kSimds = kThreads / 32;
  static_assert(kThreads >= mkv_params::kSampleMaxExtra, "one lane clears each extra id's flag");
  threadgroup float slots[kSimds];
  threadgroup float search_slots[kSamplePivots * kSimds];
  threadgroup float best_value[kSimds];
  threadgroup uint best_index[kSimds];
  threadgroup float chunk_sums[kThreads];
  threadgroup uint extra_counted[mkv_params::kSampleMaxExtra];  // extra[x]'s id is in `counted`

  // 1. Repetition penalty (transformers: divide positive logits, multiply
  //    negative ones); applying it twice to a repeated id writes the same value.
  for (uint i = tid; i < p.vocab; i += kThreads) work[i] = logits[i];
  threadgroup_barrier(mem_flags::mem_device);
  if (p.repetition_penalty != 1.0f) {
    for (uint j = tid; j < p.n_penalty_ids; j += kThreads) {
      const uint id = penalty_ids[j];
      if (id < p.vocab) {
        const float x = logits[id];
        work[id] = x > 0.0f ? x / p.repetition_penalty : x * p.repetition_penalty;
      }
    }
  }
  threadgroup_barrier(mem_flags::mem_device);

  // 1b. Presence and frequency penalties (OpenAI's) over what this call
  //     generated, on top of the repetition penalty; each id comes once in
  //     `counted`, so no two threads write one logit. The extra ids add to
  //     their pair's count; those `counted` lacks get theirs from thread 0,
  //     once per id, with all its occurrences.
  if (p.n_counted > 0 || p.n_extra > 0) {
    if (tid < p.n_extra) extra_counted[tid] = 0;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint j = tid; j < p.n_counted; j += kThreads) {
      const uint2 c = counted[j];
      uint n = c.y;
      for (uint x = 0; x < p.n_extra; ++x)
        if (extra[x] == c.x) {
          ++n;
          extra_counted[x] = 1;
        }
      if (c.x < p.vocab && n > 0) work[c.x] -= float(n) * p.frequency_penalty + p.presence_penalty;
    }
    threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);
    if (tid == 0) {
      for (uint x = 0; x < p.n_extra; ++x) {
        const uint id = extra[x];
        bool first = extra_counted[x] == 0 && id < p.vocab;
        uint n = 0;
        for (uint y = 0; y < p.n_extra; ++y) {
          n += extra[y] == id ? 1u : 0u;
          first = first && !(y < x && extra[y] == id);
        }
        if (first) work[id] -= float(n) * p.frequency_penalty + p.presence_penalty;
      }
    }
    threadgroup_barrier(mem_flags::mem_device);
  }

  // 1c. Constrained decoding: logit_bias (distinct ids: no two threads add
  //     to one logit), then the mask.
  if (p.n_bias > 0) {
    for (uint j = tid; j < p.n_bias; j += kThreads) {
      const uint2 b = bias[j];
      if (b.x < p.vocab) work[b.x] += as_type<float>(b.y);
    }
    threadgroup_barrier(mem_flags::mem_device);
  }
  if (p.masked != 0) {
    for (uint i = tid; i < p.vocab; i += kThreads)
      if (((mask[i / 32] >> (i % 32)) & 1u) == 0) work[i] = -INFINITY;
    threadgroup_barrier(mem_flags::mem_device);
  }

  // 2. Greedy: argmax, lowest index on ties.
  if (p.temperature <= 0.0f) {
    float bv = -INFINITY;
    uint bi = 0xffffffffu;
    for (uint i = tid; i < p.vocab; i += kThreads) {
      const float x = work[i];
      if (x > bv || (x == bv && i < bi)) { bv = x; bi = i; }
    }
    for (ushort off = 16; off > 0; off /= 2) {
      const float ov = simd_shuffle_down(bv, off);
      const uint oi = simd_shuffle_down(bi, off);
      if (ov > bv || (ov == bv && oi < bi)) { bv = ov; bi = oi; }
    }
    if (lane == 0) { best_value[simd] = bv; best_index[simd] = bi; }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid == 0) {
      for (uint s = 1; s < kSimds; ++s)
        if (best_value[s] > bv || (best_value[s] == bv && best_index[s] < bi)) {
          bv = best_value[s];
          bi = best_index[s];
        }
      token[0] = bi;
    }
    return;
  }

  // 3. Temperature, then the row maximum.
  float m = -INFINITY;
  for (uint i = tid; i < p.vocab; i += kThreads) {
    const float x = work[i] / p.temperature;
    work[i] = x;
    m = max(m, x);
  }
  m = group_max<kSimds>(m, slots, simd, lane);
  threadgroup_barrier(mem_flags::mem_device);

  // 4. Thresholds as order keys: keep x with key(x) >= lo. top-p measures
  //    mass among the top-k survivors; min-p (relative to the maximum, which
  //    every filter keeps) comes last, as in transformers.
  uint lo = 0;
  if (p.top_k > 0 && p.top_k < p.vocab)  // largest key t with count(key >= t) >= k
    lo = sample_search<kSimds, kSamplePivots, false>(work, p.vocab, tid, kThreads, 0u, 0xffffffffu, m, float(p.top_k), search_slots,
                                      simd, lane);
  if (p.top_p < 1.0f) {
    // Mass of the candidates left so far, then the largest key t whose upper
    // set still holds top_p of it: the smallest top set with that mass.
    float z = 0.0f;
    for (uint i = tid; i < p.vocab; i += kThreads)
      if (order_key(work[i]) >= lo) z += exp(work[i] - m);
    z = group_sum<kSimds>(z, slots, simd, lane);
    lo = sample_search<kSimds, kSamplePivots, true>(work, p.vocab, tid, kThreads, lo, order_key(m), m, p.top_p * z, search_slots,
                                     simd, lane);
  }
  if (p.min_p > 0.0f) lo = max(lo, order_key(m + log(p.min_p)));  // p_i >= min_p * p_max

  // 5. Draw: each thread owns a contiguous chunk of the row; the masses of
  //    the chunks, in index order, find the chunk holding uniform * total,
  //    and the masses of its tokens the token. Verifying a draft: it is the
  //    token with probability p(draft) = its mass / total; otherwise the draw
  //    skips it (the rest of the distribution, renormalized: speculative
  //    sampling's residual for a proposal that was certain), so the chunks'
  //    masses leave it out. The walk is SIMD-group 0's (sample_walk).
  const uint chunk = (p.vocab + kThreads - 1) / kThreads;
  const uint d = p.draft < p.vocab ? p.draft : mkv_params::kNoDraft;
  const uint begin = min(tid * chunk, p.vocab), end = min(begin + chunk, p.vocab);
  float mine = 0.0f;
  for (uint i = begin; i < end; ++i)
    if (order_key(work[i]) >= lo && i != d) mine += exp(work[i] - m);
  chunk_sums[tid] = mine;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (simd != 0) return;  // no barrier follows
  const float dmass = d != mkv_params::kNoDraft && order_key(work[d]) >= lo ? exp(work[d] - m) : 0.0f;
  const uint pick = sample_walk<kThreads>(p, work, chunk_sums, chunk, lo, m, d, dmass, lane);
  if (lane == 0) token[0] = pick;
}

MKV_KERNEL("sample_f32", sample_f32<mkv_params::kSampleThreads>)
MKV_KERNEL("sample_f32_simd", sample_f32<32>)
