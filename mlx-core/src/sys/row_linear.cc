// A row-invariant f32 `x @ Wᵀ` for few rows (decode steps and verify windows) on the CPU.
//
// Optimized BLAS libraries compute a row's dot products in an order that depends on how many
// rows are multiplied together (full tiles vs tail kernels), so a one-token decode step and the
// same token inside a verify window would get different bits. This kernel fixes the order by
// construction: each output element is one dot product over K with eight interleaved partial
// sums (lane l takes k ≡ l mod 8) reduced in a fixed tree, whatever M is and wherever the row
// sits. Weights are streamed once per call: each block of 4 weight rows stays in L1 while every
// input row is multiplied with it, which keeps few-row products memory-bound like a GEMV.
#include "mlx-core/src/sys/shim.h"

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <cstdint>
#include <cstring>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "mlx-core/src/sys/row_kernel.h"
#include "mlx-core/src/sys/row_split.h"
#include "mlx-core/src/sys/row_compute.h"


namespace mx = mlx::core;

namespace mlxr {
namespace {

// Weights come as f32 or as bf16, the dtype most checkpoints are stored in. A bf16 value is the
// f32 with the low 16 bits zero, so reading bf16 weights as f32 in registers gives every product
// exactly the bits of the f32 kernel on the converted weights, with half the bytes to stream.
inline float wval(float v) { return v; }
inline float wval(bf16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Portable form: the same eight-lane structure in plain C++ (one machine, one code path).
template <class W>
void block_generic(const float* x, const W* w, float* y, int M, int K, int N, int n0, int n1) {
  for (int n = n0; n < n1; ++n) {
    const W* wr = w + static_cast<size_t>(n) * K;
    for (int m = 0; m < M; ++m) {
      const float* xr = x + static_cast<size_t>(m) * K;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      int k = 0;
      for (; k + 8 <= K; k += 8) {
        for (int l = 0; l < 8; ++l) acc[l] += xr[k + l] * wval(wr[k + l]);
      }
      float tail = 0;
      for (; k < K; ++k) tail += xr[k] * wval(wr[k]);
      y[static_cast<size_t>(m) * N + n] =
          ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7])) + tail;
    }
  }
}

#ifdef MLXR_X86
// The prefetches of k-step k/8 of a block of four rows starting at `w0` (see kPrefetchAhead):
// the step reads 32 weights, so 64 bytes (bf16) or 128 (f32). Touches no arithmetic.
template <class W>
inline void prefetch_step(const W* w0, int k) {
  const char* p = reinterpret_cast<const char*>(w0) + kPrefetchAhead + static_cast<size_t>(k / 8) * 32 * sizeof(W);
  _mm_prefetch(p, _MM_HINT_T0);
  if (sizeof(W) > 2) _mm_prefetch(p + 64, _MM_HINT_T0);
}

