// Sampling rows of f32 logits on the CPU in one graph node each: the filtered, tempered
// distribution of every row (`row_probs`), and an inverse-CDF draw per row from weights or
// from a residual max(p − q, 0) (`row_draw`).
//
// Composed from MLX's ops, one speculative-sampling round took about a hundred graph nodes for
// these (a logsumexp, a sort for top-p, a softmax and a cumulative-sum draw per row, each ~10 µs
// of scheduling on a CPU whatever its size), and MLX evaluates exp and log one element at a
// time. Here a row costs one pass of exponentials plus, for top-p, a partial sort of the
// nucleus. The filters follow mlx-lm's sampler: on the logprobs, top-p, then min-p, then top-k,
// then 1/T, then softmax. The law is the composed pipeline's; only the rounding of the sums
// differs (and which of several exactly equal values a top-k or min-p keep-count keeps).
#include "mlx-core/src/sys/shim.h"
#include "mlx-core/src/sys/row_kernel.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

namespace mlxr {
namespace {

struct Filter {
  float inv_t;     // 1/T, applied after the filters
  double top_p;    // nucleus mass, on when 0 < top_p < 1
  float ln_min_p;  // ln(min_p); -inf when min-p is off
  int min_keep;    // tokens min-p keeps whatever their probability
  int top_k;       // 0 = off
  bool filters() const { return (top_p > 0.0 && top_p < 1.0) || std::isfinite(ln_min_p) || top_k > 0; }
};

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Indices of the `k` largest `x` first, in descending order of `x` (ties in index order).
void top_indices(const float* x, std::vector<int>& idx, int k) {
  const int V = static_cast<int>(idx.size());
  auto desc = [x](int a, int b) { return x[a] > x[b] || (x[a] == x[b] && a < b); };
  if (k < V) std::nth_element(idx.begin(), idx.begin() + k, idx.end(), desc);
  std::sort(idx.begin(), idx.begin() + std::min(k, V), desc);
}

// One row: logits `l` [V] -> probabilities `p` [V] (`p` doubles as scratch for the logprobs).
void probs_row(const float* l, float* p, int V, const Filter& f, std::vector<int>& idx, std::vector<float>& e) {
  if (!f.filters()) {
    // softmax(l / T): the logprobs' shift cancels in the softmax.
    float m = kNegInf;
    for (int i = 0; i < V; ++i) {
      p[i] = f.inv_t == 1.0f ? l[i] : l[i] * f.inv_t;
      m = std::max(m, p[i]);
    }
    float s = 0.0f;
    for (int i = 0; i < V; ++i) s += (p[i] = std::exp(p[i] - m));
    for (int i = 0; i < V; ++i) p[i] /= s;
    return;
  }
  // Logprobs: l − (m + ln Σ exp(l − m)); e_i = exp(l_i − m) is p_i up to the factor 1/s.
  float m = kNegInf;
  for (int i = 0; i < V; ++i) m = std::max(m, l[i]);
  e.resize(static_cast<size_t>(V));
  float s = 0.0f;
  for (int i = 0; i < V; ++i) s += (e[i] = std::exp(l[i] - m));
  const float lse = m + std::log(s);
  for (int i = 0; i < V; ++i) p[i] = l[i] - lse;
  idx.resize(static_cast<size_t>(V));
  if (f.top_p > 0.0 && f.top_p < 1.0) {
    // Walk tokens from the most probable: a token stays while the mass before it is under
    // top_p of the total; every token at least as probable as the last one kept stays. Sorting
    // the whole vocabulary for that walk cost ~0.4 ms a row, so the mass is first binned by
    // the bits of e (positive floats order like their bits; 16 bins an octave), the bin
    // holding the cut is found from the top, and only its tokens are sorted.
    const float cut = static_cast<float>(f.top_p) * s;
    constexpr int kShift = 19;
    std::vector<float> bin_mass((0x7f800000u >> kShift) + 1, 0.0f);
    auto bin = [](float x) {
      uint32_t b;
      std::memcpy(&b, &x, 4);
      return static_cast<size_t>(b >> kShift);
    };
    for (int i = 0; i < V; ++i) bin_mass[bin(e[i])] += e[i];
    float before = 0.0f;
    size_t edge = 0;
    for (size_t b = bin_mass.size(); b-- > 0;) {
      if (before + bin_mass[b] >= cut) {
        edge = b;
        break;
      }
      before += bin_mass[b];
    }
    idx.clear();
    for (int i = 0; i < V; ++i)
      if (bin(e[i]) == edge) idx.push_back(i);
    std::sort(idx.begin(), idx.end(), [p](int a, int b) { return p[a] > p[b] || (p[a] == p[b] && a < b); });
    float thr = kNegInf;
    for (size_t j = 0; j < idx.size() && before < cut; ++j) {
      thr = p[idx[j]];
      before += e[idx[j]];
    }
    for (int i = 0; i < V; ++i)
      if (p[i] < thr) p[i] = kNegInf;
    idx.resize(static_cast<size_t>(V));
  }
  if (std::isfinite(f.ln_min_p)) {
    float top = kNegInf;
    for (int i = 0; i < V; ++i) top = std::max(top, p[i]);
    const float floor = top + f.ln_min_p;
    std::vector<char> keep(static_cast<size_t>(V), 0);
    if (f.min_keep > 1) {
      std::iota(idx.begin(), idx.end(), 0);
      top_indices(p, idx, f.min_keep);
      for (int j = 0; j < std::min(f.min_keep, V); ++j) keep[idx[j]] = 1;
    }
    for (int i = 0; i < V; ++i)
      if (p[i] < floor && !keep[i]) p[i] = kNegInf;
  }
  if (f.top_k > 0 && f.top_k < V) {
    std::iota(idx.begin(), idx.end(), 0);
    top_indices(p, idx, f.top_k);
    for (int j = f.top_k; j < V; ++j) p[idx[j]] = kNegInf;
  }
  // softmax(lp / T) over what is left.
  float mx = kNegInf;
  for (int i = 0; i < V; ++i) {
    if (p[i] != kNegInf && f.inv_t != 1.0f) p[i] *= f.inv_t;
    mx = std::max(mx, p[i]);
  }
  float t = 0.0f;
  for (int i = 0; i < V; ++i) t += (p[i] = p[i] == kNegInf ? 0.0f : std::exp(p[i] - mx));
  for (int i = 0; i < V; ++i) p[i] /= t;
}

class RowProbs : public CpuOnlyUnary {
 public:
  RowProbs(mx::Stream s, Filter f) : CpuOnlyUnary(s), f_(f) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    auto held = hold_row_inputs(inputs, out, stream(), "RowProbs");
    mx::cpu::get_command_encoder(stream()).dispatch([x = held[0], out = mx::array::unsafe_weak_copy(out), f = f_]() mutable {
      const int V = x.shape(-1);
      const size_t R = V == 0 ? 0 : x.size() / static_cast<size_t>(V);
      std::vector<int> idx;
      std::vector<float> e;
      for (size_t r = 0; r < R; ++r) probs_row(x.data<float>() + r * V, out.data<float>() + r * V, V, f, idx, e);
    });
  }

