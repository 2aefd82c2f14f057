// SPDX-License-Identifier: Apache-2.0
#pragma once
// The CPU kernels' threads: one process-wide pool of (cores - 1) workers started on first use and kept, so a decode
// call costs no thread creation (an engine calls it once per layer per step). The calling thread takes part. Items
// are handed out one at a time from an atomic counter, so sequences of different lengths balance across threads.
// One job runs at a time; a call that finds the pool busy (another thread's call) runs its items itself, and so
// does a call in a child process after fork() (the child has none of the parent's threads), and so does a call made
// after the pool was shut down at exit (from a static object's destructor): the pool is gone, the caller is not.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

#include <unistd.h>

namespace kvpager::kernels::detail {

class worker_pool {
 public:
  /// The process-wide pool, started on first use; nullptr once it has been shut down at exit (static destruction
  /// runs after the pool's shutdown for every static object constructed before the pool's first use).
  static worker_pool* instance() {
    // Deleted at exit only by the process that started the threads: in a forked child, destroying the mutexes and
    // condition variables the parent's threads were waiting on can block forever, so the child leaves it alone.
    // `current` is trivially destructible, so it is still readable (and null) when a later destructor calls in.
    static std::atomic<worker_pool*> current{nullptr};
    static const struct shutdown {
      shutdown() { current.store(new worker_pool(), std::memory_order_release); }
      shutdown(const shutdown&) = delete;
      shutdown& operator=(const shutdown&) = delete;
      ~shutdown() {
        worker_pool* p = current.exchange(nullptr, std::memory_order_acq_rel);
        if (p != nullptr && getpid() == p->owner_) delete p;
      }
    } at_exit;
    return current.load(std::memory_order_acquire);
  }
  worker_pool(const worker_pool&) = delete;
  worker_pool& operator=(const worker_pool&) = delete;
  ~worker_pool() {
    {
      const std::lock_guard<std::mutex> lk(m_);
      stop_ = true;
    }
    cv_.notify_all();
    for (auto& t : workers_) t.join();
  }

  /// Calls fn(i) for every i in [0, n) on up to `threads` threads (0 = all cores), the caller included.
  template <class Fn>
  void run(std::int64_t n, std::int32_t threads, Fn& fn) {
    const auto cores = static_cast<std::int64_t>(workers_.size()) + 1;
    const std::int64_t want = std::min<std::int64_t>({threads > 0 ? threads : cores, cores, n});
    std::unique_lock<std::mutex> job(job_mutex_, std::try_to_lock);
    if (want <= 1 || !job.owns_lock() || getpid() != owner_) {
      for (std::int64_t i = 0; i < n; ++i) fn(i);
      return;
    }
    {
      const std::lock_guard<std::mutex> lk(m_);
      call_ = [](void* ctx, std::int64_t i) { (*static_cast<Fn*>(ctx))(i); };
      ctx_ = &fn;
      n_ = n;
      next_.store(0, std::memory_order_relaxed);
      helpers_ = static_cast<unsigned>(want - 1);
      finished_ = 0;
      ++generation_;
      published_.store(generation_, std::memory_order_release);
    }
    cv_.notify_all();
    drain();
    std::unique_lock<std::mutex> lk(m_);
    done_.wait(lk, [&] { return finished_ == helpers_; });
  }

 private:
  worker_pool() : owner_(getpid()) {
    const unsigned cores = std::max(1U, std::thread::hardware_concurrency());
    workers_.reserve(cores - 1);
    for (unsigned w = 0; w + 1 < cores; ++w) workers_.emplace_back([this, w] { loop(w); });
  }
  static void pause() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#else
    std::this_thread::yield();
#endif
  }
  void drain() {
    for (std::int64_t i = next_.fetch_add(1, std::memory_order_relaxed); i < n_; i = next_.fetch_add(1, std::memory_order_relaxed))
      call_(ctx_, i);
  }
  void loop(unsigned index) {
    std::uint64_t seen = 0;
    std::unique_lock<std::mutex> lk(m_);
    for (;;) {
      // Decode calls come in bursts (one per layer): spin briefly (~tens of microseconds) before sleeping, so the
      // next call does not pay a wake-up.
      lk.unlock();
      for (int spin = 0; spin < 4096 && published_.load(std::memory_order_acquire) == seen; ++spin) pause();
      lk.lock();
      cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (index >= helpers_) continue;  // this job asked for fewer threads
      lk.unlock();
      drain();
      lk.lock();
      if (++finished_ == helpers_) done_.notify_one();
    }
  }

  pid_t owner_;           // the process whose threads these are
  std::mutex job_mutex_;  // one job at a time
  std::mutex m_;          // guards the fields below
  std::condition_variable cv_, done_;
  std::vector<std::thread> workers_;
  bool stop_ = false;
  std::uint64_t generation_ = 0;
  void (*call_)(void*, std::int64_t) = nullptr;
  void* ctx_ = nullptr;
  std::int64_t n_ = 0;
  std::atomic<std::int64_t> next_{0};
  std::atomic<std::uint64_t> published_{0};
  unsigned helpers_ = 0, finished_ = 0;
};

/// Runs fn(i) for i in [0, n) on up to `threads` threads (0 = all cores) of the process-wide pool; on the calling
/// thread alone once the pool has been shut down at exit.
template <class Fn>
void parallel_for(std::int64_t n, std::int32_t threads, Fn fn) {
  if (n <= 0) return;
  if (worker_pool* pool = worker_pool::instance(); pool != nullptr) {
    pool->run(n, threads, fn);
  } else {
    for (std::int64_t i = 0; i < n; ++i) fn(i);
  }
}

}  // namespace kvpager::kernels::detail