// Eight weights as f32 (bf16: widened and shifted into the high half, exact).
__attribute__((target("avx2,fma"))) inline __m256 wload8(const float* p) { return _mm256_loadu_ps(p); }
__attribute__((target("avx2,fma"))) inline __m256 wload8(const bf16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// One output element's arithmetic, whatever block it is computed in: eight lanes over k ≡ l
// (mod 8) with FMA, a fixed reduction tree, then the tail in order. The blocks below only
// change how many of these run side by side (register tiling), never their order.
template <class W>
__attribute__((target("avx2,fma"))) inline float finish(__m256 acc, const float* xr, const W* wr, int k8, int K) {
  float t = 0;
  for (int k = k8; k < K; ++k) t = std::fma(xr[k], wval(wr[k]), t);
  return reduce8(acc) + t;
}

// Four weight rows against three input rows at a time (12 accumulators, 7 loads per 12 FMAs),
// then two, then one. Every output element gets the same FMA sequence in every tile shape.
template <class W>
__attribute__((target("avx2,fma"))) void block_avx2(const float* x, const W* w, float* y, int M, int K, int N,
                                                   int n0, int n1) {
  const int k8 = K & ~7;
  int n = n0;
  for (; n + 4 <= n1; n += 4) {
    const W* w0 = w + static_cast<size_t>(n) * K;
    const W* w1 = w0 + K;
    const W* w2 = w1 + K;
    const W* w3 = w2 + K;
    int m = 0;
    // Three input rows at a time: 12 accumulators, each weight vector loaded once for 3 FMAs.
    for (; m + 3 <= M; m += 3) {
      const float* xa = x + static_cast<size_t>(m) * K;
      const float* xb = xa + K;
      const float* xc = xb + K;
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
             a3 = _mm256_setzero_ps(), b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps(),
             b2 = _mm256_setzero_ps(), b3 = _mm256_setzero_ps(), c0 = _mm256_setzero_ps(),
             c1 = _mm256_setzero_ps(), c2 = _mm256_setzero_ps(), c3 = _mm256_setzero_ps();
      for (int k = 0; k < k8; k += 8) {
        prefetch_step(w0, k);
        __m256 xv = _mm256_loadu_ps(xa + k), xu = _mm256_loadu_ps(xb + k), xt = _mm256_loadu_ps(xc + k);
        __m256 v = wload8(w0 + k);
        a0 = _mm256_fmadd_ps(xv, v, a0);
        b0 = _mm256_fmadd_ps(xu, v, b0);
        c0 = _mm256_fmadd_ps(xt, v, c0);
        v = wload8(w1 + k);
        a1 = _mm256_fmadd_ps(xv, v, a1);
        b1 = _mm256_fmadd_ps(xu, v, b1);
        c1 = _mm256_fmadd_ps(xt, v, c1);
        v = wload8(w2 + k);
        a2 = _mm256_fmadd_ps(xv, v, a2);
        b2 = _mm256_fmadd_ps(xu, v, b2);
        c2 = _mm256_fmadd_ps(xt, v, c2);
        v = wload8(w3 + k);
        a3 = _mm256_fmadd_ps(xv, v, a3);
        b3 = _mm256_fmadd_ps(xu, v, b3);
        c3 = _mm256_fmadd_ps(xt, v, c3);
      }
      float* ya = y + static_cast<size_t>(m) * N + n;
      float* yb = ya + N;
      float* yc = yb + N;
      ya[0] = finish(a0, xa, w0, k8, K);
      ya[1] = finish(a1, xa, w1, k8, K);
      ya[2] = finish(a2, xa, w2, k8, K);
      ya[3] = finish(a3, xa, w3, k8, K);
      yb[0] = finish(b0, xb, w0, k8, K);
      yb[1] = finish(b1, xb, w1, k8, K);
      yb[2] = finish(b2, xb, w2, k8, K);
      yb[3] = finish(b3, xb, w3, k8, K);
      yc[0] = finish(c0, xc, w0, k8, K);
      yc[1] = finish(c1, xc, w1, k8, K);
      yc[2] = finish(c2, xc, w2, k8, K);
      yc[3] = finish(c3, xc, w3, k8, K);
    }
    for (; m + 2 <= M; m += 2) {
      const float* xa = x + static_cast<size_t>(m) * K;
      const float* xb = xa + K;
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
             a3 = _mm256_setzero_ps(), b0 = _mm256_setzero_ps(), b1 = _mm256_setzero_ps(),
             b2 = _mm256_setzero_ps(), b3 = _mm256_setzero_ps();
      for (int k = 0; k < k8; k += 8) {
        prefetch_step(w0, k);
        __m256 xv = _mm256_loadu_ps(xa + k), xu = _mm256_loadu_ps(xb + k);
        __m256 v0 = wload8(w0 + k), v1 = wload8(w1 + k), v2 = wload8(w2 + k),
               v3 = wload8(w3 + k);
        a0 = _mm256_fmadd_ps(xv, v0, a0);
        a1 = _mm256_fmadd_ps(xv, v1, a1);
        a2 = _mm256_fmadd_ps(xv, v2, a2);
        a3 = _mm256_fmadd_ps(xv, v3, a3);
        b0 = _mm256_fmadd_ps(xu, v0, b0);
        b1 = _mm256_fmadd_ps(xu, v1, b1);
        b2 = _mm256_fmadd_ps(xu, v2, b2);
        b3 = _mm256_fmadd_ps(xu, v3, b3);
      }
      float* ya = y + static_cast<size_t>(m) * N + n;
      float* yb = ya + N;
      ya[0] = finish(a0, xa, w0, k8, K);
      ya[1] = finish(a1, xa, w1, k8, K);
      ya[2] = finish(a2, xa, w2, k8, K);
      ya[3] = finish(a3, xa, w3, k8, K);
      yb[0] = finish(b0, xb, w0, k8, K);
      yb[1] = finish(b1, xb, w1, k8, K);
      yb[2] = finish(b2, xb, w2, k8, K);
      yb[3] = finish(b3, xb, w3, k8, K);
    }
    for (; m < M; ++m) {
      const float* xr = x + static_cast<size_t>(m) * K;
      __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps(), a2 = _mm256_setzero_ps(),
             a3 = _mm256_setzero_ps();
      for (int k = 0; k < k8; k += 8) {
        prefetch_step(w0, k);
        __m256 xv = _mm256_loadu_ps(xr + k);
        a0 = _mm256_fmadd_ps(xv, wload8(w0 + k), a0);
        a1 = _mm256_fmadd_ps(xv, wload8(w1 + k), a1);
        a2 = _mm256_fmadd_ps(xv, wload8(w2 + k), a2);
        a3 = _mm256_fmadd_ps(xv, wload8(w3 + k), a3);
      }
      float* yr = y + static_cast<size_t>(m) * N + n;
      yr[0] = finish(a0, xr, w0, k8, K);
      yr[1] = finish(a1, xr, w1, k8, K);
      yr[2] = finish(a2, xr, w2, k8, K);
      yr[3] = finish(a3, xr, w3, k8, K);
    }
  }
  // Leftover weight rows: the same single-row arithmetic.
  for (; n < n1; ++n) {
    const W* w0 = w + static_cast<size_t>(n) * K;
    for (int m = 0; m < M; ++m) {
      const float* xr = x + static_cast<size_t>(m) * K;
      __m256 a0 = _mm256_setzero_ps();
      for (int k = 0; k < k8; k += 8) a0 = _mm256_fmadd_ps(_mm256_loadu_ps(xr + k), wload8(w0 + k), a0);
      y[static_cast<size_t>(m) * N + n] = finish(a0, xr, w0, k8, K);
    }
  }
}


// AVX-512 form of the same arithmetic: a 512-bit register holds the eight lanes of two weight
// rows ([w_n | w_n+1]) against the input row broadcast to both halves, so one FMA does the work
// of two 256-bit ones with the very same per-lane sequence, and each half reduces with
// reduce8 as before: results are bit-identical to block_avx2. With 32 registers, all the input
// rows of a tile of up to 8 (16 accumulators) run in one pass over a block of 4 weight rows,
// so the weights stream from memory once while the arithmetic overlaps the stream.

// Eight weights of row r0 and eight of r1 as one 512-bit register [r0 | r1], in as few
// instructions as the dtype allows (the tiles below are bound by them when weights stream from
// cache). Halves inserted into a zero register: GCC 12 warns about the undefined upper half of
// its casts and zero-extensions between widths (-Wmaybe-uninitialized); the zero folds away.
__attribute__((target("avx512f,avx512dq,avx2,fma"))) inline __m512 wpair(const float* r0, const float* r1) {
  return _mm512_insertf32x8(_mm512_insertf32x8(_mm512_setzero_ps(), _mm256_loadu_ps(r0), 0), _mm256_loadu_ps(r1), 1);
}
// bf16: both halves' sixteen values widened at once, then shifted into the f32 high halves.
__attribute__((target("avx512f,avx512dq,avx2,fma"))) inline __m512 wpair(const bf16_t* r0, const bf16_t* r1) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r0));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r1));
  const __m256i ab = _mm256_inserti128_si256(_mm256_inserti128_si256(_mm256_setzero_si256(), a, 0), b, 1);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(ab), 16));
}

