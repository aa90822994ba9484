// gelu_approx (and the logit softcap, cap·tanh(x / cap), with the same tanh, and sampling's
// log_softmax with the same exp) in f32 on the CPU as one vectorized pass, for the rows of decode
// steps and verify windows (the same switch as row_linear turns it on).
//
// MLX composes gelu_approx from seven graph nodes and evaluates tanh one element at a time
// (~20 ns per element in all), which made the MLP's activation of an 8-row verify window cost
// 7 ms on a 230M-parameter model, a sixth of the window's extra cost over a decode step. Here
// tanh(y) = sign(y)·(1 − 2 / (e^{2|y|} + 1)) with a Cephes-style exp (range reduction by ln 2,
// a degree-6 polynomial, exponent by integer add), within a few ulp of libm. Every element runs
// the same instruction sequence, the tail through a padded copy, so an element's bits depend
// only on its value: rows agree whatever the batch.
#include "mlx-core/src/sys/shim.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "mlx-core/src/sys/row_kernel.h"
#include "mlx-core/src/sys/row_compute.h"


namespace mx = mlx::core;

namespace mlxr {
namespace {

constexpr float kSqrt2OverPi = 0.7978845608028654f;
constexpr float kCubic = 0.044715f;
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f;
constexpr float kLn2Lo = -2.12194440e-4f;
constexpr float kExpMax = 88.3762626647949f;
constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                         4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};

// e^a for a in [kExpMin, kExpMax] (callers clamp) by range reduction and a polynomial. The
// portable form: the same operations in the same order as exp8 (FMA where it fuses).
constexpr float kExpMin = -86.0f;
float exp_one(float a) {
  const float n = std::nearbyint(a * kLog2e);
  const float r = std::fma(-n, kLn2Lo, std::fma(-n, kLn2Hi, a));
  float p = kP[0];
  for (int i = 1; i < 6; ++i) p = std::fma(p, r, kP[i]);
  p = std::fma(p, r * r, r) + 1.0f;
  int32_t bits;
  std::memcpy(&bits, &p, 4);
  bits += static_cast<int32_t>(n) << 23;
  float e;
  std::memcpy(&e, &bits, 4);
  return e;
}

// tanh(y) = sign(y)·(1 − 2 / (e^{2|y|} + 1)).
float tanh_one(float y) {
  const float e = exp_one(std::min(2.0f * std::fabs(y), kExpMax));
  return std::copysign(1.0f - 2.0f / (e + 1.0f), y);
}

float gelu_one(float x) {
  const float y = kSqrt2OverPi * std::fma(kCubic * x * x, x, x);
  return 0.5f * x * (1.0f + tanh_one(y));
}

void gelu_generic(const float* x, float* y, size_t n) {
  for (size_t i = 0; i < n; ++i) y[i] = gelu_one(x[i]);
}

#ifdef MLXR_X86
// exp_one on eight lanes.
__attribute__((target("avx2,fma"))) inline __m256 exp8(__m256 a) {
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(a, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 nn = _mm256_sub_ps(_mm256_setzero_ps(), n);
  const __m256 r = _mm256_fmadd_ps(nn, _mm256_set1_ps(kLn2Lo), _mm256_fmadd_ps(nn, _mm256_set1_ps(kLn2Hi), a));
  __m256 p = _mm256_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP[i]));
  p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  const __m256i shifted = _mm256_slli_epi32(_mm256_cvtps_epi32(n), 23);
  return _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), shifted));
}

// tanh_one on eight lanes.
__attribute__((target("avx2,fma"))) inline __m256 tanh8(__m256 y) {
  const __m256 sign = _mm256_and_ps(y, _mm256_set1_ps(-0.0f));
  const __m256 a = _mm256_min_ps(_mm256_mul_ps(_mm256_set1_ps(2.0f), _mm256_andnot_ps(_mm256_set1_ps(-0.0f), y)),
                                 _mm256_set1_ps(kExpMax));
  const __m256 e = exp8(a);
  const __m256 t = _mm256_sub_ps(_mm256_set1_ps(1.0f),
                                 _mm256_div_ps(_mm256_set1_ps(2.0f), _mm256_add_ps(e, _mm256_set1_ps(1.0f))));
  return _mm256_or_ps(t, sign);
}

