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
#include "mlx-core/src/sys/row_kernel.h"


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
// the sum. Key j's D floats start at k[j] and value j's at v[j], so cache buffers are read in
// place, whatever their layout and however many pieces a row's keys come in.
void attend_row_generic(const float* q, const float* const* k, const float* const* v, int L, int D, float scale,
                        float* out, float* scores) {
  float m = -INFINITY;
  for (int j = 0; j < L; ++j) {
    const float* kr = k[j];
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
    const float* vr = v[j];
    for (int d = 0; d < D; ++d) out[d] = std::fma(scores[j], vr[d], out[d]);
  }
  const float inv = 1.0f / sum;
  for (int d = 0; d < D; ++d) out[d] *= inv;
}

#ifdef MLXR_X86
__attribute__((target("avx2,fma"))) void attend_row_avx2(const float* q, const float* const* k,
                                                         const float* const* v, int L, int D, float scale,
                                                         float* out, float* scores) {
  const int d8 = D & ~7;
  float m = -INFINITY;
  alignas(32) float lane[8];
  for (int j = 0; j < L; ++j) {
    const float* kr = k[j];
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
    const float* vr = v[j];
    const __m256 p = _mm256_set1_ps(scores[j]);
    int d = 0;
    for (; d < d8; d += 8) _mm256_storeu_ps(out + d, _mm256_fmadd_ps(p, _mm256_loadu_ps(vr + d), _mm256_loadu_ps(out + d)));
    for (; d < D; ++d) out[d] = std::fma(scores[j], vr[d], out[d]);
  }
  const float inv = 1.0f / sum;
  for (int d = 0; d < D; ++d) out[d] *= inv;
}

#endif

void attend_row(const float* q, const std::vector<const float*>& k, const std::vector<const float*>& v, int D,
                float scale, float* out, std::vector<float>& scores) {
  const int L = static_cast<int>(k.size());
  scores.resize(k.size());
#ifdef MLXR_X86
  if (has_avx2_fma()) return attend_row_avx2(q, k.data(), v.data(), L, D, scale, out, scores.data());
#endif
  attend_row_generic(q, k.data(), v.data(), L, D, scale, out, scores.data());
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

// A [B, H, L, D] input read in place: its element (b, h, l, 0) and the D floats after it.
struct Rows {
  const float* base;
  size_t sb, sh, sl;
  int L;
  const float* row(int b, int h, int l) const { return base + b * sb + h * sh + l * sl; }
};

class RowAttention : public CpuOnlyMulti {
 public:
  RowAttention(mx::Stream s, float scale, std::vector<int> segments)
      : CpuOnlyMulti(s), scale_(scale), segments_(std::move(segments)) {}

  // inputs: q [B, Hq, n, D] row-contiguous, then for each row i its keys and values as
  // segments_[i] pairs k, v [B, Hkv, L_s, D], attended as their concatenation along L (each
  // row of D floats contiguous; any strides over B, Hkv and L).
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    mx::array& out = outputs[0];
    // Nothing must be row-contiguous: q is read through RowMajor, keys and values through their
    // strides.
    auto held = hold_row_inputs(inputs, out, stream(), "RowAttention", 0);
    mx::cpu::get_command_encoder(stream()).dispatch([held = std::move(held), out = mx::array::unsafe_weak_copy(out), scale = scale_,
                  segments = segments_]() mutable {
      const mx::array& q = held[0];
      const int B = q.shape(0), Hq = q.shape(1), n = q.shape(2), D = q.shape(3);
      RowMajor q_rows;
      const float* qd = q_rows(q);
      std::vector<float> scores;
      std::vector<const float*> kp, vp;
      std::vector<std::vector<float>> copies;  // inputs whose rows are not contiguous
      auto rows = [&](const mx::array& a) {
        if (rows_readable(a)) {
          const auto& st = a.strides();
          return Rows{a.data<float>(), size_t(st[0]), size_t(st[1]), size_t(st[2]), a.shape(2)};
        }
        copies.push_back(row_major(a));
        const size_t l = size_t(a.shape(2)) * D;
        return Rows{copies.back().data(), size_t(a.shape(1)) * l, l, size_t(D), a.shape(2)};
      };
      size_t next = 1;
      for (int i = 0; i < n; ++i) {
        std::vector<std::pair<Rows, Rows>> segs;
        for (int s = 0; s < segments[i]; ++s, next += 2) segs.emplace_back(rows(held[next]), rows(held[next + 1]));
        const int rep = Hq / held[next - 2].shape(1);
        for (int b = 0; b < B; ++b) {
          for (int h = 0; h < Hq; ++h) {
            kp.clear();
            vp.clear();
            for (const auto& [k, v] : segs) {
              for (int l = 0; l < k.L; ++l) {
                kp.push_back(k.row(b, h / rep, l));
                vp.push_back(v.row(b, h / rep, l));
              }
            }
            const size_t qi = ((static_cast<size_t>(b) * Hq + h) * n + i) * D;
            attend_row(qd + qi, kp, vp, D, scale, out.data<float>() + qi, scores);
          }
        }
        copies.clear();
      }
    });
  }

  DEFINE_NAME(RowAttention)
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const RowAttention&>(other);
    return scale_ == o.scale_ && segments_ == o.segments_;
  }

 private:
  float scale_;
  std::vector<int> segments_;
};

}  // namespace

