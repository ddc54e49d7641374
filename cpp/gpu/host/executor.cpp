// Host executor: threadgroups over a thread pool, GPU threads as fibers, and
// rendezvous semantics with validation. See executor.h.
#include "executor.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "fiber.h"
#include "lane_api.h"
#include "thread_pool.h"

namespace mkv::host {
namespace {

enum class LaneState : uint8_t { runnable, waiting_simd, waiting_barrier, finished };

struct Lane {
  Fiber fiber;
  LaneContext ctx{};
  const KernelDesc* kernel = nullptr;
  uint32_t index = 0;  // thread_index_in_threadgroup
  LaneState state = LaneState::finished;
  // The rendezvous this lane waits at.
  Collective op{};
  CombineFn combine = nullptr;
  const void* in = nullptr;
  void* out = nullptr;
  uint32_t arg = 0;
  SourceLoc loc{};
};

struct SimdGroup {
  uint32_t full = 0;      // a bit per lane that exists
  uint32_t arrived = 0;   // lanes waiting at a SIMD collective
  uint32_t finished = 0;  // lanes that returned
};

// Per OS thread: fibers and threadgroup memory, reused across threadgroups.
struct Worker {
  std::vector<std::unique_ptr<Lane>> lanes;
  std::vector<SimdGroup> simd;
  std::vector<uint32_t> order;
  std::unique_ptr<unsigned char[]> arena{new unsigned char[kMaxThreadgroupMemory]};
  size_t arena_used = 0;
  std::vector<std::pair<const void*, void*>> sites;  // threadgroup variables
  std::array<void*, kMaxThreadgroupBindings> threadgroup_ptrs{};