__attribute__((target("avx2,fma"))) inline __m256 gelu8(__m256 x) {
  const __m256 y = _mm256_mul_ps(_mm256_set1_ps(kSqrt2OverPi),
                                 _mm256_fmadd_ps(_mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(kCubic), x), x), x, x));
  return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), _mm256_add_ps(_mm256_set1_ps(1.0f), tanh8(y)));
}

__attribute__((target("avx2,fma"))) void gelu_avx2(const float* x, float* y, size_t n) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, gelu8(_mm256_loadu_ps(x + i)));
  if (i < n) {
    float in[8] = {0}, out[8];
    std::copy(x + i, x + n, in);
    _mm256_storeu_ps(out, gelu8(_mm256_loadu_ps(in)));
    std::copy(out, out + (n - i), y + i);
  }
}

#endif

// cap · tanh(x / cap), the final-logit softcap, with the same tanh as gelu: a row of 262k (or
// 4096) logits is one vectorized pass instead of a tanh per element one at a time. Below
// |y| = 0.625, where 1 − 2/(e^{2|y|} + 1) loses relative precision, tanh is Cephes' odd
// polynomial y + y³·P(y²).
constexpr float kT[5] = {-5.70498872745e-3f, 2.06390887954e-2f, -5.37397155531e-2f, 1.33314422036e-1f,
                         -3.33332819422e-1f};
constexpr float kSmall = 0.625f;

float softcap_one(float x, float cap) {
  const float y = x / cap;
  if (std::fabs(y) < kSmall) {
    const float z = y * y;
    float q = kT[0];
    for (int i = 1; i < 5; ++i) q = std::fma(q, z, kT[i]);
    return std::fma(q * z, y, y) * cap;
  }
  return tanh_one(y) * cap;
}

#ifdef MLXR_X86
__attribute__((target("avx2,fma"))) inline __m256 softcap8(__m256 x, __m256 cap) {
  const __m256 y = _mm256_div_ps(x, cap);
  const __m256 z = _mm256_mul_ps(y, y);
  __m256 q = _mm256_set1_ps(kT[0]);
  for (int i = 1; i < 5; ++i) q = _mm256_fmadd_ps(q, z, _mm256_set1_ps(kT[i]));
  const __m256 small = _mm256_fmadd_ps(_mm256_mul_ps(q, z), y, y);
  const __m256 is_small = _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.0f), y), _mm256_set1_ps(kSmall), _CMP_LT_OQ);
  return _mm256_mul_ps(_mm256_blendv_ps(tanh8(y), small, is_small), cap);
}

__attribute__((target("avx2,fma"))) void softcap_avx2(const float* x, float* y, size_t n, float c) {
  const __m256 cap = _mm256_set1_ps(c);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, softcap8(_mm256_loadu_ps(x + i), cap));
  if (i < n) {
    float in[8] = {0}, out[8];
    std::copy(x + i, x + n, in);
    _mm256_storeu_ps(out, softcap8(_mm256_loadu_ps(in), cap));
    std::copy(out, out + (n - i), y + i);
  }
}
#endif

void softcap_kernel(const float* x, float* y, size_t n, float cap) {
#ifdef MLXR_X86
  if (has_avx2_fma()) return softcap_avx2(x, y, n, cap);
#endif
  for (size_t i = 0; i < n; ++i) y[i] = softcap_one(x[i], cap);
}

// log_softmax over rows of n: x − (m + log Σ e^{x−m}), m the row's maximum, with exp_one (terms
// below e^kExpMin count as 0: beside the maximum's 1 they are lost to rounding anyway). The sum
// in a fixed order whatever the path: lane l adds the terms i ≡ l (mod 8) in order, the lanes
// reduce in reduce8's tree, then the tail in order. MLX's CPU logsumexp takes one scalar exp
// per element (and a libm call per FMA): ~5% of a decode step of the default model.
inline float exp_term(float d) { return d < kExpMin ? 0.0f : exp_one(d); }