  DEFINE_NAME(RowProbs)
  bool is_equivalent(const mx::Primitive& other) const override {
    const Filter& o = static_cast<const RowProbs&>(other).f_;
    return f_.inv_t == o.inv_t && f_.top_p == o.top_p && f_.ln_min_p == o.ln_min_p && f_.min_keep == o.min_keep &&
           f_.top_k == o.top_k;
  }

 private:
  Filter f_;
};

// Inverse-CDF draw from non-negative weights `w` [V] with uniform `u`: the first token of
// positive weight whose running sum (in token order) exceeds u·total; the last positive token if
// u·total rounds up to the total; 0 if no weight is positive.
uint32_t draw_row(const float* w, int V, float u) {
  float total = 0.0f;
  for (int i = 0; i < V; ++i) total += w[i];
  const float x = u * total;
  float run = 0.0f;
  int last = -1;
  for (int i = 0; i < V; ++i) {
    run += w[i];
    if (w[i] > 0.0f) {
      if (run > x) return static_cast<uint32_t>(i);
      last = i;
    }
  }
  return static_cast<uint32_t>(std::max(last, 0));
}

class RowDraw : public CpuOnlyUnary {
 public:
  // inputs: u [R], weights or p [R, V], and with a residual q [R, V].
  RowDraw(mx::Stream s, float empty_mass) : CpuOnlyUnary(s), empty_mass_(empty_mass) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    auto held = hold_row_inputs(inputs, out, stream(), "RowDraw");
    mx::cpu::get_command_encoder(stream()).dispatch([held = std::move(held), out = mx::array::unsafe_weak_copy(out), eps = empty_mass_]() mutable {
      const mx::array& u = held[0];
      const mx::array& w = held[1];
      const int V = w.shape(-1);
      const size_t R = u.size();
      std::vector<float> res(static_cast<size_t>(V));
      for (size_t r = 0; r < R; ++r) {
        const float* p = w.data<float>() + r * V;
        const float* row = p;
        if (held.size() == 3) {
          // The residual max(p − q, 0), or p itself where that mass is (numerically) zero:
          // there p ≤ q everywhere and the row is never drawn from.
          const float* q = held[2].data<float>() + r * V;
          float mass = 0.0f;
          for (int i = 0; i < V; ++i) mass += (res[i] = std::max(p[i] - q[i], 0.0f));
          if (mass > eps) row = res.data();
        }
        out.data<uint32_t>()[r] = draw_row(row, V, u.data<float>()[r]);
      }
    });
  }

