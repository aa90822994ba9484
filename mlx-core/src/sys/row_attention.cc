// Row-invariant single-query attention in f32 on the CPU: one primitive for all the rows of a
// decode step or a stepwise verify window, each row attending to its own keys.
//
// A stepwise verify must give every row the bits a one-token decode step gives it. Composing
// MLX's ops for that costs about ten graph nodes per row and layer (slices, two matmuls, a
// softmax, reshapes), and on a CPU every node costs ~10 µs of scheduling whatever its size. This
// kernel does a whole layer's rows in one node, with an arithmetic that depends only on the
// row's own query, keys and values: scores as eight-lane dot products reduced in a fixed tree,
// the maximum, exponentials and their sum in key order, then the value rows accumulated in key
// order and divided by the sum. Decode steps use the same kernel, so both agree bit for bit.
#include "mlx-core/src/sys/shim.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#endif

namespace mx = mlx::core;

namespace mlxr {
namespace {

// Fixed-order dot product: lane l sums k ≡ l (mod 8) with FMAs, lanes reduced pairwise, then
// the tail. The AVX2 form below computes exactly this (one FMA per lane per step).
inline float reduce_lanes(const float* lane) {
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

// scores[j] ← exp(scores[j] − m), returning their sum taken in key order.
inline float exponentiate(float* scores, int L, float m) {
  float sum = 0.0f;
  for (int j = 0; j < L; ++j) {
    scores[j] = std::exp(scores[j] - m);
    sum += scores[j];
  }
  return sum;
}

// One query row `q` [D] over `L` keys/values into `out` [D]: scores, their maximum,
// exponentials summed in key order, values accumulated in key order with FMAs, then divided by
// the sum. Key j starts at k + j·ks and value j at v + j·vs (each row's D floats contiguous), so
// a cache buffer sliced to its first L rows is read in place.
void attend_row_generic(const float* q, const float* k, const float* v, int L, int D, size_t ks, size_t vs,
                        float scale, float* out, float* scores) {
  float m = -INFINITY;
  for (int j = 0; j < L; ++j) {
    const float* kr = k + static_cast<size_t>(j) * ks;
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int d = 0;
    for (; d + 8 <= D; d += 8) {
      for (int l = 0; l < 8; ++l) lane[l] = std::fma(q[d + l], kr[d + l], lane[l]);
    }
    float s = reduce_lanes(lane);
    for (; d < D; ++d) s = std::fma(q[d], kr[d], s);
    scores[j] = s * scale;
    m = std::max(m, scores[j]);
  }
  const float sum = exponentiate(scores, L, m);
  for (int d = 0; d < D; ++d) out[d] = 0.0f;
  for (int j = 0; j < L; ++j) {
    const float* vr = v + static_cast<size_t>(j) * vs;
    for (int d = 0; d < D; ++d) out[d] = std::fma(scores[j], vr[d], out[d]);
  }
  const float inv = 1.0f / sum;
  for (int d = 0; d < D; ++d) out[d] *= inv;
}

#if defined(__x86_64__) || defined(_M_X64)
__attribute__((target("avx2,fma"))) void attend_row_avx2(const float* q, const float* k, const float* v, int L,
                                                         int D, size_t ks, size_t vs, float scale, float* out,
                                                         float* scores) {
  const int d8 = D & ~7;
  float m = -INFINITY;
  alignas(32) float lane[8];
  for (int j = 0; j < L; ++j) {
    const float* kr = k + static_cast<size_t>(j) * ks;
    __m256 acc = _mm256_setzero_ps();
    for (int d = 0; d < d8; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(kr + d), acc);
    _mm256_store_ps(lane, acc);
    float s = reduce_lanes(lane);
    for (int d = d8; d < D; ++d) s = std::fma(q[d], kr[d], s);
    scores[j] = s * scale;
    m = std::max(m, scores[j]);
  }
  const float sum = exponentiate(scores, L, m);
  for (int d = 0; d < D; ++d) out[d] = 0.0f;
  for (int j = 0; j < L; ++j) {
    const float* vr = v + static_cast<size_t>(j) * vs;
    const __m256 p = _mm256_set1_ps(scores[j]);
    int d = 0;
    for (; d < d8; d += 8) _mm256_storeu_ps(out + d, _mm256_fmadd_ps(p, _mm256_loadu_ps(vr + d), _mm256_loadu_ps(out + d)));
    for (; d < D; ++d) out[d] = std::fma(scores[j], vr[d], out[d]);
  }
  const float inv = 1.0f / sum;
  for (int d = 0; d < D; ++d) out[d] *= inv;
}

bool has_avx2_fma() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}
#endif

void attend_row(const float* q, const float* k, const float* v, int L, int D, size_t ks, size_t vs, float scale,
                float* out, std::vector<float>& scores) {
  scores.resize(static_cast<size_t>(L));
#if defined(__x86_64__) || defined(_M_X64)
  if (has_avx2_fma()) return attend_row_avx2(q, k, v, L, D, ks, vs, scale, out, scores.data());
#endif
  attend_row_generic(q, k, v, L, D, ks, vs, scale, out, scores.data());
}

// Keys and values are read through their strides when each row's D floats are contiguous
// (a cache buffer sliced along its rows is), which saves copying the whole cache for every
// query row of every layer. Strides are only known once an input is evaluated, so the check
// is made in the kernel, which copies anything else to row-major itself.
bool rows_readable(const mx::array& a) {
  const auto& st = a.strides();
  return (a.shape(3) == 1 || st[3] == 1) && st[0] >= 0 && st[1] >= 0 && st[2] >= 0;
}

// A [B, H, L, D] array's elements in row-major order.
std::vector<float> row_major(const mx::array& a) {
  std::vector<float> out(a.size());
  const auto& st = a.strides();
  const float* p = a.data<float>();
  size_t o = 0;
  for (int b = 0; b < a.shape(0); ++b)
    for (int h = 0; h < a.shape(1); ++h)
      for (int l = 0; l < a.shape(2); ++l)
        for (int d = 0; d < a.shape(3); ++d) out[o++] = p[b * st[0] + h * st[1] + l * st[2] + d * st[3]];
  return out;
}

class RowAttention : public mx::Primitive {
 public:
  RowAttention(mx::Stream s, float scale) : mx::Primitive(s), scale_(scale) {}