float row_sum_generic(const float* x, int n, float m) {
  float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) lane[l] += exp_term(x[i + l] - m);
  }
  float s = ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
  for (; i < n; ++i) s += exp_term(x[i] - m);
  return s;
}

#ifdef MLXR_X86
__attribute__((target("avx2,fma"))) float row_sum_avx2(const float* x, int n, float m) {
  const __m256 mv = _mm256_set1_ps(m), lo = _mm256_set1_ps(kExpMin);
  __m256 acc = _mm256_setzero_ps();
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + i), mv);
    const __m256 keep = _mm256_cmp_ps(d, lo, _CMP_GE_OQ);
    acc = _mm256_add_ps(acc, _mm256_and_ps(exp8(_mm256_max_ps(d, lo)), keep));
  }
  float s = reduce8(acc);
  for (; i < n; ++i) s += exp_term(x[i] - m);
  return s;
}
#endif

void log_softmax_rows(const float* x, float* y, int rows, int n) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<size_t>(r) * n;
    float* yr = y + static_cast<size_t>(r) * n;
    float m = -INFINITY;
    for (int i = 0; i < n; ++i) m = std::max(m, xr[i]);
    float lse = m;
    if (std::isfinite(m)) {
#ifdef MLXR_X86
      const float sum = has_avx2_fma() ? row_sum_avx2(xr, n, m) : row_sum_generic(xr, n, m);
#else
      const float sum = row_sum_generic(xr, n, m);
#endif
      lse = m + std::log(sum);
    }
    for (int i = 0; i < n; ++i) yr[i] = xr[i] - lse;
  }
}

class RowLogSoftmax : public CpuOnlyUnary {
 public:
  explicit RowLogSoftmax(mx::Stream s) : CpuOnlyUnary(s) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    auto held = hold_row_inputs(inputs, out, stream(), "RowLogSoftmax");
    mx::cpu::get_command_encoder(stream()).dispatch([x = held[0], out = mx::array::unsafe_weak_copy(out)]() mutable {
      const int n = x.shape(-1);
      const int rows = n > 0 ? static_cast<int>(x.size() / n) : 0;
      log_softmax_rows(x.data<float>(), out.data<float>(), rows, n);
    });
  }

  DEFINE_NAME(RowLogSoftmax)
  DEFINE_DEFAULT_IS_EQUIVALENT()
};

class RowSoftcap : public CpuOnlyUnary {
 public:
  RowSoftcap(mx::Stream s, float cap) : CpuOnlyUnary(s), cap_(cap) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    auto held = hold_row_inputs(inputs, out, stream(), "RowSoftcap");
    mx::cpu::get_command_encoder(stream()).dispatch([x = held[0], out = mx::array::unsafe_weak_copy(out), cap = cap_]() mutable {
      softcap_kernel(x.data<float>(), out.data<float>(), x.size(), cap);
    });
  }

  // d/dx cap·tanh(x / cap) = 1 − tanh²(x / cap), through MLX's ops.
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                             const std::vector<int>&, const std::vector<mx::array>&) override {
    auto s = stream();
    auto t = mx::tanh(mx::divide(primals[0], mx::array(cap_), s), s);
    auto d = mx::subtract(mx::array(1.0f), mx::square(t, s), s);
    return {mx::multiply(cotangents[0], d, s)};
  }

  DEFINE_NAME(RowSoftcap)
  bool is_equivalent(const mx::Primitive& other) const override {
    return cap_ == static_cast<const RowSoftcap&>(other).cap_;
  }

 private:
  float cap_;
};

}  // namespace

void gelu_kernel(const float* x, float* y, size_t n) {
#ifdef MLXR_X86
  if (has_avx2_fma()) return gelu_avx2(x, y, n);
#endif
  gelu_generic(x, y, n);
}