ArrayPtr row_attention(const ArrayList& inputs, rust::Slice<const int32_t> segments, float scale) {
  const auto& in = inputs.items;
  if (in.empty()) throw std::invalid_argument("row_attention: expected q and each query row's (k, v) pairs");
  const auto& q = in[0];
  if (q.ndim() != 4) throw std::invalid_argument("row_attention: q must be [B, Hq, n, D]");
  const int n = q.shape(2);
  if (segments.size() != static_cast<size_t>(n)) {
    throw std::invalid_argument("row_attention: " + std::to_string(n) + " query rows need as many segment counts");
  }
  size_t pairs = 0;
  for (int32_t c : segments) {
    if (c < 1) throw std::invalid_argument("row_attention: every row needs at least one (k, v) pair");
    pairs += static_cast<size_t>(c);
  }
  if (in.size() != 1 + 2 * pairs) {
    throw std::invalid_argument("row_attention: expected " + std::to_string(pairs) + " (k, v) pairs, got " +
                                std::to_string(in.size() - 1) + " arrays");
  }
  auto s = mx::default_stream(mx::Device(mx::Device::cpu));
  std::vector<mx::array> args;
  args.reserve(in.size());
  size_t next = 1;
  for (int i = 0; i < n; ++i) {
    int keys = 0;
    for (int32_t c = 0; c < segments[i]; ++c, next += 2) {
      const auto& k = in[next];
      const auto& v = in[next + 1];
      for (const auto* a : {&k, &v}) {
        if (a->dtype() != mx::float32) throw std::invalid_argument("row_attention: only float32 is supported");
        if (a->ndim() != 4 || a->shape(0) != q.shape(0) || a->shape(3) != q.shape(3) || a->shape(1) == 0 ||
            q.shape(1) % a->shape(1) != 0 || a->shape(1) != in[next].shape(1)) {
          throw std::invalid_argument("row_attention: k/v must be [B, Hkv, L, D] with Hkv dividing Hq");
        }
      }
      if (k.shape(2) != v.shape(2)) throw std::invalid_argument("row_attention: k and v of a row differ in length");
      if (c > 0 && k.shape(1) != in[next - 2].shape(1)) {
        throw std::invalid_argument("row_attention: a row's segments differ in heads");
      }
      keys += k.shape(2);
      args.push_back(k);
      args.push_back(v);
    }
    if (keys == 0) throw std::invalid_argument("row_attention: a row has no keys");
  }
  args.insert(args.begin(), q);
  std::vector<int> segs(segments.begin(), segments.end());
  auto outs = mx::array::make_arrays({q.shape()}, {mx::float32},
                                     std::make_shared<RowAttention>(s, scale, std::move(segs)), args);
  return std::make_unique<Array>(outs[0]);
}

}  // namespace mlxr