  // inputs: q [B, Hq, n, D] row-contiguous, then k_i, v_i [B, Hkv, L_i, D] for each row i,
  // each row of D floats contiguous (any strides over B, Hkv and L).
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    mx::array& out = outputs[0];
    if (!inputs[0].flags().row_contiguous) throw std::invalid_argument("RowAttention: q must be row-contiguous");
    out.set_data(mx::allocator::malloc(out.nbytes()));
    auto& enc = mx::cpu::get_command_encoder(stream());
    std::vector<mx::array> held;
    for (const auto& a : inputs) {
      enc.set_input_array(a);
      held.push_back(mx::array::unsafe_weak_copy(a));
    }
    enc.set_output_array(out);
    enc.dispatch([held = std::move(held), out = mx::array::unsafe_weak_copy(out), scale = scale_]() mutable {
      const mx::array& q = held[0];
      const int B = q.shape(0), Hq = q.shape(1), n = q.shape(2), D = q.shape(3);
      std::vector<float> scores;
      for (int i = 0; i < n; ++i) {
        const mx::array& k = held[1 + 2 * i];
        const mx::array& v = held[2 + 2 * i];
        const int Hkv = k.shape(1), L = k.shape(2);
        const int rep = Hq / Hkv;
        // Base pointer and strides over (B, H, L) of an input, copied to row-major if its rows
        // are not contiguous.
        std::vector<float> kc, vc;
        auto view = [&](const mx::array& a, std::vector<float>& copy) {
          if (rows_readable(a)) {
            const auto& st = a.strides();
            return std::make_tuple(a.data<float>(), size_t(st[0]), size_t(st[1]), size_t(st[2]));
          }
          copy = row_major(a);
          const size_t l = size_t(a.shape(2)) * D;
          return std::make_tuple(static_cast<const float*>(copy.data()), size_t(a.shape(1)) * l, l, size_t(D));
        };
        const auto [kb, kb0, kh, kl] = view(k, kc);
        const auto [vb, vb0, vh, vl] = view(v, vc);
        for (int b = 0; b < B; ++b) {
          for (int h = 0; h < Hq; ++h) {
            const size_t qi = ((static_cast<size_t>(b) * Hq + h) * n + i) * D;
            const size_t hk = static_cast<size_t>(h / rep);
            attend_row(q.data<float>() + qi, kb + b * kb0 + hk * kh, vb + b * vb0 + hk * vh, L, D, kl,
                       vl, scale, out.data<float>() + qi, scores);
          }
        }
      }
    });
  }

  void eval_gpu(const std::vector<mx::array>&, std::vector<mx::array>&) override {
    throw std::runtime_error("RowAttention runs on the CPU only");
  }

  DEFINE_NAME(RowAttention)
  bool is_equivalent(const mx::Primitive& other) const override {
    return scale_ == static_cast<const RowAttention&>(other).scale_;
  }

 private:
  float scale_;
};

}  // namespace

ArrayPtr row_attention(const ArrayList& inputs, float scale) {
  const auto& in = inputs.items;
  if (in.size() < 3 || in.size() % 2 != 1) {
    throw std::invalid_argument("row_attention: expected q and one (k, v) pair per query row");
  }
  const auto& q = in[0];
  if (q.ndim() != 4) throw std::invalid_argument("row_attention: q must be [B, Hq, n, D]");
  const int n = q.shape(2);
  if (static_cast<size_t>(2 * n + 1) != in.size()) {
    throw std::invalid_argument("row_attention: " + std::to_string(n) + " query rows need as many (k, v) pairs");
  }
  auto s = mx::default_stream(mx::Device(mx::Device::cpu));
  std::vector<mx::array> args;
  args.reserve(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    const auto& a = in[i];
    if (a.dtype() != mx::float32) throw std::invalid_argument("row_attention: only float32 is supported");
    if (i > 0) {
      if (a.ndim() != 4 || a.shape(0) != q.shape(0) || a.shape(3) != q.shape(3) || a.shape(1) == 0 ||
          q.shape(1) % a.shape(1) != 0) {
        throw std::invalid_argument("row_attention: k/v must be [B, Hkv, L, D] with Hkv dividing Hq");
      }
      if (a.shape(2) == 0) throw std::invalid_argument("row_attention: a row has no keys");
      if (i % 2 == 0 && a.shape(2) != in[i - 1].shape(2)) {
        throw std::invalid_argument("row_attention: k and v of a row differ in length");
      }
    }
    args.push_back(i > 0 ? a : mx::contiguous(a, false, s));
  }
  auto outs = mx::array::make_arrays({q.shape()}, {mx::float32}, std::make_shared<RowAttention>(s, scale), args);
  return std::make_unique<Array>(outs[0]);
}

}  // namespace mlxr
