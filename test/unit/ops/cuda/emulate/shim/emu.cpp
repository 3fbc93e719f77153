// emulate/shim/emu.cpp — the launcher of emu.hpp: the blocks of a grid one after another on
// the calling OS thread, the threads of a block as fibers scheduled round robin, each running
// until it waits at a barrier (__syncthreads: the block's; a shuffle: its warp's) or ends.
// x86-64 System V only (the context switch below).
#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>

#include "emu.hpp"

#if !defined(__x86_64__)
#error "emulate/shim/emu.cpp: the fiber switch is written for x86-64 only"
#endif

// emu_ctx_switch(save, to): saves the callee-saved registers, MXCSR and the x87 control word
// on the current stack, stores the stack pointer in *save, and resumes the context whose stack
// pointer is `to` (saved the same way, or prepared by start_fiber below).
extern "C" void emu_ctx_switch(void** save, void* to);
asm(R"(
  .text
  .globl emu_ctx_switch
  .type emu_ctx_switch, @function
emu_ctx_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_ctx_switch, .-emu_ctx_switch
)");

namespace emu {
namespace {

constexpr unsigned kMaxThreads = 1024;
constexpr std::size_t kStack = std::size_t(128) << 10;  // per fiber, plus a guard page
constexpr std::size_t kGuard = std::size_t(4) << 10;

struct Barrier {
  unsigned expected = 0, arrived = 0, generation = 0;
};

struct Fiber {
  void* sp = nullptr;
  char* stack_top = nullptr;
  Barrier* waiting = nullptr;  // blocked until waiting->generation != generation
  unsigned generation = 0;
  bool done = false;
};

Fiber fibers[kMaxThreads];
Barrier block_barrier, warp_barriers[kMaxThreads / 32];
std::uint64_t slots[kMaxThreads];
void* scheduler_sp = nullptr;
Fiber* current = nullptr;  // null: threads run as plain calls (no synchronization allowed)
unsigned current_tid = 0, nthreads = 0;
bool synchronized = false;  // some thread of this launch reached a barrier
const char* kernel_name = "";
void (*kernel_body)(void*) = nullptr;
void* kernel_ctx = nullptr;
bool running = false;

void set_thread(unsigned tid) {
  current_tid = tid;
  threadIdx = dim3(tid % blockDim.x, (tid / blockDim.x) % blockDim.y, tid / (blockDim.x * blockDim.y));
}

void drop(Barrier& b) {  // a thread that ended no longer counts
  b.expected--;
  if (b.arrived > 0 && b.arrived == b.expected) {
    b.arrived = 0;
    b.generation++;
  }
}

void arrive(Barrier& b, const char* what) {
  if (!current)
    die(what, "reached by a thread run as a plain call: the kernel's first thread reached no "
              "barrier, this one does (divergent synchronization is not emulated)");
  synchronized = true;
  if (++b.arrived == b.expected) {  // the last one: release the others and go on
    b.arrived = 0;
    b.generation++;
    return;
  }
  current->waiting = &b;
  current->generation = b.generation;
  emu_ctx_switch(&current->sp, scheduler_sp);
}

void fiber_entry() {
  kernel_body(kernel_ctx);
  Fiber* f = current;
  f->done = true;
  drop(block_barrier);
  drop(warp_barriers[current_tid / 32]);
  emu_ctx_switch(&f->sp, scheduler_sp);
  die("fiber_entry", "a finished fiber was resumed");
}

void start_fiber(Fiber& f) {
  if (!f.stack_top) {
    void* m = mmap(nullptr, kStack + kGuard, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (m == MAP_FAILED) die("emu_launch", "cannot map a fiber stack");
    mprotect(m, kGuard, PROT_NONE);  // the stack grows down into this page: a fault, not a mess
    f.stack_top = static_cast<char*>(m) + kGuard + kStack;
  }
  // The frame emu_ctx_switch pops: MXCSR and x87 control word, six registers, then the
  // return address (fiber_entry), above it a null "return address" of the entry, which
  // thus starts with the stack aligned as after a call.
  auto* top = reinterpret_cast<std::uint64_t*>(f.stack_top);
  top[-1] = 0;
  top[-2] = reinterpret_cast<std::uint64_t>(&fiber_entry);
  for (int r = 3; r <= 8; r++) top[-r] = 0;
  top[-9] = 0x037fULL << 32 | 0x1f80ULL;  // default x87 control word, MXCSR
  f.sp = &top[-9];
  f.waiting = nullptr;
  f.done = false;
}

void resume(Fiber& f, unsigned tid) {
  f.waiting = nullptr;
  current = &f;
  set_thread(tid);
  emu_ctx_switch(&scheduler_sp, f.sp);
  current = nullptr;
}

bool blocked(const Fiber& f) { return f.waiting && f.waiting->generation == f.generation; }

// Runs block blockIdx with fibers; fiber 0 first, alone, when `probe` (then returns whether it
// ended without reaching a barrier, leaving the rest of the block to the caller).
bool run_block_fibers(unsigned nt, bool probe) {
  block_barrier = Barrier{nt, 0, 0};
  for (unsigned w = 0; w * 32 < nt; w++) warp_barriers[w] = Barrier{nt - w * 32 < 32 ? nt - w * 32 : 32, 0, 0};
  synchronized = false;
  start_fiber(fibers[0]);
  resume(fibers[0], 0);
  if (probe && fibers[0].done && !synchronized) return true;
  for (unsigned t = 1; t < nt; t++) start_fiber(fibers[t]);
  for (;;) {
    bool all_done = true, progress = false;
    for (unsigned t = 0; t < nt; t++) {
      Fiber& f = fibers[t];
      if (f.done) continue;
      all_done = false;
      if (blocked(f)) continue;
      resume(f, t);
      progress = true;
    }
    if (all_done) return false;
    if (!progress) die(kernel_name, "deadlock: every live thread waits at a barrier that can "
                                    "never complete");
  }
}

}  // namespace

[[noreturn]] void die(const char* what, const char* detail) {
  std::fprintf(stderr, "cuda emulation: %s in kernel %s: %s\n", what, kernel_name, detail);
  std::abort();
}

void sync_block() { arrive(block_barrier, "__syncthreads"); }
void sync_warp() { arrive(warp_barriers[current_tid / 32], "__shfl_xor_sync"); }
std::uint64_t* shuffle_slots() { return slots; }
unsigned thread_rank() { return current_tid; }
unsigned block_threads() { return nthreads; }

void run_grid(const char* kernel, dim3 grid, dim3 block, void (*body)(void*), void* ctx) {
  const unsigned long long nt = 1ULL * block.x * block.y * block.z;
  if (nt == 0 || nt > kMaxThreads || block.x > 1024 || block.y > 1024 || block.z > 64)
    return launch_error(kernel, "block of more than 1024 threads, or empty, or a dimension "
                                "over its limit (1024, 1024, 64)");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 ||
      grid.z > 65535)
    return launch_error(kernel, "grid empty or over its limits (2^31-1, 65535, 65535)");
  if (running) die(kernel, "a launch from inside a launch (or from two threads at once)");
  running = true;
  kernel_name = kernel;
  kernel_body = body;
  kernel_ctx = ctx;
  gridDim = grid;
  blockDim = block;
  nthreads = unsigned(nt);
  bool plain = false;  // threads as plain calls: the first thread of the grid synchronized never
  for (unsigned bz = 0; bz < grid.z; bz++)
    for (unsigned by = 0; by < grid.y; by++)
      for (unsigned bx = 0; bx < grid.x; bx++) {
        blockIdx = dim3(bx, by, bz);
        const bool first = bx == 0 && by == 0 && bz == 0;
        unsigned from = 0;
        if (first && run_block_fibers(nthreads, true)) {
          plain = true;
          from = 1;
        } else if (first) {
          continue;
        }
        if (!plain) {
          run_block_fibers(nthreads, false);
          continue;
        }
        current = nullptr;
        for (unsigned t = from; t < nthreads; t++) {
          set_thread(t);
          body(ctx);
        }
      }
  running = false;
  kernel_name = "";
}

}  // namespace emu
