// tcexport runtime thread pool: inlined before prelude.h (which uses it) into every generated translation unit.
//
// Why not OpenMP: a `parallel for` per kernel is a fork/join per kernel, every team thread must reach the join
// barrier even when it had no work, and waiting threads spin. On a quiet machine that costs microseconds; on a busy
// one (a server) a worker the scheduler has not run holds every kernel up for a whole time slice, so a call got
// 30-70x slower. Here work is cut into chunks that threads *claim*: the calling thread claims chunks too and waits
// only for chunks someone has started, so a sleeping worker delays nothing. Workers spin briefly (the next kernel
// comes within microseconds), then sleep. A call that finds the pool taken by a concurrent call runs its kernels
// on its own thread: several requests at once then each use one core instead of oversubscribing them all.
// A forked child (a prefork server) starts workers of its own; libgomp's pool could not be used after fork.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <vector>
#include <condition_variable>
#include <mutex>
#include <new>
#include <thread>
#include <sched.h>
#include <unistd.h>

namespace {

inline void tc_cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// fn(arg, chunk) for chunk in [0, chunks)
typedef void (*tc_chunk_fn)(void*, int64_t);

class tc_pool {
 public:
  static constexpr int64_t kMaxChunks = 0xffff;

  ~tc_pool() { stop_workers(); }

  // Runs fn(arg, c) for every chunk c on up to ``nt`` threads (this one included); returns when all are done.
  void run(int nt, int64_t chunks, tc_chunk_fn fn, void* arg) {
    if (chunks <= 0) return;
    bool idle = false;
    if (nt <= 1 || chunks == 1 || !busy_.compare_exchange_strong(idle, true, std::memory_order_acquire)) {
      for (int64_t c = 0; c < chunks; ++c) fn(arg, c);  // one thread, or another call holds the pool
      return;
    }
    ensure_workers(nt - 1);
    active_.store(nt - 1, std::memory_order_relaxed);
    fn_ = fn;
    arg_ = arg;
    done_.store(0, std::memory_order_relaxed);
    generation_ = (generation_ + 1) & 0xffffffffu;
    claim_.store((generation_ << 32) | (uint64_t(chunks) << 16), std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(mutex_);
      wake_.notify_all();
    }
    int64_t mine = 0;
    while (claim_one()) ++mine;
    // wait only for chunks other threads have claimed; yield so a descheduled one can finish its chunk
    for (int spin = 0; done_.load(std::memory_order_acquire) + mine < chunks; ++spin) {
      if (spin < 4096) tc_cpu_relax();
      else sched_yield();
    }
    busy_.store(false, std::memory_order_release);
  }

 private:
  // claim_ = generation (32 bits) | chunk count (16) | next unclaimed chunk (16): one word, so a late worker can
  // never claim a chunk of a job that is over (its generation is gone) or read a job that is being written.
  bool claim_one(bool count_done = false) {
    uint64_t w = claim_.load(std::memory_order_acquire);
    while ((w & 0xffff) < ((w >> 16) & 0xffff)) {
      if (claim_.compare_exchange_weak(w, w + 1, std::memory_order_acq_rel)) {
        fn_(arg_, int64_t(w & 0xffff));
        if (count_done) done_.fetch_add(1, std::memory_order_release);
        return true;
      }
    }
    return false;
  }

  bool has_work(int index) const {
    const uint64_t w = claim_.load(std::memory_order_seq_cst);
    return (w & 0xffff) < ((w >> 16) & 0xffff) && index < active_.load(std::memory_order_relaxed);
  }

  // worker ``index`` takes part only while index < active_ (a call that wants fewer threads than exist)
  void worker(int index) {
    using clock = std::chrono::steady_clock;
    for (;;) {
      const auto until = clock::now() + std::chrono::microseconds(50);
      for (int spin = 0; !has_work(index) && !stop_.load(std::memory_order_relaxed); ++spin) {
        tc_cpu_relax();
        if ((spin & 63) == 63 && clock::now() > until) {
          std::unique_lock<std::mutex> lock(mutex_);
          sleepers_.fetch_add(1, std::memory_order_seq_cst);
          wake_.wait(lock, [&] { return has_work(index) || stop_.load(std::memory_order_relaxed); });
          sleepers_.fetch_sub(1, std::memory_order_relaxed);
          break;
        }
      }
      if (stop_.load(std::memory_order_relaxed)) return;
      while (claim_one(true)) {
      }
    }
  }

  void ensure_workers(int wanted) {
    const pid_t pid = getpid();
    if (pid != pid_) {  // a forked child: start workers of its own
      // The parent's workers were not copied (leaked, never joined); one may have held the mutex at the fork.
      threads_.clear();
      new (&mutex_) std::mutex();
      new (&wake_) std::condition_variable();
      sleepers_.store(0);
      pid_ = pid;
    }
    while (int(threads_.size()) < wanted) {
      const int index = int(threads_.size());
      threads_.push_back(new std::thread([this, index] { worker(index); }));
    }
  }

  void stop_workers() {
    if (getpid() != pid_) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_.store(true);
      wake_.notify_all();
    }
    for (std::thread* t : threads_) {
      t->join();
      delete t;
    }
    threads_.clear();
  }

  std::atomic<bool> busy_{false};
  std::atomic<uint64_t> claim_{0};
  std::atomic<int64_t> done_{0};
  std::atomic<int> sleepers_{0};
  std::atomic<int> active_{0};
  std::atomic<bool> stop_{false};
  uint64_t generation_ = 0;
  tc_chunk_fn fn_ = nullptr;
  void* arg_ = nullptr;
  pid_t pid_ = getpid();
  std::vector<std::thread*> threads_;
  std::mutex mutex_;
  std::condition_variable wake_;
};

// The library's one pool: made on first use, its workers joined when the library is unloaded.
inline tc_pool& tc_the_pool() {
  static tc_pool pool;
  return pool;
}

// body(lo, hi) over [0, n) in at most ``chunks`` contiguous pieces, on up to ``nt`` threads.
template <typename Body>
inline void tc_parallel_range(int nt, int64_t n, int64_t chunks, const Body& body) {
  chunks = std::max<int64_t>(1, std::min<int64_t>({chunks, n, tc_pool::kMaxChunks}));
  struct Job {
    const Body* body;
    int64_t n, chunks;
  } job{&body, n, chunks};
  tc_the_pool().run(nt, chunks, [](void* p, int64_t c) {
    const Job& j = *static_cast<const Job*>(p);
    (*j.body)(c * j.n / j.chunks, (c + 1) * j.n / j.chunks);
  }, &job);
}

}  // namespace