template <int MT, class W>
__attribute__((target("avx512f,avx512dq,avx2,fma"))) inline void tile_avx512(const float* x, const W* w0, float* y,
                                                                           int K, int N, int k8) {
  const W* w1 = w0 + K;
  const W* w2 = w1 + K;
  const W* w3 = w2 + K;
  __m512 lo[MT], hi[MT];  // lo: rows n, n+1; hi: rows n+2, n+3
  for (int m = 0; m < MT; ++m) lo[m] = hi[m] = _mm512_setzero_ps();
  for (int k = 0; k < k8; k += 8) {
    prefetch_step(w0, k);
    const __m512 a = wpair(w0 + k, w1 + k);
    const __m512 b = wpair(w2 + k, w3 + k);
    for (int m = 0; m < MT; ++m) {
      const __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + static_cast<size_t>(m) * K + k));
      lo[m] = _mm512_fmadd_ps(xv, a, lo[m]);
      hi[m] = _mm512_fmadd_ps(xv, b, hi[m]);
    }
  }
  for (int m = 0; m < MT; ++m) {
    const float* xr = x + static_cast<size_t>(m) * K;
    float* yr = y + static_cast<size_t>(m) * N;
    yr[0] = finish(_mm512_extractf32x8_ps(lo[m], 0), xr, w0, k8, K);
    yr[1] = finish(_mm512_extractf32x8_ps(lo[m], 1), xr, w1, k8, K);
    yr[2] = finish(_mm512_extractf32x8_ps(hi[m], 0), xr, w2, k8, K);
    yr[3] = finish(_mm512_extractf32x8_ps(hi[m], 1), xr, w3, k8, K);
  }
}

