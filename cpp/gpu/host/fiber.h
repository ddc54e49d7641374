// Fibers: one per simulated GPU thread, switched cooperatively on one OS thread.
//
// The switch saves only callee-saved registers plus the floating-point control
// state (MXCSR/x87 CW on x86-64, FPCR on arm64) — about 10–15 ns, versus
// ~240 ns for swapcontext, which makes a syscall per switch. Other platforms use
// ucontext as a portable fallback. Under AddressSanitizer every switch is
// announced with __sanitizer_start/finish_switch_fiber.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mkv::host {

class Fiber {
 public:
  using Entry = void (*)(void* arg);

  Fiber() = default;
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;
  ~Fiber();

  // Allocates the stack (with a guard page) on first use; prepares the fiber
  // to run entry(arg) the next time it is resumed. A fiber may be reset while
  // suspended mid-function (its old frames are simply abandoned).
  void reset(Entry entry, void* arg, size_t stack_size);

  // Called from the scheduler: runs the fiber until it suspends or returns.
  // Returns true when the entry function has returned.
  bool resume();

  // Called from inside the running fiber: switches back to the scheduler.
  static void suspend();

 private:
  static void trampoline(Fiber* self);

  void* stack_ = nullptr;       // mapping base, guard page first
  size_t mapped_ = 0;
  size_t stack_size_ = 0;       // usable bytes above the guard page
  void* sp_ = nullptr;          // saved stack pointer (or ucontext_t*)
  Entry entry_ = nullptr;
  void* arg_ = nullptr;
  bool finished_ = false;
  void* ucontext_ = nullptr;    // portable fallback only
  friend struct FiberAccess;
};

// Nanoseconds per switch (resume + suspend pair halves), for the benchmark.
double measure_fiber_switch_ns(int iterations);

}  // namespace mkv::host