namespace {

class RowGelu : public CpuOnlyUnary {
 public:
  explicit RowGelu(mx::Stream s) : CpuOnlyUnary(s) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    auto held = hold_row_inputs(inputs, out, stream(), "RowGelu");
    mx::cpu::get_command_encoder(stream()).dispatch([x = held[0], out = mx::array::unsafe_weak_copy(out)]() mutable {
      gelu_kernel(x.data<float>(), out.data<float>(), x.size());
    });
  }

  // d gelu(x) through MLX's ops on the composed form (training never needs the vector form).
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                             const std::vector<int>&, const std::vector<mx::array>&) override {
    auto s = stream();
    auto composed = [s](const std::vector<mx::array>& in) {
      const mx::array& x = in[0];
      auto inner = mx::multiply(mx::array(kSqrt2OverPi),
                                mx::add(x, mx::multiply(mx::array(kCubic), mx::power(x, mx::array(3.0f), s), s), s), s);
      auto t = mx::tanh(inner, s);
      return std::vector<mx::array>{
          mx::multiply(mx::multiply(mx::array(0.5f), x, s), mx::add(mx::array(1.0f), t, s), s)};
    };
    return mx::vjp(composed, primals, cotangents).second;
  }

  DEFINE_NAME(RowGelu)
  DEFINE_DEFAULT_IS_EQUIVALENT()
};

}  // namespace

ArrayPtr row_softcap(const Array& x, float cap) {
  const auto& xi = x.inner;
  if (xi.dtype() != mx::float32) throw std::invalid_argument("row_softcap: only float32 is supported");
  if (!(cap > 0.0f) || !std::isfinite(cap)) throw std::invalid_argument("row_softcap: the cap must be positive");
  auto s = mx::default_stream(mx::Device(mx::Device::cpu));
  auto xc = row_contiguous(xi, s);
  return std::make_unique<Array>(mx::array(xi.shape(), mx::float32, std::make_shared<RowSoftcap>(s, cap), {xc}));
}

ArrayPtr row_log_softmax(const Array& x) {
  const auto& xi = x.inner;
  if (xi.dtype() != mx::float32) throw std::invalid_argument("row_log_softmax: only float32 is supported");
  if (xi.ndim() < 1) throw std::invalid_argument("row_log_softmax: x must have a last axis");
  auto s = mx::default_stream(mx::Device(mx::Device::cpu));
  auto xc = row_contiguous(xi, s);
  return std::make_unique<Array>(mx::array(xi.shape(), mx::float32, std::make_shared<RowLogSoftmax>(s), {xc}));
}

bool row_log_softmax_paths_agree(int32_t n) {
#ifdef MLXR_X86
  if (!has_avx2_fma() || n < 1) return true;
  std::vector<float> x(static_cast<size_t>(n));
  uint32_t seed = 99;
  for (auto& v : x) {
    seed = seed * 1664525u + 1013904223u;
    v = static_cast<float>(static_cast<int32_t>(seed >> 8) - (1 << 23)) / static_cast<float>(1 << 19);  // ±16
  }
  x[static_cast<size_t>(n) / 2] = -INFINITY;  // a masked logit
  const float m = *std::max_element(x.begin(), x.end());
  const float a = row_sum_avx2(x.data(), n, m), b = row_sum_generic(x.data(), n, m);
  return std::memcmp(&a, &b, sizeof a) == 0;
#else
  return true;
#endif
}

ArrayPtr row_gelu(const Array& x) {
  const auto& xi = x.inner;
  if (xi.dtype() != mx::float32) throw std::invalid_argument("row_gelu: only float32 is supported");
  auto s = mx::default_stream(mx::Device(mx::Device::cpu));
  auto xc = row_contiguous(xi, s);
  return std::make_unique<Array>(mx::array(xi.shape(), mx::float32, std::make_shared<RowGelu>(s), {xc}));
}

}  // namespace mlxr
