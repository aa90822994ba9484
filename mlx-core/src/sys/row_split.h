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

  // Runs `theirs` on the helper while the caller runs `mine`, and returns when both are done;
  // false (nothing run) if the helper is serving another caller.
  template <class F, class G>
  bool split(F&& theirs, G&& mine) {
    std::unique_lock<std::mutex> busy(use_, std::try_to_lock);
    if (!busy.owns_lock()) return false;
    std::function<void()> job(std::forward<F>(theirs));
    job_.store(&job);  // seq_cst with `sleeping_` below: the helper sees the job or we see it asleep
    if (sleeping_.load()) {
      std::lock_guard<std::mutex> lk(m_);
      wake_.notify_one();
    }
    mine();
    while (job_.load(std::memory_order_acquire) != nullptr) spin_relax();
    return true;
  }

 private:
  RowSplit() : thread_([this] { loop(); }) { thread_.detach(); }

  void loop() {
    for (;;) {
      std::function<void()>* job = nullptr;
      auto idle_since = std::chrono::steady_clock::now();
      for (unsigned n = 1; (job = job_.load(std::memory_order_acquire)) == nullptr; ++n) {
        // Yield rather than pause: on a machine with as many busy threads as cores (graph
        // building, the stream's kernels), a pausing spinner would take a core from them.
        std::this_thread::yield();
        if (n % 16 == 0 && std::chrono::steady_clock::now() - idle_since > SPIN_WINDOW) {
          std::unique_lock<std::mutex> lk(m_);
          sleeping_.store(true);
          wake_.wait(lk, [this] { return job_.load() != nullptr; });
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
  std::thread thread_;
};

// Runs `block(n0, n1)` over the N output columns of a few-row product, split in two (at a
// multiple of 4, the kernels' block of weight rows) over the helper and this thread when the
// product holds `work` ≥ ~16K multiply-adds: below that even a spinning hand-over costs more
// than it saves. Columns never change their arithmetic, so neither does the split.
template <class F>
void split_columns(int N, size_t work, F&& block) {
  if (!RowSplit::available() || work < (size_t(1) << 14) || N < 16) return block(0, N);
  const int mid = ((N / 2) + 3) & ~3;
  if (!RowSplit::get().split([&] { block(mid, N); }, [&] { block(0, mid); })) block(0, N);
}

}  // namespace mlxr