  const Dispatch* dispatch = nullptr;
  uint32_t n_lanes = 0;
  uint32_t position[3] = {0, 0, 0};
  uint32_t barrier_waiting = 0;
  uint32_t finished = 0;
  Lane* current = nullptr;
  std::string error;  // non-empty: this threadgroup failed
};

thread_local Worker* tls_worker = nullptr;

std::string loc_text(const SourceLoc& loc) {
  return std::string(loc.file) + ":" + std::to_string(loc.line);
}

bool same_site(const Lane& a, const Lane& b) {
  return a.op == b.op && a.loc.line == b.loc.line &&
         (a.loc.file == b.loc.file || std::strcmp(a.loc.file, b.loc.file) == 0);
}

// "threads 0-15, 17, 20-21"
std::string threads_text(const std::vector<uint32_t>& ids) {
  std::string s = ids.size() == 1 ? "thread " : "threads ";
  for (size_t i = 0; i < ids.size();) {
    size_t j = i;
    while (j + 1 < ids.size() && ids[j + 1] == ids[j] + 1) ++j;
    if (i) s += ", ";
    s += std::to_string(ids[i]);
    if (j > i) s += "-" + std::to_string(ids[j]);
    i = j + 1;
  }
  return s;
}

// Groups lanes by the rendezvous they wait at: "threads 0-15 at simd_sum (f:3)".
template <class Pred>
std::string waiting_text(Worker& w, Pred include) {
  std::vector<const Lane*> firsts;
  std::vector<std::vector<uint32_t>> groups;
  for (uint32_t i = 0; i < w.n_lanes; ++i) {
    const Lane& l = *w.lanes[i];
    if (!include(l)) continue;
    size_t g = 0;
    while (g < firsts.size() && !(firsts[g]->state == l.state && same_site(*firsts[g], l))) ++g;
    if (g == firsts.size()) {
      firsts.push_back(&l);
      groups.emplace_back();
    }
    groups[g].push_back(l.index);
  }
  std::string s;
  for (size_t g = 0; g < firsts.size(); ++g) {
    if (g) s += "; ";
    s += threads_text(groups[g]) + " at " + collective_name(firsts[g]->op) + " (" +
         loc_text(firsts[g]->loc) + ")";
  }
  return s;
}

void set_error(Worker& w, const std::string& detail) {
  if (!w.error.empty()) return;
  const KernelDesc& k = *w.dispatch->kernel;
  w.error = "[host] kernel '" + std::string(k.name) + "' (" + k.file + ":" +
            std::to_string(k.line) + "), threadgroup (" + std::to_string(w.position[0]) + "," +
            std::to_string(w.position[1]) + "," + std::to_string(w.position[2]) + "): " + detail;
}

// Inside a fiber: report and never run again (the scheduler abandons us).
[[noreturn]] void fail_in_fiber(Worker& w, const std::string& detail) {
  set_error(w, detail);
  for (;;) Fiber::suspend();
}

void release_barrier(Worker& w) {
  const Lane* first = nullptr;
  for (uint32_t i = 0; i < w.n_lanes; ++i) {
    const Lane& l = *w.lanes[i];
    if (!first) first = &l;
    if (!same_site(*first, l)) {
      set_error(w, "barrier divergence: threads wait at different barriers: " +
                       waiting_text(w, [](const Lane&) { return true; }));
      return;
    }
  }
  for (uint32_t i = 0; i < w.n_lanes; ++i) w.lanes[i]->state = LaneState::runnable;
  w.barrier_waiting = 0;
}

void release_simd(Worker& w, uint32_t group) {
  SimdGroup& sg = w.simd[group];
  Lane* lanes[kSimdWidth] = {};
  const Lane* first = nullptr;
  for (int j = 0; j < kSimdWidth; ++j) {
    if (!((sg.arrived >> j) & 1u)) continue;
    lanes[j] = w.lanes[group * kSimdWidth + j].get();
    if (!first) first = lanes[j];
    if (!same_site(*first, *lanes[j])) {
      set_error(w, "mismatched collectives in SIMD-group " + std::to_string(group) + ": " +
                       waiting_text(w, [&](const Lane& l) {
                         return l.index / kSimdWidth == group && l.state == LaneState::waiting_simd;
                       }));
      return;
    }
  }
  // Every lane of the SIMD-group must take part: Metal would run the call over
  // the lanes left, but on NVIDIA GPUs (the cuda device) a warp collective with
  // exited lanes is undefined, so the kernels promise not to need that.
  if (sg.finished) {
    std::string gone;
    for (int j = 0; j < kSimdWidth; ++j)
      if ((sg.finished >> j) & 1u) gone += (gone.empty() ? "" : ", ") + std::to_string(group * kSimdWidth + j);
    set_error(w, "thread(s) " + gone + " of SIMD-group " + std::to_string(group) + " returned before " +
                     collective_name(first->op) + " (" + loc_text(first->loc) + "); every lane of a SIMD-group "
                     "must reach each simd_* call (a GPU without lockstep lanes, e.g. the cuda device, leaves it "
                     "undefined): return after the collective, or mask the work instead");
    return;
  }
  if (first->combine) {
    LaneSlots slots;
    for (int j = 0; j < kSimdWidth; ++j) {
      slots.in[j] = lanes[j] ? lanes[j]->in : nullptr;
      slots.out[j] = lanes[j] ? lanes[j]->out : nullptr;
      slots.arg[j] = lanes[j] ? lanes[j]->arg : 0;
    }
    slots.active = sg.arrived;
    slots.bad_reader = slots.bad_source = -1;
    first->combine(slots);
    if (slots.bad_reader >= 0) {
      const uint32_t base = group * kSimdWidth;
      set_error(w, "reading an inactive lane: thread " + std::to_string(base + slots.bad_reader) +
                       " (lane " + std::to_string(slots.bad_reader) + " of SIMD-group " +
                       std::to_string(group) + ") read lane " + std::to_string(slots.bad_source) +
                       ", which has exited or does not exist, in " + collective_name(first->op) +
                       " (" + loc_text(first->loc) + ")");
      return;
    }
  }
  for (int j = 0; j < kSimdWidth; ++j)
    if (lanes[j]) lanes[j]->state = LaneState::runnable;
  sg.arrived = 0;
}

void on_lane_finished(Worker& w, Lane& l) {
  l.state = LaneState::finished;
  ++w.finished;
  const uint32_t group = l.index / kSimdWidth;
  SimdGroup& sg = w.simd[group];
  sg.finished |= 1u << (l.index % kSimdWidth);
  if (w.barrier_waiting > 0) {
    set_error(w, "barrier divergence: thread " + std::to_string(l.index) +
                     " returned while " +
                     waiting_text(w, [](const Lane& o) {
                       return o.state == LaneState::waiting_barrier;
                     }) +
                     "; every thread of the threadgroup must reach each barrier");
    return;
  }
  if (sg.arrived && (sg.arrived | sg.finished) == sg.full) release_simd(w, group);
}

void report_deadlock(Worker& w) {
  for (uint32_t g = 0; g < w.simd.size(); ++g) {
    if (!w.simd[g].arrived) continue;
    set_error(w, "collective reached by only part of the live lanes of SIMD-group " +
                     std::to_string(g) + ": " +
                     waiting_text(w, [&](const Lane& l) {
                       return l.index / kSimdWidth == g && l.state != LaneState::finished;
                     }));
    return;
  }
  set_error(w, "deadlock: " + waiting_text(w, [](const Lane& l) {
                 return l.state != LaneState::finished;
               }));
}

void lane_main(void* arg) {
  Lane* lane = static_cast<Lane*>(arg);
  lane->kernel->invoke(lane->ctx);
}

void prepare_lanes(Worker& w, const Dispatch& d, const ExecutorOptions& options) {
  const gpu::Size3 tpt = d.threads_per_threadgroup, grid = d.threadgroups;
  const uint32_t n = w.n_lanes;
  while (w.lanes.size() < n) w.lanes.push_back(std::make_unique<Lane>());
  const uint32_t n_simd = (n + kSimdWidth - 1) / kSimdWidth;
  w.simd.assign(n_simd, SimdGroup{});
  for (uint32_t g = 0; g < n_simd; ++g) {
    const uint32_t width = std::min<uint32_t>(kSimdWidth, n - g * kSimdWidth);
    w.simd[g].full = width == 32 ? ~0u : (1u << width) - 1;
  }
  const uint32_t tg_size[3] = {tpt.x, tpt.y, tpt.z};
  const uint32_t tg_count[3] = {grid.x, grid.y, grid.z};
  for (uint32_t i = 0; i < n; ++i) {
    Lane& l = *w.lanes[i];
    l.kernel = d.kernel;
    l.index = i;
    l.state = LaneState::runnable;
    LaneContext& c = l.ctx;
    c.buffers = d.buffers.data();
    c.threadgroup = w.threadgroup_ptrs.data();
    const uint32_t local[3] = {i % tpt.x, (i / tpt.x) % tpt.y, i / (tpt.x * tpt.y)};
    auto set = [&](Builtin b, uint32_t x, uint32_t y, uint32_t z) {
      c.builtin[size_t(b)][0] = x;
      c.builtin[size_t(b)][1] = y;
      c.builtin[size_t(b)][2] = z;
    };
    for (int a = 0; a < 3; ++a) {
      c.builtin[size_t(Builtin::thread_position_in_grid)][a] = w.position[a] * tg_size[a] + local[a];
      c.builtin[size_t(Builtin::thread_position_in_threadgroup)][a] = local[a];
      c.builtin[size_t(Builtin::threadgroup_position_in_grid)][a] = w.position[a];
      c.builtin[size_t(Builtin::threads_per_threadgroup)][a] = tg_size[a];
      c.builtin[size_t(Builtin::threadgroups_per_grid)][a] = tg_count[a];
      c.builtin[size_t(Builtin::threads_per_grid)][a] = tg_count[a] * tg_size[a];
    }
    set(Builtin::thread_index_in_threadgroup, i, 0, 0);
    set(Builtin::thread_index_in_simdgroup, i % kSimdWidth, 0, 0);
    set(Builtin::simdgroup_index_in_threadgroup, i / kSimdWidth, 0, 0);
    set(Builtin::threads_per_simdgroup, kSimdWidth, 0, 0);
    set(Builtin::simdgroups_per_threadgroup, n_simd, 0, 0);
    l.fiber.reset(&lane_main, &l, options.stack_bytes);
  }
}

// Threadgroup memory: [[threadgroup(n)]] buffers first, then variables as
// their declarations are reached. All of it starts poisoned (0xFF: NaN for
// floats) so a read before a barrier-protected write shows up in results.
void prepare_threadgroup_memory(Worker& w, const Dispatch& d) {
  w.arena_used = 0;
  w.sites.clear();
  for (int i = 0; i < kMaxThreadgroupBindings; ++i) {
    const size_t bytes = d.threadgroup_bytes[i];
    if (!bytes) {
      w.threadgroup_ptrs[i] = nullptr;
      continue;
    }
    w.threadgroup_ptrs[i] = w.arena.get() + w.arena_used;
    std::memset(w.threadgroup_ptrs[i], 0xFF, bytes);
    w.arena_used += (bytes + 15) / 16 * 16;
  }
}

void run_threadgroup(Worker& w, const Dispatch& d, const ExecutorOptions& options,
                     uint64_t linear) {
  const gpu::Size3 grid = d.threadgroups;
  w.dispatch = &d;
  w.position[0] = uint32_t(linear % grid.x);
  w.position[1] = uint32_t(linear / grid.x % grid.y);
  w.position[2] = uint32_t(linear / (uint64_t(grid.x) * grid.y));
  w.n_lanes = uint32_t(d.threads_per_threadgroup.volume());
  w.barrier_waiting = 0;
  w.finished = 0;
  w.error.clear();
  prepare_threadgroup_memory(w, d);
  prepare_lanes(w, d, options);

  w.order.resize(w.n_lanes);
  for (uint32_t i = 0; i < w.n_lanes; ++i)
    w.order[i] = options.order == FiberOrder::reverse ? w.n_lanes - 1 - i : i;
  std::mt19937_64 rng(options.seed * 0x9E3779B97F4A7C15ull + linear);

  while (w.finished < w.n_lanes) {
    if (options.order == FiberOrder::random) std::shuffle(w.order.begin(), w.order.end(), rng);
    bool progress = false;
    for (uint32_t i : w.order) {
      Lane& l = *w.lanes[i];
      if (l.state != LaneState::runnable) continue;
      progress = true;
      w.current = &l;
      const bool done = l.fiber.resume();
      w.current = nullptr;
      if (!w.error.empty()) return;
      if (done) on_lane_finished(w, l);
      if (!w.error.empty()) return;
    }
    if (!progress) {
      report_deadlock(w);
      return;
    }
  }
}

std::string binding_error(const KernelDesc& k, const std::string& detail) {
  return "[host] kernel '" + std::string(k.name) + "' (" + k.file + ":" + std::to_string(k.line) +
         "): " + detail;
}

}  // namespace

void validate(const Dispatch& d) {
  const KernelDesc& k = *d.kernel;
  const gpu::Size3 t = d.threads_per_threadgroup;
  const uint64_t threads = t.volume();
  if (threads == 0 || threads > k.max_threads)
    throw gpu::GpuError(binding_error(
        k, "threads_per_threadgroup (" + std::to_string(t.x) + "," + std::to_string(t.y) + "," +
               std::to_string(t.z) + ") = " + std::to_string(threads) + " threads; this pipeline holds 1 to " +
               std::to_string(k.max_threads) +
               (k.max_threads < kMaxThreadsPerThreadgroup ? " ([[max_total_threads_per_threadgroup]])"
                                                          : " (a threadgroup's limit)")));
  size_t tg_bytes = 0;
  for (size_t i = 0; i < kMaxThreadgroupBindings; ++i) tg_bytes += d.threadgroup_bytes[i];
  if (tg_bytes > kMaxThreadgroupMemory)
    throw gpu::GpuError(binding_error(
        k, "threadgroup memory of " + std::to_string(tg_bytes) + " bytes exceeds the " +
               std::to_string(kMaxThreadgroupMemory) + "-byte limit"));
  for (uint32_t p = 0; p < k.n_params; ++p) {
    const ParamSpec& s = k.params[p];
    const std::string what = "parameter '" + std::string(s.name) + "'";
    if (s.kind == ParamSpec::buffer) {
      if (!d.buffer_bound[s.index])
        throw gpu::GpuError(binding_error(k, what + " needs buffer index " +
                                                 std::to_string(s.index) +
                                                 ", which is not bound"));
      if (s.min_bytes > d.buffer_bytes[s.index])
        throw gpu::GpuError(binding_error(
            k, what + " refers to a " + std::to_string(s.min_bytes) + "-byte struct but buffer index " +
                   std::to_string(s.index) + " has only " + std::to_string(d.buffer_bytes[s.index]) +
                   " bytes bound"));
    } else if (s.kind == ParamSpec::threadgroup_memory && d.threadgroup_bytes[s.index] == 0) {
      throw gpu::GpuError(binding_error(k, what + " needs threadgroup memory index " +
                                               std::to_string(s.index) +
                                               ", whose length was never set"));
    }
  }
}

namespace {

ThreadPool& pool() {
  static ThreadPool instance(executor_threads());
  return instance;
}

}  // namespace

// ---- lane_api.h: called by kernel code inside a fiber ----

void collective(Collective op, CombineFn combine, const void* in, void* out, uint32_t arg,
                SourceLoc loc) {
  Worker& w = *tls_worker;
  Lane& l = *w.current;
  l.op = op;
  l.combine = combine;
  l.in = in;
  l.out = out;
  l.arg = arg;
  l.loc = loc;
  if (op == Collective::threadgroup_barrier) {
    if (w.finished > 0) {
      std::vector<uint32_t> gone;
      for (uint32_t i = 0; i < w.n_lanes; ++i)
        if (w.lanes[i]->state == LaneState::finished) gone.push_back(i);
      fail_in_fiber(w, "barrier divergence: thread " + std::to_string(l.index) +
                           " reached threadgroup_barrier (" + loc_text(loc) + ") but " +
                           threads_text(gone) +
                           " already returned; every thread must reach each barrier");
    }
    l.state = LaneState::waiting_barrier;
    if (++w.barrier_waiting == w.n_lanes) release_barrier(w);
  } else {
    l.state = LaneState::waiting_simd;
    const uint32_t group = l.index / kSimdWidth;
    SimdGroup& sg = w.simd[group];
    sg.arrived |= 1u << (l.index % kSimdWidth);
    if ((sg.arrived | sg.finished) == sg.full) release_simd(w, group);
  }
  if (!w.error.empty()) fail_in_fiber(w, w.error);
  if (l.state != LaneState::runnable) Fiber::suspend();
}

void* threadgroup_variable(const void* site, size_t size, size_t align) {
  Worker& w = *tls_worker;
  for (auto& s : w.sites)
    if (s.first == site) return s.second;
  const size_t a = std::max<size_t>(align, 16);
  const size_t offset = (w.arena_used + a - 1) / a * a;
  if (offset + size > kMaxThreadgroupMemory)
    fail_in_fiber(w, "threadgroup memory exceeds " + std::to_string(kMaxThreadgroupMemory) +
                         " bytes: a " + std::to_string(size) + "-byte threadgroup variable after " +
                         std::to_string(w.arena_used) + " bytes already in use");
  void* p = w.arena.get() + offset;
  std::memset(p, 0xFF, size);
  w.arena_used = offset + size;
  w.sites.emplace_back(site, p);
  return p;
}

uint32_t current_simd_lane() { return tls_worker->current->index % kSimdWidth; }

void kernel_error(const char* message, SourceLoc loc) {
  fail_in_fiber(*tls_worker, std::string(message) + " (" + loc_text(loc) + ")");
}

void execute(const Dispatch& d, const ExecutorOptions& options) {
  validate(d);
  const uint64_t total = d.threadgroups.volume();
  if (total == 0) return;
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  std::mutex error_mutex;
  std::string error;
  pool().run([&](int) {
    static thread_local Worker worker;
    tls_worker = &worker;
    for (uint64_t i; !failed.load(std::memory_order_relaxed) && (i = next++) < total;) {
      run_threadgroup(worker, d, options, i);
      if (!worker.error.empty()) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!failed.exchange(true)) error = worker.error;
      }
    }
    tls_worker = nullptr;
  });
  if (failed) throw gpu::GpuError(error);
}

}  // namespace mkv::host
