// A logistic head over rows and the laws of their logits, in one graph node on the CPU:
// c_r = σ(Σ_j x_j[r]·w_j + f(l_r)·w_f + b), where x_j are row features (concatenated in order),
// and f(l_r) = (log max softmax(l_r), entropy of softmax(l_r)) when law weights are given.
//
// A drafter scores every block it proposes this way before the verify window is chosen. Composed
// from MLX's ops that is about fifteen small nodes (a softmax, max, log, products, sums, concats,
// a matmul, a sigmoid), each ~20 µs of scheduling on a CPU whatever its size: about 4% of a round
// of the default pair. Here it is one pass over each row's logits.
#include "mlx-core/src/sys/shim.h"
#include "mlx-core/src/sys/row_kernel.h"

#include <cmath>
#include <limits>
#include <stdexcept>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"

namespace mx = mlx::core;

namespace mlxr {
namespace {

// log max_v p(v) and H(p) for p = softmax(l) over one row of V logits.
void law_row(const float* l, int V, float* log_top, float* entropy) {
  float m = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < V; ++i) m = std::max(m, l[i]);
  // s = Σ e^{l − m} (so p_max = 1/s), t = Σ e^{l − m}·(l − m)
  float s = 0.0f, t = 0.0f;
  for (int i = 0; i < V; ++i) {
    const float d = l[i] - m;
    const float e = std::exp(d);
    s += e;
    if (e > 0.0f) t += e * d;
  }
  *log_top = -std::log(s);
  // H = log s − Σ p·(l − m)
  *entropy = std::log(s) - t / s;
}

class RowConfidence : public CpuOnlyUnary {
 public:
  // inputs: the feature parts [R, d_j]..., w [I], b [1], then (with law) logits [R, V].
  RowConfidence(mx::Stream s, int parts, bool law) : CpuOnlyUnary(s), parts_(parts), law_(law) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    auto held = hold_row_inputs(inputs, out, stream(), "RowConfidence");
    mx::cpu::get_command_encoder(stream()).dispatch([held = std::move(held), out = mx::array::unsafe_weak_copy(out), parts = parts_, law = law_]() mutable {
      const float* w = held[parts].data<float>();
      const float b = held[parts + 1].data<float>()[0];
      const size_t R = out.size();
      for (size_t r = 0; r < R; ++r) {
        float z = b;
        size_t at = 0;
        for (int j = 0; j < parts; ++j) {
          const int d = held[j].shape(-1);
          const float* x = held[j].data<float>() + r * d;
          for (int i = 0; i < d; ++i) z += x[i] * w[at + i];
          at += static_cast<size_t>(d);
        }
        if (law) {
          const mx::array& l = held[parts + 2];
          const int V = l.shape(-1);
          float log_top, entropy;
          law_row(l.data<float>() + r * V, V, &log_top, &entropy);
          z += log_top * w[at] + entropy * w[at + 1];
        }
        out.data<float>()[r] = 1.0f / (1.0f + std::exp(-z));
      }
    });
  }

  DEFINE_NAME(RowConfidence)
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const RowConfidence&>(other);
    return parts_ == o.parts_ && law_ == o.law_;
  }

 private:
  int parts_;
  bool law_;
};

void check_f32_rows(const mx::array& a, int rows, const char* what) {
  if (a.dtype() != mx::float32 || a.ndim() != 2 || (rows >= 0 && a.shape(0) != rows)) {
    throw std::invalid_argument(std::string("row_confidence: ") + what + " must be float32 [R, d] with R = " +
                                std::to_string(rows));
  }
}

}  // namespace

ArrayPtr row_confidence(const ArrayList& parts, const Array& w, const Array& b, const ArrayList& law_of) {
  if (parts.items.empty()) throw std::invalid_argument("row_confidence: at least one feature part");
  if (law_of.items.size() > 1) throw std::invalid_argument("row_confidence: at most one logits array");
  const int R = parts.items[0].ndim() == 2 ? parts.items[0].shape(0) : -1;
  auto s = mx::default_stream(mx::Device(mx::Device::cpu));
  std::vector<mx::array> args;
  size_t width = 0;
  for (const auto& x : parts.items) {
    check_f32_rows(x, R, "a feature part");
    width += static_cast<size_t>(x.shape(1));
    args.push_back(row_contiguous(x, s));
  }
  const bool law = !law_of.items.empty();
  if (law) {
    check_f32_rows(law_of.items[0], R, "the logits");
    width += 2;
  }
  if (w.inner.dtype() != mx::float32 || w.inner.size() != width) {
    throw std::invalid_argument("row_confidence: w must be float32 with " + std::to_string(width) + " weights");
  }
  if (b.inner.dtype() != mx::float32 || b.inner.size() != 1) {
    throw std::invalid_argument("row_confidence: b must be one float32");
  }
  args.push_back(row_contiguous(mx::flatten(w.inner, s), s));
  args.push_back(row_contiguous(mx::flatten(b.inner, s), s));
  if (law) args.push_back(row_contiguous(law_of.items[0], s));
  const int n_parts = static_cast<int>(parts.items.size());
  return std::make_unique<Array>(
      mx::array({R}, mx::float32, std::make_shared<RowConfidence>(s, n_parts, law), std::move(args)));
}

}  // namespace mlxr
