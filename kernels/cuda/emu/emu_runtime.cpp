// Runs one kernel launch of the host build: validates it as the device would, then its blocks,
// each block's CUDA threads as fibers — two blocks in flight on lanes of their own, in a seeded
// order (default), or one after the other on the calling thread — or as OS threads
// (EMU_OS_THREADS, the ThreadSanitizer build). Barriers count live threads: a thread that
// returns no longer takes part, as on the device.
//
// Fibers also make faults recoverable: a kernel thread that touches a protected page (a guard
// page or freed memory of the emulated device) raises SIGSEGV on the thread running its fiber;
// the handler records the address, maps a scratch page there so the access completes, and the
// launch finishes and reports the fault. The page is made inaccessible again afterwards.
#include "emu_cuda.h"

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>


namespace emu {

thread_local Thread* t_cur = nullptr;
thread_local unsigned long long t_kv_read_bytes = 0;
// What a shuffle from an absent lane reads: a NaN as a float, nonsense as an integer.
constexpr std::uint64_t kShflPoison = 0x7fc0dead7fc0deadull;
// Every launch's K/V reads since the host last took the count (all launching threads).
std::atomic<unsigned long long> g_kv_read_bytes{0};

constexpr unsigned int kMaxThreads = 1024;

struct Barrier {
  unsigned int expected = 0;
  unsigned int arrived = 0;
  unsigned int gen = 0;
#ifdef EMU_OS_THREADS
  std::mutex m;
  std::condition_variable cv;
#endif
};

struct Warp {
  Barrier bar;
  unsigned int live = 0;  // lanes this warp has (a partial last warp has fewer)
  std::uint64_t buf[2][32];
};

struct Block {
  BlockDims dims;
  Barrier bar;
  Warp warps[kMaxThreads / 32];
  // Arrivals and exits: a scheduler round without one is a deadlock.
  unsigned long events = 0;
};

const BlockDims& block_dims(const Thread* t) { return t->block->dims; }

namespace {

// ---- Contexts -----------------------------------------------------------------------------------
#ifndef EMU_OS_THREADS
#if defined(__x86_64__)
extern "C" void emu_fiber_switch(void** save_sp, void* to_sp);
extern "C" void emu_fiber_start();
asm(R"(
  .text
  .globl emu_fiber_switch
  .hidden emu_fiber_switch
  .type emu_fiber_switch,@function
emu_fiber_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size emu_fiber_switch, .-emu_fiber_switch
  .globl emu_fiber_start
  .hidden emu_fiber_start
  .type emu_fiber_start,@function
emu_fiber_start:
  movq %r12, %rdi
  callq *%r13
  ud2
  .size emu_fiber_start, .-emu_fiber_start
)");

struct Ctx {
  void* sp = nullptr;
};
void ctx_init(Ctx* c, char* stack_hi, void (*fn)(void*), void* arg) {
  std::uintptr_t top = reinterpret_cast<std::uintptr_t>(stack_hi) & ~std::uintptr_t(15);
  void** slot = reinterpret_cast<void**>(top - 24);
  slot[0] = reinterpret_cast<void*>(&emu_fiber_start);
  void** sp = slot - 6;
  sp[0] = nullptr;                           // r15
  sp[1] = nullptr;                           // r14
  sp[2] = reinterpret_cast<void*>(fn);       // r13
  sp[3] = arg;                               // r12
  sp[4] = nullptr;                           // rbx
  sp[5] = nullptr;                           // rbp
  c->sp = sp;
}
inline void ctx_switch(Ctx* from, Ctx* to) { emu_fiber_switch(&from->sp, to->sp); }
#else
struct Ctx {
  ucontext_t uc;
};
void ctx_init(Ctx* c, char* stack_hi, void (*fn)(void*), void* arg);
inline void ctx_switch(Ctx* from, Ctx* to) { swapcontext(&from->uc, &to->uc); }
#endif
#endif

// ---- Barriers -------------------------------------------------------------------------------------
#ifndef EMU_OS_THREADS
struct Fiber {
  Ctx ctx;
  Thread t;
  bool done = false;
  // The barrier this fiber waits at and the generation it waits to end: the scheduler resumes
  // it only once that generation has passed (no switch in and straight back out).
  const Barrier* wait_bar = nullptr;
  unsigned int wait_gen = 0;
};

struct Sched {
  Ctx ctx;
  Fiber* cur = nullptr;
  const KernelEntry* kernel = nullptr;
  void** params = nullptr;
};
thread_local Sched* t_sched = nullptr;

inline void yield() { ctx_switch(&t_sched->cur->ctx, &t_sched->ctx); }

void arrive(Barrier& b, Block& blk) {
  const unsigned int g = b.gen;
  ++blk.events;
  if (++b.arrived >= b.expected) {
    b.arrived = 0;
    ++b.gen;
    return;
  }
  Fiber* f = t_sched->cur;
  f->wait_bar = &b;
  f->wait_gen = g;
  while (b.gen == g) yield();
  f->wait_bar = nullptr;
}

void leave(Barrier& b) {
  --b.expected;
  if (b.arrived > 0 && b.arrived >= b.expected) {
    b.arrived = 0;
    ++b.gen;
  }
}
#else
void arrive(Barrier& b, Block&) {
  std::unique_lock<std::mutex> l(b.m);
  const unsigned int g = b.gen;
  if (++b.arrived >= b.expected) {
    b.arrived = 0;
    ++b.gen;
    b.cv.notify_all();
    return;
  }
  b.cv.wait(l, [&] { return b.gen != g; });
}

void leave(Barrier& b) {
  std::lock_guard<std::mutex> l(b.m);
  --b.expected;
  if (b.arrived > 0 && b.arrived >= b.expected) {
    b.arrived = 0;
    ++b.gen;
    b.cv.notify_all();
  }
}
#endif

}  // namespace

void syncthreads() { arrive(t_cur->block->bar, *t_cur->block); }

void syncwarp() { arrive(t_cur->warp->bar, *t_cur->block); }

std::uint64_t warp_exchange(std::uint64_t bits, int src) {
  Thread* t = t_cur;
  Warp* w = t->warp;
  // Two buffers used in turn: a lane writes buffer p only after every lane has passed the
  // barrier of the previous exchange, by which time all reads of p's previous round are done.
  const unsigned int p = t->shfl_phase;
  t->shfl_phase ^= 1u;
  w->buf[p][t->lane] = bits;
  arrive(w->bar, *t->block);
  if (src < 0 || src >= 32) return bits;
  // A lane the warp lacks (a partial warp) or that has returned: undefined on the device.
  if (!((w->live >> src) & 1u)) return kShflPoison;
  return w->buf[p][src];
}

void warp_gather(std::uint64_t bits, std::uint64_t out[32], unsigned int* live) {
  Thread* t = t_cur;
  Warp* w = t->warp;
  const unsigned int p = t->shfl_phase;
  t->shfl_phase ^= 1u;
  w->buf[p][t->lane] = bits;
  arrive(w->bar, *t->block);
  *live = w->live;
  for (int l = 0; l < 32; ++l) out[l] = w->buf[p][l];
}

namespace {

void init_block(Block& blk, const unsigned int grid[3], const unsigned int block[3],
                unsigned int bx, unsigned int by, unsigned int bz, std::vector<Thread>& threads) {
  const unsigned int n = block[0] * block[1] * block[2];
  blk.dims.idx = uint3{bx, by, bz};
  blk.dims.dim = dim3{block[0], block[1], block[2]};
  blk.dims.grid = dim3{grid[0], grid[1], grid[2]};
  blk.bar.expected = n;
  blk.bar.arrived = 0;
  blk.events = 0;
  const unsigned int warps = (n + 31) / 32;
  for (unsigned int w = 0; w < warps; ++w) {
    const unsigned int lanes = (w + 1 == warps) ? n - w * 32 : 32;
    blk.warps[w].bar.expected = lanes;
    blk.warps[w].bar.arrived = 0;
    blk.warps[w].live = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1u);
  }
  threads.resize(n);
  for (unsigned int i = 0; i < n; ++i) {
    Thread& t = threads[i];
    t.tid = uint3{i % block[0], (i / block[0]) % block[1], i / (block[0] * block[1])};
    t.flat = i;
    t.lane = i % 32;
    t.block = &blk;
    t.warp = &blk.warps[i / 32];
    t.shfl_phase = 0;
  }
}

int bad(LaunchResult* res, const char* fmt, unsigned long long a, unsigned long long b) {
  std::snprintf(res->reason, sizeof res->reason, fmt, a, b);
  return LAUNCH_BAD;
}

/// The device's launch limits (compute capability 8.x/9.x).
int validate(const KernelEntry* k, const unsigned int grid[3], const unsigned int block[3],
             unsigned int shared, void** params, std::size_t nparams, LaunchResult* res) {
  if (nparams != k->arity)
    return bad(res, "%llu parameters given, the kernel takes %llu", nparams, k->arity);
  for (std::size_t i = 0; i < nparams; ++i)
    if (params[i] == nullptr)
      return bad(res, "parameter %llu of %llu is a null pointer", i, nparams);
  if (block[0] == 0 || block[1] == 0 || block[2] == 0)
    return bad(res, "block has a zero dimension (%llu x %llu x ..)", block[0], block[1]);
  if (block[0] > 1024 || block[1] > 1024 || block[2] > 64)
    return bad(res, "block %llu x %llu x .. exceeds 1024 x 1024 x 64", block[0], block[1]);
  const unsigned long long threads = 1ull * block[0] * block[1] * block[2];
  if (threads > kMaxThreads)
    return bad(res, "block of %llu threads exceeds %llu", threads, kMaxThreads);
  if (grid[0] == 0 || grid[1] == 0 || grid[2] == 0)
    return bad(res, "grid has a zero dimension (%llu x %llu x ..)", grid[0], grid[1]);
  if (grid[0] > 0x7fffffffu) return bad(res, "grid.x %llu exceeds %llu", grid[0], 0x7fffffffu);
  if (grid[1] > 65535) return bad(res, "grid.y %llu exceeds %llu", grid[1], 65535);
  if (grid[2] > 65535) return bad(res, "grid.z %llu exceeds %llu", grid[2], 65535);
  if (shared > 48 * 1024)
    return bad(res, "%llu bytes of dynamic shared memory exceed %llu", shared, 48 * 1024);
  return LAUNCH_OK;
}

#ifndef EMU_OS_THREADS
// ---- Fiber stacks (per launching thread, reused) ---------------------------------------------
constexpr std::size_t kStackBytes = 128 * 1024;

struct StackPool {
  std::size_t page = 4096;
  std::vector<char*> bases;  // each: one guard page, then kStackBytes
  ~StackPool() {
    for (char* b : bases) munmap(b, page + kStackBytes);
  }
  bool grow_to(std::size_t n) {
    page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    while (bases.size() < n) {
      void* m = mmap(nullptr, page + kStackBytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
      if (m == MAP_FAILED) return false;
      mprotect(m, page, PROT_NONE);
      bases.push_back(static_cast<char*>(m));
    }
    return true;
  }
  bool is_guard(std::uintptr_t a) const {
    for (char* b : bases) {
      const std::uintptr_t lo = reinterpret_cast<std::uintptr_t>(b);
      if (a >= lo && a < lo + page) return true;
    }
    return false;
  }
};
thread_local StackPool t_stacks;

#if !defined(__x86_64__)
void ctx_init(Ctx* c, char* stack_hi, void (*fn)(void*), void* arg) {
  getcontext(&c->uc);
  c->uc.uc_stack.ss_sp = stack_hi - kStackBytes;
  c->uc.uc_stack.ss_size = kStackBytes;
  c->uc.uc_link = nullptr;
  makecontext(&c->uc, reinterpret_cast<void (*)()>(fn), 1, arg);
}
#endif

// ---- Fault trapping --------------------------------------------------------------------------
constexpr unsigned int kMaxFaultPages = 64;

struct FaultState {
  volatile sig_atomic_t active = 0;
  bool faulted = false;
  std::uintptr_t addr = 0;
  int write = 0;
  unsigned int npages = 0;
  std::uintptr_t pages[kMaxFaultPages];
  bool was_mapped[kMaxFaultPages];
};
thread_local FaultState t_fault;

struct sigaction g_prev_segv;
int g_probe_pipe[2] = {-1, -1};
std::once_flag g_install_once;

// Readable without faulting: the kernel copies one byte into a pipe or answers EFAULT.
bool readable(std::uintptr_t page) {
  if (g_probe_pipe[1] < 0) return true;  // unknown: treat as readable (never overwritten)
  if (write(g_probe_pipe[1], reinterpret_cast<const void*>(page), 1) != 1) return false;
  char c;
  (void)!read(g_probe_pipe[0], &c, 1);
  return true;
}

int fault_is_write(void* uc) {
#if defined(__x86_64__)
  return (static_cast<ucontext_t*>(uc)->uc_mcontext.gregs[REG_ERR] & 2) ? 1 : 0;
#else
  (void)uc;
  return 0;
#endif
}

void chain(int sig, siginfo_t* si, void* uc) {
  const struct sigaction& prev = g_prev_segv;
  if (prev.sa_flags & SA_SIGINFO) {
    if (prev.sa_sigaction != nullptr) {
      prev.sa_sigaction(sig, si, uc);
      return;
    }
  } else if (prev.sa_handler != SIG_DFL && prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
    return;
  }
  // Default action: restore it and return; the access faults again and the process ends.
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigaction(sig, &dfl, nullptr);
}

void on_segv(int sig, siginfo_t* si, void* uc) {
  FaultState& fs = t_fault;
  if (fs.active && fs.npages < kMaxFaultPages) {
    const std::uintptr_t a = reinterpret_cast<std::uintptr_t>(si->si_addr);
    const std::uintptr_t page = a & ~(std::uintptr_t)(t_stacks.page - 1);
    const int write = fault_is_write(uc);
    const bool mapped = si->si_code == SEGV_ACCERR;
    // A write into readable memory (read-only data) cannot be absorbed without losing it.
    const bool harmless = !t_stacks.is_guard(a) && !(mapped && write && readable(page));
    if (harmless) {
      void* r = mmap(reinterpret_cast<void*>(page), t_stacks.page, PROT_READ | PROT_WRITE,
                     MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (r == reinterpret_cast<void*>(page)) {
        fs.pages[fs.npages] = page;
        fs.was_mapped[fs.npages] = mapped;
        ++fs.npages;
        if (!fs.faulted) {
          fs.faulted = true;
          fs.addr = a;
          fs.write = write;
        }
        return;
      }
    }
  }
  chain(sig, si, uc);
}

void install_handler() {
  std::call_once(g_install_once, [] {
    if (pipe(g_probe_pipe) == 0) {
      fcntl(g_probe_pipe[0], F_SETFL, O_NONBLOCK);
      fcntl(g_probe_pipe[1], F_SETFL, O_NONBLOCK);
    } else {
      g_probe_pipe[0] = g_probe_pipe[1] = -1;
    }
    struct sigaction sa;
    std::memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    // On the thread's alternate stack where it has one (Rust gives every thread one), so a
    // fiber that overflowed its stack still gets a handler that can report it.
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_prev_segv);
  });
}

/// Puts every absorbed page back as it was seen: inaccessible, or unmapped.
void end_faults(FaultState& fs) {
  fs.active = 0;
  for (unsigned int i = 0; i < fs.npages; ++i) {
    void* p = reinterpret_cast<void*>(fs.pages[i]);
    if (fs.was_mapped[i])
      mmap(p, t_stacks.page, PROT_NONE, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
           -1, 0);
    else
      munmap(p, t_stacks.page);
  }
  fs.npages = 0;
}

// ---- Fiber scheduling ------------------------------------------------------------------------
void fiber_main(void* arg) {
  Fiber* f = static_cast<Fiber*>(arg);
  Sched* s = t_sched;
  s->kernel->call(s->params);
  f->done = true;
  Block& blk = *f->t.block;
  ++blk.events;
  f->t.warp->live &= ~(1u << f->t.lane);
  leave(blk.bar);
  leave(f->t.warp->bar);
  ctx_switch(&f->ctx, &s->ctx);
  std::abort();  // a finished fiber is never resumed
}

/// Runs one block's threads round-robin until all return; false on a deadlock (a round in which
/// no thread arrived anywhere or returned: threads wait at barriers others never reach).
bool run_block(Sched& s, Block& blk, std::vector<Fiber>& fibers, unsigned int n) {
  for (unsigned int i = 0; i < n; ++i) {
    Fiber& f = fibers[i];
    f.done = false;
    f.wait_bar = nullptr;
    ctx_init(&f.ctx, t_stacks.bases[i] + t_stacks.page + kStackBytes, &fiber_main, &f);
  }
  unsigned int live = n;
  while (live > 0) {
    const unsigned long before = blk.events;
    for (unsigned int i = 0; i < n; ++i) {
      Fiber& f = fibers[i];
      if (f.done || (f.wait_bar != nullptr && f.wait_bar->gen == f.wait_gen)) continue;
      t_cur = &f.t;
      s.cur = &f;
      ctx_switch(&s.ctx, &f.ctx);
      if (f.done) --live;
    }
    if (live > 0 && blk.events == before) return false;
  }
  return true;
}

// ---- Blocks in flight: lanes ------------------------------------------------------------------
// A GPU runs many blocks of a launch at once, in no promised order. Here the blocks of a launch
// run in a seeded order on kLanes lanes, each lane an OS thread of its own (so each in-flight
// block has its own `__shared__` storage, which is thread_local) running its block's CUDA
// threads as fibers. One lane runs at a time, handing over after a scheduler round (every live
// thread ran until it waited at a barrier or returned) when a seeded coin says so: blocks
// interleave at barriers, deterministically for a seed. A kernel that assumes blocks run in
// index order, or one after the other, then computes something else.
constexpr unsigned int kLanes = 2;
std::atomic<int> g_lanes_on{1};
std::atomic<unsigned long long> g_block_seed{0x6b7662656e6368ull};
// Bumped by every change of the order: each launching thread restarts its launch count.
std::atomic<unsigned long long> g_block_gen{0};

std::uint64_t splitmix(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

struct Job {
  const KernelEntry* k = nullptr;
  unsigned int grid[3];
  unsigned int block[3];
  void** params = nullptr;
  std::vector<std::uint64_t> order;  // linear block indices, shuffled
  std::size_t next = 0;
  std::uint64_t rng = 0;
  std::mutex m;
  std::condition_variable cv;
  int turn = 0;  // the lane that may run
  bool lane_done[kLanes] = {};
  unsigned int done = 0;
  bool failed = false;  // a lane could not start (stacks)
  bool deadlock = false;
  bool faulted = false;
  std::uintptr_t fault_addr = 0;
  int fault_write = 0;
  char reason[256] = {};
  unsigned long long kv_bytes = 0;
};

// The lane that runs next: another lane not yet done, chosen by the job's coin.
void hand_over(Job& j, unsigned int from) {
  for (unsigned int i = 1; i <= kLanes; ++i) {
    const unsigned int o = (from + i) % kLanes;
    if (!j.lane_done[o]) {
      j.turn = (int)o;
      j.cv.notify_all();
      return;
    }
  }
  j.turn = -1;
  j.cv.notify_all();
}

void lane_run(Job& j, unsigned int lane) {
  static thread_local bool alt = false;
  if (!alt) {
    // A signal handler stack, so a fiber that overflowed its stack is still reported.
    static thread_local char altstack[64 * 1024];
    stack_t ss;
    ss.ss_sp = altstack;
    ss.ss_size = sizeof altstack;
    ss.ss_flags = 0;
    sigaltstack(&ss, nullptr);
    alt = true;
  }
  const unsigned int n = j.block[0] * j.block[1] * j.block[2];
  std::unique_lock<std::mutex> l(j.m);
  j.cv.wait(l, [&] { return j.turn == (int)lane; });
  if (!t_stacks.grow_to(n)) {
    j.failed = true;
    j.lane_done[lane] = true;
    ++j.done;
    hand_over(j, lane);
    return;
  }
  Sched s;
  s.kernel = j.k;
  s.params = j.params;
  t_sched = &s;
  std::unique_ptr<Block> blk(new Block());
  std::vector<Thread> threads;
  std::vector<Fiber> fibers(n);
  FaultState& fs = t_fault;
  fs.faulted = false;
  fs.npages = 0;
  fs.active = 1;
  t_kv_read_bytes = 0;
  bool have = false;
  unsigned int live = 0;
  while (true) {
    if (!have) {
      if (j.next >= j.order.size() || j.deadlock) break;
      const std::uint64_t b = j.order[j.next++];
      const unsigned int bx = unsigned(b % j.grid[0]);
      const unsigned int by = unsigned(b / j.grid[0] % j.grid[1]);
      const unsigned int bz = unsigned(b / (std::uint64_t(j.grid[0]) * j.grid[1]));
      init_block(*blk, j.grid, j.block, bx, by, bz, threads);
      for (unsigned int i = 0; i < n; ++i) {
        Fiber& f = fibers[i];
        f.t = threads[i];
        f.done = false;
        f.wait_bar = nullptr;
        ctx_init(&f.ctx, t_stacks.bases[i] + t_stacks.page + kStackBytes, &fiber_main, &f);
      }
      live = n;
      have = true;
    }
    const unsigned long before = blk->events;
    for (unsigned int i = 0; i < n; ++i) {
      Fiber& f = fibers[i];
      if (f.done || (f.wait_bar != nullptr && f.wait_bar->gen == f.wait_gen)) continue;
      t_cur = &f.t;
      s.cur = &f;
      ctx_switch(&s.ctx, &f.ctx);
      if (f.done) --live;
    }
    if (live == 0) {
      have = false;
    } else if (blk->events == before) {
      j.deadlock = true;
      std::snprintf(j.reason, sizeof j.reason,
                    "deadlock in block (%u, %u, %u): threads wait at a barrier that the "
                    "other threads of the block never reach",
                    blk->dims.idx.x, blk->dims.idx.y, blk->dims.idx.z);
      break;
    }
    if (splitmix(j.rng) & 1u) {
      hand_over(j, lane);
      j.cv.wait(l, [&] { return j.turn == (int)lane; });
    }
  }
  end_faults(fs);
  if (fs.faulted && !j.faulted) {
    j.faulted = true;
    j.fault_addr = fs.addr;
    j.fault_write = fs.write;
  }
  j.kv_bytes += t_kv_read_bytes;
  t_kv_read_bytes = 0;
  t_sched = nullptr;
  t_cur = nullptr;
  j.lane_done[lane] = true;
  ++j.done;
  hand_over(j, lane);
}

/// The lanes of one launching thread, started on its first launch and kept (their fiber
/// stacks with them) until that thread ends.
struct LanePool {
  std::thread th[kLanes];
  std::mutex m;
  std::condition_variable cv;
  Job* job = nullptr;
  unsigned long gen = 0;
  bool quit = false;
  LanePool() {
    for (unsigned int i = 0; i < kLanes; ++i)
      th[i] = std::thread([this, i] {
        unsigned long seen = 0;
        while (true) {
          Job* j;
          {
            std::unique_lock<std::mutex> l(m);
            cv.wait(l, [&] { return quit || gen != seen; });
            if (quit) return;
            seen = gen;
            j = job;
          }
          lane_run(*j, i);
        }
      });
  }
  ~LanePool() {
    {
      std::lock_guard<std::mutex> l(m);
      quit = true;
    }
    cv.notify_all();
    for (auto& t : th) t.join();
  }
};

/// Runs the launch on the lanes; LAUNCH_OK, LAUNCH_BAD (deadlock, stacks) or LAUNCH_FAULT.
int launch_on_lanes(const KernelEntry* k, const unsigned int grid[3], const unsigned int block[3],
                    void** params, LaunchResult* res) {
  static thread_local std::unique_ptr<LanePool> pool;
  static thread_local std::uint64_t launches = 0;
  static thread_local std::uint64_t gen = 0;
  if (!pool) pool.reset(new LanePool());
  const std::uint64_t g = g_block_gen.load(std::memory_order_relaxed);
  if (g != gen) {
    gen = g;
    launches = 0;
  }
  install_handler();
  Job j;
  j.k = k;
  for (int i = 0; i < 3; ++i) {
    j.grid[i] = grid[i];
    j.block[i] = block[i];
  }
  j.params = params;
  const std::uint64_t nblocks = std::uint64_t(grid[0]) * grid[1] * grid[2];
  j.order.resize(nblocks);
  for (std::uint64_t b = 0; b < nblocks; ++b) j.order[b] = b;
  // Seeded per launch of this thread since the order was last set: a stream's launches get
  // the same orders run to run.
  std::uint64_t x = g_block_seed.load(std::memory_order_relaxed) ^ (0x51ed27u * ++launches);
  for (std::uint64_t b = nblocks; b > 1; --b) std::swap(j.order[b - 1], j.order[splitmix(x) % b]);
  j.rng = splitmix(x);
  j.turn = 0;
  {
    std::lock_guard<std::mutex> l(pool->m);
    pool->job = &j;
    ++pool->gen;
  }
  pool->cv.notify_all();
  {
    std::unique_lock<std::mutex> l(j.m);
    j.cv.wait(l, [&] { return j.done == kLanes; });
  }
  g_kv_read_bytes.fetch_add(j.kv_bytes, std::memory_order_relaxed);
  if (j.failed) return bad(res, "cannot map %llu fiber stacks of %llu bytes", block[0] * block[1] * block[2], kStackBytes);
  if (j.faulted) {
    res->fault_addr = j.fault_addr;
    res->fault_write = j.fault_write;
    return LAUNCH_FAULT;
  }
  if (j.deadlock) {
    std::memcpy(res->reason, j.reason, sizeof res->reason);
    return LAUNCH_BAD;
  }
  return LAUNCH_OK;
}
#endif

}  // namespace

int launch_entry(const KernelEntry* k, const unsigned int grid[3], const unsigned int block[3],
                 unsigned int dynamic_shared_bytes, void** params, std::size_t nparams,
                 LaunchResult* res) {
  res->fault_addr = 0;
  res->fault_write = 0;
  res->reason[0] = 0;
  const int v = validate(k, grid, block, dynamic_shared_bytes, params, nparams, res);
  if (v != LAUNCH_OK) return v;
  const unsigned int n = block[0] * block[1] * block[2];
  Thread* const saved_cur = t_cur;
  Block* blk = new Block();
  std::vector<Thread> threads;
#ifdef EMU_OS_THREADS
  // One OS thread per CUDA thread for the whole launch; they run the blocks in turn, meeting
  // at a launch-wide barrier between blocks (blocks share the static `__shared__` storage).
  const std::size_t nblocks = std::size_t(grid[0]) * grid[1] * grid[2];
  std::unique_ptr<Block[]> blocks(new Block[nblocks]);
  for (std::size_t b = 0; b < nblocks; ++b)
    init_block(blocks[b], grid, block, unsigned(b % grid[0]), unsigned(b / grid[0] % grid[1]),
               unsigned(b / (std::size_t(grid[0]) * grid[1])), threads);
  Barrier between;
  between.expected = n;
  std::vector<std::thread> ts;
  ts.reserve(n);
  for (unsigned int i = 0; i < n; ++i)
    ts.emplace_back([&, i] {
      for (std::size_t b = 0; b < nblocks; ++b) {
        Thread t = threads[i];
        t.block = &blocks[b];
        t.warp = &blocks[b].warps[i / 32];
        t_cur = &t;
        t_kv_read_bytes = 0;
        k->call(params);
        g_kv_read_bytes.fetch_add(t_kv_read_bytes, std::memory_order_relaxed);
        leave(blocks[b].bar);
        leave(t.warp->bar);
        arrive(between, blocks[b]);
      }
    });
  for (auto& t : ts) t.join();
  delete blk;
  // (Each CUDA thread counted on its own OS thread: those counts were added as it ended.)
  t_cur = saved_cur;
  return LAUNCH_OK;
#else
  if (g_lanes_on.load(std::memory_order_relaxed)) {
    delete blk;
    t_cur = saved_cur;
    return launch_on_lanes(k, grid, block, params, res);
  }
  if (!t_stacks.grow_to(n)) {
    delete blk;
    return bad(res, "cannot map %llu fiber stacks of %llu bytes", n, kStackBytes);
  }
  install_handler();
  Sched s;
  s.kernel = k;
  s.params = params;
  Sched* const saved_sched = t_sched;
  t_sched = &s;
  std::vector<Fiber> fibers(n);
  FaultState& fs = t_fault;
  fs.faulted = false;
  fs.npages = 0;
  fs.active = 1;
  t_kv_read_bytes = 0;
  bool deadlock = false;
  for (unsigned int bz = 0; bz < grid[2] && !deadlock; ++bz)
    for (unsigned int by = 0; by < grid[1] && !deadlock; ++by)
      for (unsigned int bx = 0; bx < grid[0] && !deadlock; ++bx) {
        init_block(*blk, grid, block, bx, by, bz, threads);
        for (unsigned int i = 0; i < n; ++i) fibers[i].t = threads[i];
        if (!run_block(s, *blk, fibers, n)) {
          deadlock = true;
          std::snprintf(res->reason, sizeof res->reason,
                        "deadlock in block (%u, %u, %u): threads wait at a barrier that the "
                        "other threads of the block never reach",
                        bx, by, bz);
        }
      }
  end_faults(fs);
  g_kv_read_bytes.fetch_add(t_kv_read_bytes, std::memory_order_relaxed);
  t_sched = saved_sched;
  t_cur = saved_cur;
  delete blk;
  if (fs.faulted) {
    res->fault_addr = fs.addr;
    res->fault_write = fs.write;
    return LAUNCH_FAULT;
  }
  return deadlock ? LAUNCH_BAD : LAUNCH_OK;
#endif
}

}  // namespace emu

/// Block order: `on` nonzero runs each launch's blocks in an order seeded by `seed`, two in
/// flight, interleaved at barriers; zero runs them one at a time in index order.
extern "C" void emu_set_block_order(int on, unsigned long long seed) {
#ifndef EMU_OS_THREADS
  ::emu::g_lanes_on.store(on, std::memory_order_relaxed);
  ::emu::g_block_seed.store(seed, std::memory_order_relaxed);
  ::emu::g_block_gen.fetch_add(1, std::memory_order_relaxed);
#else
  (void)on;
  (void)seed;
#endif
}

/// The K/V bytes counted since the last call (every launch of the process), and a reset.
extern "C" unsigned long long emu_kv_read_bytes_take() {
  return ::emu::g_kv_read_bytes.exchange(0, std::memory_order_relaxed);
}