  DEFINE_NAME(RowDraw)
  bool is_equivalent(const mx::Primitive& other) const override {
    return empty_mass_ == static_cast<const RowDraw&>(other).empty_mass_;
  }

 private:
  float empty_mass_;
};

void check_rows(const mx::array& a, const char* what) {
  if (a.dtype() != mx::float32) throw std::invalid_argument(std::string(what) + ": only float32 is supported");
  if (a.ndim() != 2) throw std::invalid_argument(std::string(what) + ": expected [R, V]");
}

}  // namespace

ArrayPtr row_probs(const Array& logits, float inv_t, double top_p, double min_p, int32_t min_keep, int32_t top_k) {
  const auto& x = logits.inner;
  check_rows(x, "row_probs");
  if (!(inv_t > 0.0f) || !std::isfinite(inv_t)) throw std::invalid_argument("row_probs: 1/T must be positive");
  if (min_keep < 1 || top_k < 0) throw std::invalid_argument("row_probs: min_keep ≥ 1 and top_k ≥ 0 expected");
  const float ln_min_p = min_p > 0.0 ? static_cast<float>(std::log(min_p)) : kNegInf;
  auto s = mx::default_stream(mx::Device(mx::Device::cpu));
  auto xc = row_contiguous(x, s);
  Filter f{inv_t, top_p, ln_min_p, min_keep, top_k};
  return std::make_unique<Array>(mx::array(x.shape(), mx::float32, std::make_shared<RowProbs>(s, f), {xc}));
}

ArrayPtr row_draw(const Array& weights, const Array& u, const ArrayList& residual_of, float empty_mass) {
  const auto& w = weights.inner;
  check_rows(w, "row_draw");
  const auto& uu = u.inner;
  if (uu.dtype() != mx::float32 || uu.ndim() != 1 || uu.shape(0) != w.shape(0)) {
    throw std::invalid_argument("row_draw: u must be float32 [R] with one value per weight row");
  }
  auto s = mx::default_stream(mx::Device(mx::Device::cpu));
  std::vector<mx::array> args{row_contiguous(uu, s), row_contiguous(w, s)};
  if (residual_of.items.size() > 1) throw std::invalid_argument("row_draw: at most one q");
  for (const auto& q : residual_of.items) {
    check_rows(q, "row_draw (q)");
    if (q.shape() != w.shape()) throw std::invalid_argument("row_draw: q must have p's shape");
    args.push_back(row_contiguous(q, s));
  }
  return std::make_unique<Array>(
      mx::array({w.shape(0)}, mx::uint32, std::make_shared<RowDraw>(s, empty_mass), std::move(args)));
}

}  // namespace mlxr