template <class W>
__attribute__((target("avx512f,avx512dq,avx2,fma"))) void block_avx512(const float* x, const W* w, float* y, int M,
                                                                     int K, int N, int n0, int n1) {
  const int k8 = K & ~7;
  int n = n0;
  for (; n + 4 <= n1; n += 4) {
    const W* w0 = w + static_cast<size_t>(n) * K;
    for (int m = 0; m < M; m += 8) {
      const float* xm = x + static_cast<size_t>(m) * K;
      float* ym = y + static_cast<size_t>(m) * N + n;
      switch (std::min(8, M - m)) {
        case 8: tile_avx512<8, W>(xm, w0, ym, K, N, k8); break;
        case 7: tile_avx512<7, W>(xm, w0, ym, K, N, k8); break;
        case 6: tile_avx512<6, W>(xm, w0, ym, K, N, k8); break;
        case 5: tile_avx512<5, W>(xm, w0, ym, K, N, k8); break;
        case 4: tile_avx512<4, W>(xm, w0, ym, K, N, k8); break;
        case 3: tile_avx512<3, W>(xm, w0, ym, K, N, k8); break;
        case 2: tile_avx512<2, W>(xm, w0, ym, K, N, k8); break;
        default: tile_avx512<1, W>(xm, w0, ym, K, N, k8); break;
      }
    }
  }
  // Leftover weight rows: the AVX2 single-row arithmetic, as there.
  if (n < n1) block_avx2(x, w, y, M, K, N, n, n1);
}

#endif

}  // namespace

template <class W>
void row_linear_impl(const float* x, const W* w, float* y, int M, int K, int N) {
  auto block = [&](int n0, int n1) {
#ifdef MLXR_X86
    if (has_avx512()) return block_avx512(x, w, y, M, K, N, n0, n1);
    if (has_avx2_fma()) return block_avx2(x, w, y, M, K, N, n0, n1);
#endif
    block_generic(x, w, y, M, K, N, n0, n1);
  };
  split_columns(N, static_cast<size_t>(N) * K * std::max(M, 1), block);
}

void row_linear_kernel(const float* x, const float* w, float* y, int M, int K, int N) {
  row_linear_impl(x, w, y, M, K, N);
}

void row_linear_kernel(const float* x, const bf16_t* w, float* y, int M, int K, int N) {
  row_linear_impl(x, w, y, M, K, N);
}

void row_linear_array(const float* x, const mx::array& w, float* y, int M, int K, int N) {
  if (w.dtype() == mx::bfloat16) {
    row_linear_kernel(x, reinterpret_cast<const bf16_t*>(w.data<mx::bfloat16_t>()), y, M, K, N);
  } else {
    row_linear_kernel(x, w.data<float>(), y, M, K, N);
  }
}

