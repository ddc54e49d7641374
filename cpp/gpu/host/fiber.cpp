// Fiber switching: hand-written context switch on x86-64 and arm64, ucontext
// elsewhere (or when built with MKV_FIBER_UCONTEXT). See fiber.h for why.
#include "fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <new>

#include "../device.h"

#if !defined(MKV_FIBER_UCONTEXT) && !defined(__x86_64__) && !defined(__aarch64__)
#define MKV_FIBER_UCONTEXT 1
#endif
#ifdef MKV_FIBER_UCONTEXT
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define MKV_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define MKV_ASAN 1
#endif
#endif
#ifdef MKV_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#if defined(__APPLE__)
#define MKV_SYM(name) "_" #name
#else
#define MKV_SYM(name) #name
#endif

extern "C" void mkv_fiber_switch(void** save_sp, void* new_sp);
extern "C" void mkv_fiber_start();

#ifndef MKV_FIBER_UCONTEXT
#if defined(__x86_64__)
// rdi = where to save the current stack pointer, rsi = stack pointer to load.
// Frame (low to high): x87 CW, MXCSR, r15, r14, r13, r12, rbx, rbp, return.
asm(R"(
.text
.globl )" MKV_SYM(mkv_fiber_switch) R"(
)" MKV_SYM(mkv_fiber_switch) R"(:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $16, %rsp
  stmxcsr 8(%rsp)
  fnstcw (%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  fldcw (%rsp)
  ldmxcsr 8(%rsp)
  addq $16, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.globl )" MKV_SYM(mkv_fiber_start) R"(
)" MKV_SYM(mkv_fiber_start) R"(:
  movq %r13, %rdi
  callq *%r12
  ud2
)");
constexpr size_t kFrameBytes = 72;  // bytes the switch pops, return address included
#elif defined(__aarch64__)
// x0 = where to save the current stack pointer, x1 = stack pointer to load.
// Frame: x19..x30 (96 bytes), d8..d15 (64 bytes), FPCR, padding = 176 bytes.
asm(R"(
.text
.globl )" MKV_SYM(mkv_fiber_switch) R"(
.p2align 2
)" MKV_SYM(mkv_fiber_switch) R"(:
  sub sp, sp, #176
  stp x19, x20, [sp, #0]
  stp x21, x22, [sp, #16]
  stp x23, x24, [sp, #32]
  stp x25, x26, [sp, #48]
  stp x27, x28, [sp, #64]
  stp x29, x30, [sp, #80]
  stp d8, d9, [sp, #96]
  stp d10, d11, [sp, #112]
  stp d12, d13, [sp, #128]
  stp d14, d15, [sp, #144]
  mrs x9, fpcr
  str x9, [sp, #160]
  mov x9, sp
  str x9, [x0]
  mov sp, x1
  ldr x9, [sp, #160]
  msr fpcr, x9
  ldp x19, x20, [sp, #0]
  ldp x21, x22, [sp, #16]
  ldp x23, x24, [sp, #32]
  ldp x25, x26, [sp, #48]
  ldp x27, x28, [sp, #64]
  ldp x29, x30, [sp, #80]
  ldp d8, d9, [sp, #96]
  ldp d10, d11, [sp, #112]
  ldp d12, d13, [sp, #128]
  ldp d14, d15, [sp, #144]
  add sp, sp, #176
  ret
.globl )" MKV_SYM(mkv_fiber_start) R"(
.p2align 2
)" MKV_SYM(mkv_fiber_start) R"(:
  mov x0, x20
  blr x19
  brk #0
)");
constexpr size_t kFrameBytes = 176;
#endif
#endif  // !MKV_FIBER_UCONTEXT

namespace mkv::host {

struct FiberAccess {
  static void main(Fiber* f);
};

namespace {

struct SchedulerState {
  void* sp = nullptr;            // the scheduler's saved stack pointer
  Fiber* current = nullptr;      // fiber running on this OS thread, if any
#ifdef MKV_FIBER_UCONTEXT
  ucontext_t context;
#endif
#ifdef MKV_ASAN
  void* fake_stack = nullptr;
  const void* stack_bottom = nullptr;
  size_t stack_size = 0;
#endif
};
thread_local SchedulerState tls;

size_t page_size() {
  static const size_t size = size_t(sysconf(_SC_PAGESIZE));
  return size;
}

}  // namespace

// First function on a fresh fiber stack.
void FiberAccess::main(Fiber* f) {
#ifdef MKV_ASAN
  __sanitizer_finish_switch_fiber(nullptr, &tls.stack_bottom, &tls.stack_size);
#endif
  f->entry_(f->arg_);
  f->finished_ = true;
  // Never resumed again (until reset), so ASan may free its fake stack.
#ifdef MKV_ASAN
  __sanitizer_start_switch_fiber(nullptr, tls.stack_bottom, tls.stack_size);
#endif
#ifdef MKV_FIBER_UCONTEXT
  setcontext(&tls.context);
#else
  mkv_fiber_switch(&f->sp_, tls.sp);
#endif
  __builtin_trap();
}

void Fiber::trampoline(Fiber* self) { FiberAccess::main(self); }

Fiber::~Fiber() {
  if (stack_) munmap(stack_, mapped_);
#ifdef MKV_FIBER_UCONTEXT
  delete static_cast<ucontext_t*>(ucontext_);
#endif
}

void Fiber::reset(Entry entry, void* arg, size_t stack_size) {
  if (!stack_ || stack_size_ < stack_size) {
    if (stack_) munmap(stack_, mapped_);
    const size_t page = page_size();
    stack_size_ = (stack_size + page - 1) / page * page;
    mapped_ = stack_size_ + page;
    stack_ = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (stack_ == MAP_FAILED) {
      stack_ = nullptr;
      throw mkv::gpu::GpuError("[host] cannot map a fiber stack of " +
                               std::to_string(mapped_) + " bytes");
    }
    mprotect(stack_, page, PROT_NONE);  // guard page: a stack overflow faults
  }
  entry_ = entry;
  arg_ = arg;
  finished_ = false;
  char* bottom = static_cast<char*>(stack_) + (mapped_ - stack_size_);
#ifdef MKV_ASAN
  // Frames abandoned by an earlier, aborted run may still be poisoned.
  ASAN_UNPOISON_MEMORY_REGION(bottom, stack_size_);
#endif
#ifdef MKV_FIBER_UCONTEXT
  if (!ucontext_) ucontext_ = new ucontext_t;
  auto* uc = static_cast<ucontext_t*>(ucontext_);
  getcontext(uc);
  uc->uc_stack.ss_sp = bottom;
  uc->uc_stack.ss_size = stack_size_;
  uc->uc_link = nullptr;
  // makecontext passes ints only: split the pointer in two halves.
  const uintptr_t self = reinterpret_cast<uintptr_t>(this);
  makecontext(uc, reinterpret_cast<void (*)()>(+[](unsigned lo, unsigned hi) {
                FiberAccess::main(reinterpret_cast<Fiber*>(uintptr_t(hi) << 32 | lo));
              }),
              2, unsigned(self & 0xffffffffu), unsigned(self >> 32));
  sp_ = uc;
#else
  uintptr_t top = reinterpret_cast<uintptr_t>(bottom + stack_size_) & ~uintptr_t(15);
  void** frame;
#if defined(__x86_64__)
  // After the switch pops kFrameBytes, rsp must be 16-byte aligned for the call
  // in mkv_fiber_start.
  frame = reinterpret_cast<void**>(top - kFrameBytes - 16);
  uint32_t mxcsr;
  uint16_t fcw;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fcw));
  for (int i = 0; i < 9; ++i) frame[i] = nullptr;
  reinterpret_cast<uint16_t*>(frame)[0] = fcw;
  reinterpret_cast<uint32_t*>(frame + 1)[0] = mxcsr;
  frame[4] = this;                                          // r13 = this
  frame[5] = reinterpret_cast<void*>(&Fiber::trampoline);  // r12 = function
  frame[8] = reinterpret_cast<void*>(&mkv_fiber_start);    // return address
#elif defined(__aarch64__)
  frame = reinterpret_cast<void**>(top - kFrameBytes);
  for (int i = 0; i < 22; ++i) frame[i] = nullptr;
  uint64_t fpcr;
  asm volatile("mrs %0, fpcr" : "=r"(fpcr));
  frame[0] = reinterpret_cast<void*>(&Fiber::trampoline);  // x19 = function
  frame[1] = this;                                          // x20 = argument
  frame[11] = reinterpret_cast<void*>(&mkv_fiber_start);   // x30 = return address
  reinterpret_cast<uint64_t*>(frame)[20] = fpcr;
#endif
  sp_ = frame;
#endif
}

bool Fiber::resume() {
  tls.current = this;
#ifdef MKV_ASAN
  char* bottom = static_cast<char*>(stack_) + (mapped_ - stack_size_);
  __sanitizer_start_switch_fiber(&tls.fake_stack, bottom, stack_size_);
#endif
#ifdef MKV_FIBER_UCONTEXT
  swapcontext(&tls.context, static_cast<ucontext_t*>(ucontext_));
#else
  mkv_fiber_switch(&tls.sp, sp_);
#endif
#ifdef MKV_ASAN
  __sanitizer_finish_switch_fiber(tls.fake_stack, nullptr, nullptr);
#endif
  tls.current = nullptr;
  return finished_;
}

void Fiber::suspend() {
  Fiber* self = tls.current;
#ifdef MKV_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, tls.stack_bottom, tls.stack_size);
#endif
#ifdef MKV_FIBER_UCONTEXT
  swapcontext(static_cast<ucontext_t*>(self->ucontext_), &tls.context);
#else
  mkv_fiber_switch(&self->sp_, tls.sp);
#endif
#ifdef MKV_ASAN
  __sanitizer_finish_switch_fiber(fake, &tls.stack_bottom, &tls.stack_size);
#endif
}

double measure_fiber_switch_ns(int iterations) {
  static thread_local int remaining;
  remaining = iterations;
  Fiber fiber;
  fiber.reset(+[](void*) {
    while (--remaining > 0) Fiber::suspend();
  }, nullptr, 64 * 1024);
  const auto t0 = std::chrono::steady_clock::now();
  while (!fiber.resume()) {
  }
  const auto t1 = std::chrono::steady_clock::now();
  const double ns = std::chrono::duration<double, std::nano>(t1 - t0).count();
  return ns / (2.0 * iterations);  // each iteration is a switch in and a switch out
}

}  // namespace mkv::host
