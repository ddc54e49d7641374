// Standalone check of cpp/gpu/host/fiber.cpp, built and run by test_fibers.py
// natively, with the ucontext fallback, and for arm64 under qemu-user.
// Prints "ok" and exits 0, or names the first failed check and exits 1.
#include <cfenv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "fiber.h"

using mkv::host::Fiber;

#define CHECK(cond)                                             \
  do {                                                          \
    if (!(cond)) {                                              \
      std::printf("failed: %s (line %d)\n", #cond, __LINE__);   \
      std::exit(1);                                             \
    }                                                           \
  } while (0)

static int trace[64];
static int n_trace = 0;

struct Counter {
  int id;
  double acc;
};

static void count(void* p) {
  auto* c = static_cast<Counter*>(p);
  for (int i = 0; i < 3; ++i) {
    trace[n_trace++] = c->id * 10 + i;
    c->acc = c->acc * 1.5 + i;  // live FP state across switches
    Fiber::suspend();
  }
}

// The FP rounding mode belongs to each fiber: a fiber that changes it must not
// change the scheduler's (MXCSR/FPCR are saved by the switch).
static volatile float rounded_in_fiber;
static void round_down(void*) {
  std::fesetround(FE_DOWNWARD);
  Fiber::suspend();
  volatile float third = 1.0f;
  rounded_in_fiber = third / 3.0f;
}

static int depth(int n) {
  volatile char pad[512];
  pad[0] = char(n);
  return n == 0 ? pad[0] : depth(n - 1) + 1;
}
static int deep_result;
static void deep(void*) { deep_result = depth(50); }  // ~25 KiB of stack

int main() {
  Counter a{1, 1.0}, b{2, 2.0};
  Fiber fa, fb;
  fa.reset(count, &a, 64 * 1024);
  fb.reset(count, &b, 64 * 1024);
  bool done_a = false, done_b = false;
  while (!(done_a && done_b)) {
    if (!done_a) done_a = fa.resume();
    if (!done_b) done_b = fb.resume();
  }
  const int expect[] = {10, 20, 11, 21, 12, 22};
  CHECK(n_trace == 6);
  for (int i = 0; i < 6; ++i) CHECK(trace[i] == expect[i]);
  CHECK(a.acc == ((1.0 * 1.5 + 0) * 1.5 + 1) * 1.5 + 2);
  CHECK(b.acc == ((2.0 * 1.5 + 0) * 1.5 + 1) * 1.5 + 2);

  // A fiber reset while suspended mid-function starts over cleanly.
  Counter c{3, 0.0};
  fa.reset(count, &c, 64 * 1024);
  CHECK(!fa.resume());
  fa.reset(count, &c, 64 * 1024);
  n_trace = 0;
  while (!fa.resume()) {
  }
  CHECK(n_trace == 3 && trace[0] == 30);

  std::fesetround(FE_TONEAREST);
  Fiber fr;
  fr.reset(round_down, nullptr, 64 * 1024);
  CHECK(!fr.resume());
  CHECK(std::fegetround() == FE_TONEAREST);
  CHECK(fr.resume());
  volatile float one = 1.0f;
  CHECK(rounded_in_fiber < one / 3.0f);  // rounded down inside the fiber only

  Fiber fd;
  fd.reset(deep, nullptr, 64 * 1024);
  CHECK(fd.resume());
  CHECK(deep_result == 50);
  std::printf("ok\n");
  return 0;
}