namespace {

class RowLinear : public CpuOnlyUnary {
 public:
  explicit RowLinear(mx::Stream s) : CpuOnlyUnary(s) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    // w must be row-contiguous (built so); x, a few rows, is read through RowMajor.
    auto held = hold_row_inputs({inputs[1], inputs[0]}, out, stream(), "RowLinear", 1);
    // x [.., K]: every leading axis is rows.
    const int K = held[1].shape(-1), N = held[0].shape(0);
    const int M = K > 0 ? static_cast<int>(held[1].size() / K) : 0;
    mx::cpu::get_command_encoder(stream()).dispatch([x = held[1], w = held[0], out = mx::array::unsafe_weak_copy(out),
                                                     M, K, N]() mutable {
      RowMajor in;
      row_linear_array(in(x), w, out.data<float>(), M, K, N);
    });
  }

  // d(x Wᵀ): dx = dy W, dW = dyᵀ x (plain MLX ops; training never needs the row invariance).
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums, const std::vector<mx::array>&) override {
    std::vector<mx::array> grads;
    for (int a : argnums) {
      if (a == 0) {
        grads.push_back(mx::matmul(cotangents[0], primals[1], stream()));
      } else {
        auto s = stream();
        const int N = primals[1].shape(0), K = primals[1].shape(1);
        auto dy = mx::reshape(cotangents[0], {-1, N}, s);  // [M, N]
        auto x = mx::reshape(primals[0], {-1, K}, s);      // [M, K]
        grads.push_back(mx::matmul(mx::transpose(dy, {1, 0}, s), x, s));
      }
    }
    return grads;
  }

  DEFINE_NAME(RowLinear)
  DEFINE_DEFAULT_IS_EQUIVALENT()
};

}  // namespace

rust::String row_linear_isa() {
#ifdef MLXR_X86
  if (has_avx512()) return "avx512";
  if (has_avx2_fma()) return "avx2";
#endif
  return "generic";
}

bool row_linear_paths_agree(int M, int K, int N) {
#ifdef MLXR_X86
  std::vector<float> x(static_cast<size_t>(M) * K), w(static_cast<size_t>(N) * K);
  uint32_t s = 12345;
  auto next = [&s] {
    s = s * 1664525u + 1013904223u;
    return static_cast<float>(static_cast<int32_t>(s >> 8) - (1 << 23)) / static_cast<float>(1 << 23);
  };
  // Weights representable in bf16, so the bf16 forms must give the f32 forms' bits too.
  std::vector<bf16_t> wb(w.size());
  for (auto& v : x) v = next();
  for (size_t i = 0; i < w.size(); ++i) {
    const float f = next();
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    wb[i] = static_cast<bf16_t>(u >> 16);
    w[i] = wval(wb[i]);
  }
  std::vector<float> a(static_cast<size_t>(M) * N), b(a.size()), c(a.size()), d(a.size());
  auto run = [&](auto* wp, float* out, bool wide) {
    if (wide && has_avx512()) return block_avx512(x.data(), wp, out, M, K, N, 0, N);
    if (has_avx2_fma()) return block_avx2(x.data(), wp, out, M, K, N, 0, N);
    block_generic(x.data(), wp, out, M, K, N, 0, N);
  };
  run(w.data(), a.data(), true);
  run(w.data(), b.data(), false);
  run(wb.data(), c.data(), true);
  run(wb.data(), d.data(), false);
  const size_t bytes = a.size() * sizeof(float);
  return std::memcmp(a.data(), b.data(), bytes) == 0 && std::memcmp(a.data(), c.data(), bytes) == 0 &&
         std::memcmp(a.data(), d.data(), bytes) == 0;
#else
  return true;
#endif
}

ArrayPtr row_linear(const Array& x, const Array& w) {
  const auto& xi = x.inner;
  const auto& wi = w.inner;
  if (xi.ndim() < 1 || wi.ndim() != 2 || xi.shape(-1) != wi.shape(1)) {
    throw std::invalid_argument("row_linear: expected x [.., K] and w [N, K]");
  }
  if (xi.dtype() != mx::float32 || (wi.dtype() != mx::float32 && wi.dtype() != mx::bfloat16)) {
    throw std::invalid_argument("row_linear: x must be float32 and w float32 or bfloat16");
  }
  auto s = mx::default_stream(mx::Device(mx::Device::cpu));
  auto wc = row_contiguous(wi, s);
  auto shape = xi.shape();
  shape.back() = wi.shape(0);
  return std::make_unique<Array>(mx::array(shape, mx::float32, std::make_shared<RowLinear>(s), {xi, wc}));
}

}  // namespace mlxr
