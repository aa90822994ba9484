// Two-thread column splits for the row kernels of few-row products (decode steps, verify windows).
//
// A decode step of a small model is dozens of products of ~0.1–1 MB of weights each, ~10 µs
// apiece. Handing half of one to a thread woken through a condition variable costs about as much
// as the product (a futex wake and a context switch), so such products used to run on one core
// and a decode step read its weights at one core's bandwidth. Here one persistent helper spins
// between products for a short while (SPIN_WINDOW), so a split costs well under a microsecond
// while a step is running, and goes to sleep when the process stops decoding. Splitting columns
// never changes a column's arithmetic: a row's bits do not depend on how the work is divided.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace mlxr {

// A hint to the core that this thread is busy-waiting.
inline void spin_relax() {
#if defined(__x86_64__) || defined(_M_X64)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#else
  std::this_thread::yield();
#endif
}

class RowSplit {
 public:
  // How long the helper keeps spinning after its last job before it sleeps: longer than the gap
  // between two products of one step (a few small ops), far shorter than a pause between requests.
  static constexpr std::chrono::microseconds SPIN_WINDOW{200};

  // The one helper of the process (never destroyed: its thread lives as long as the process).
  static RowSplit& get() {
    static RowSplit* s = new RowSplit();
    return *s;
  }

  // Whether a second core exists to split onto.
  static bool available() {
    static const bool yes = std::thread::hardware_concurrency() >= 2;
    return yes;
  }

  // Runs `mine` on this thread and offers `theirs` to the helper; returns once `mine` is over and
  // the helper has either finished `theirs` or never started it (the offer is then withdrawn). The
  // two must share their work out (each piece taken by one of them, as `split_columns` takes
  // column chunks against a shared count), so `mine` alone does all of it when the helper does
  // not come. False (nothing run) if the helper is serving another caller.
  template <class F, class G>
  bool share(F&& theirs, G&& mine) {
    std::unique_lock<std::mutex> busy(use_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    std::function<void()> job(std::ref(theirs));
    job_.store(&job);  // seq_cst with `sleeping_` below: the helper sees the job or we see it asleep
    if (sleeping_.load()) {
      std::lock_guard<std::mutex> lk(m_);
      ++wakes_;
      wake_.notify_one();
    }
    try {
      mine();
    } catch (...) {
      settle(&job);
      throw;
    }
    settle(&job);
    return true;
  }

 private:
  RowSplit() : thread_([this] { loop(); }) { thread_.detach(); }

  // Once the caller's part is done: withdraws the offer if the helper has not taken it (it may
  // be descheduled or asleep: a fixed half handed to it would keep the caller waiting);
  // otherwise waits for its run.
  void settle(std::function<void()>* job) {
    std::function<void()>* offered = job;
    if (!job_.compare_exchange_strong(offered, nullptr)) {
      while (job_.load(std::memory_order_acquire) != nullptr) spin_relax();
    }
  }

  // What `job_` holds while the helper runs a job it took.
  static std::function<void()>* taken() {
    static std::function<void()> marker;
    return &marker;
  }

  // A job offered and not yet taken (seq_cst: pairs with the caller's store then `sleeping_` load).
  bool offered() const {
    auto* j = job_.load();
    return j != nullptr && j != taken();
  }

  void loop() {
    for (;;) {
      std::function<void()>* job = nullptr;
      auto idle_since = std::chrono::steady_clock::now();
      for (unsigned n = 1;; ++n) {
        job = job_.load(std::memory_order_acquire);
        // Take the job unless the caller withdrew it first.
        if (job != nullptr && job != taken() && job_.compare_exchange_strong(job, taken())) break;
        // Yield rather than pause: on a machine with as many busy threads as cores (graph
        // building, the stream's kernels), a pausing spinner would take a core from them.
        std::this_thread::yield();
        if (n % 16 == 0 && std::chrono::steady_clock::now() - idle_since > SPIN_WINDOW) {
          std::unique_lock<std::mutex> lk(m_);
          sleeping_.store(true);
          // Any wake-up restarts the spin window, even if the caller has since withdrawn its
          // offer: the products that follow it find the helper spinning.
          const unsigned seen = wakes_;
          wake_.wait(lk, [&] { return wakes_ != seen || offered(); });
          sleeping_.store(false);
          idle_since = std::chrono::steady_clock::now();
        }
      }
      (*job)();
      job_.store(nullptr, std::memory_order_release);  // publishes the job's writes to the caller
    }
  }

  std::mutex use_, m_;
  std::condition_variable wake_;
  std::atomic<std::function<void()>*> job_{nullptr};
  std::atomic<bool> sleeping_{false};
  unsigned wakes_ = 0;  // wake-ups sent (guarded by m_)
  std::thread thread_;
};

// Runs `block(n0, n1)` over the N output columns of a few-row product, shared with the helper
// when the product holds `work` ≥ ~16K multiply-adds (below that even a spinning hand-over costs
// more than it saves): in chunks (multiples of 4 columns, the kernels' block of weight rows) that
// this thread takes from the front and the helper from the back against one count, so each
// streams its weights in order and they meet wherever their speeds put the boundary. A helper
// that is descheduled (the graph's builder, a third thread, shares the two cores) or asleep
// leaves its chunks to this thread instead of making it wait. Columns never change their
// arithmetic, so neither does the split.
template <class F>
void split_columns(int N, size_t work, F&& block) {
  if (!RowSplit::available() || work < (size_t(1) << 14) || N < 16) return block(0, N);
  constexpr int kChunks = 16;
  const int step = std::max(4, ((N + kChunks - 1) / kChunks + 3) & ~3);
  const int chunks = (N + step - 1) / step;
  std::atomic<int> claimed{0};
  auto chunk = [&](int c) { block(c * step, std::min(N, (c + 1) * step)); };
  auto front = [&] {
    for (int c = 0; claimed.fetch_add(1, std::memory_order_relaxed) < chunks; ++c) chunk(c);
  };
  auto back = [&] {
    for (int c = chunks - 1; claimed.fetch_add(1, std::memory_order_relaxed) < chunks; --c) chunk(c);
  };
  if (!RowSplit::get().share(back, front)) block(0, N);
}

}  // namespace mlxr
