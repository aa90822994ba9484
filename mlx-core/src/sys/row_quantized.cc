// A row-invariant `x @ Wᵀ` for few f32 rows against MLX-affine 8-bit or 4-bit weights, read packed.
//
// A quantized checkpoint dequantized to f32 streams 4× (8-bit) or 8× (4-bit) the bytes it holds
// through every decode step; MLX's own CPU quantized matmul keeps the bytes but is slower still.
// This kernel reads the packed words and dequantizes eight weights at a time in registers,
// w = fma(q, scale, bias) in f32, then runs row_linear's arithmetic on them: each output element
// is one dot product with eight lanes (lane l takes k ≡ l mod 8, FMA in k order) reduced in
// row_linear's fixed tree, whatever the number of rows and wherever a row sits. A row's bits are
// therefore those of row_linear on the matrix dequantized with the same fma, and a decode step
// and the same token inside a verify window agree bit for bit (packing: row_packed.h). 4-bit
// matrices whose K is a multiple of 128 take the integer path instead (row_nibble_dot.cc), with
// the same guarantee and 8-bit activations, unless MLX_CORE_Q4_F32 is set.
#include "mlx-core/src/sys/shim.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "mlx-core/src/sys/row_compute.h"
#include "mlx-core/src/sys/row_kernel.h"
#include "mlx-core/src/sys/row_packed.h"
#include "mlx-core/src/sys/row_split.h"

namespace mx = mlx::core;

namespace mlxr {
namespace {

// Quantized value j (0..7) of the eight at input k (a multiple of 8) of a packed row.
inline int qval(const uint8_t* r, int bits, int k, int j) {
  if (bits == 8) return r[k + j];
  const uint8_t b = r[(k + j) / 2];
  return (j & 1) ? (b >> 4) : (b & 15);
}

// Portable form: the same lanes, fma for the dequantization and the accumulation, and the same
// reduction tree as the vector forms.
void block_generic(const float* x, const Packed& p, float* y, int M, int N, int n0, int n1) {
  for (int n = n0; n < n1; ++n) {
    const uint8_t* r = p.row(n);
    for (int m = 0; m < M; ++m) {
      const float* xr = x + static_cast<size_t>(m) * p.K;
      float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
      for (int k = 0; k < p.K; k += 8) {
        const int g = k / p.group;
        const float s = p.scales[static_cast<size_t>(n) * p.groups() + g];
        const float b = p.biases[static_cast<size_t>(n) * p.groups() + g];
        for (int l = 0; l < 8; ++l) {
          const float w = std::fma(static_cast<float>(qval(r, p.bits, k, l)), s, b);
          acc[l] = std::fma(xr[k + l], w, acc[l]);
        }
      }
      y[static_cast<size_t>(m) * N + n] =
          ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    }
  }
}

#ifdef MLXR_X86
// The quantized weights stream from memory: one prefetch per cache line consumed, kPrefetchAhead
// bytes ahead in the contiguous stream of a block of four rows.

// Eight quantized values as f32 (exact: they are small integers).
template <int BITS>
__attribute__((target("avx2,fma"))) inline __m256 q8_avx2(const uint8_t* r, int k) {
  if constexpr (BITS == 8) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(r + k))));
  } else {
    uint32_t u;
    std::memcpy(&u, r + k / 2, sizeof u);
    const __m256i shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    const __m256i v = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(u)), shifts),
                                       _mm256_set1_epi32(15));
    return _mm256_cvtepi32_ps(v);
  }
}

// MT input rows against four weight rows: the eight weights of each row dequantized once per
// k-step and shared by the MT rows' accumulators.
template <int BITS, int MT>
__attribute__((target("avx2,fma"))) inline void tile_avx2(const float* x, const Packed& p, int n, float* y, int N) {
  const uint8_t* r[4] = {p.row(n), p.row(n + 1), p.row(n + 2), p.row(n + 3)};
  const char* pf = reinterpret_cast<const char*>(r[0]) + kPrefetchAhead;
  __m256 acc[MT][4];
  for (int m = 0; m < MT; ++m)
    for (int j = 0; j < 4; ++j) acc[m][j] = _mm256_setzero_ps();
  const int G = p.groups();
  for (int g = 0; g < G; ++g) {
    __m256 s[4], b[4];
    for (int j = 0; j < 4; ++j) {
      s[j] = _mm256_set1_ps(p.scales[static_cast<size_t>(n + j) * G + g]);
      b[j] = _mm256_set1_ps(p.biases[static_cast<size_t>(n + j) * G + g]);
    }
    for (int k = g * p.group; k < (g + 1) * p.group; k += 8) {
      if ((k / 8) % (16 / BITS) == 0) _mm_prefetch(pf + static_cast<size_t>(k / 8) * 4 * BITS, _MM_HINT_T0);
      __m256 w[4];
      for (int j = 0; j < 4; ++j) w[j] = _mm256_fmadd_ps(q8_avx2<BITS>(r[j], k), s[j], b[j]);
      for (int m = 0; m < MT; ++m) {
        const __m256 xv = _mm256_loadu_ps(x + static_cast<size_t>(m) * p.K + k);
        for (int j = 0; j < 4; ++j) acc[m][j] = _mm256_fmadd_ps(xv, w[j], acc[m][j]);
      }
    }
  }
  for (int m = 0; m < MT; ++m)
    for (int j = 0; j < 4; ++j) y[static_cast<size_t>(m) * N + n + j] = reduce8(acc[m][j]);
}

template <int BITS>
__attribute__((target("avx2,fma"))) void block_avx2(const float* x, const Packed& p, float* y, int M, int N, int n0,
                                                   int n1) {
  int n = n0;
  for (; n + 4 <= n1; n += 4) {
    int m = 0;
    for (; m + 3 <= M; m += 3) tile_avx2<BITS, 3>(x + static_cast<size_t>(m) * p.K, p, n, y + static_cast<size_t>(m) * N, N);
    if (M - m == 2) tile_avx2<BITS, 2>(x + static_cast<size_t>(m) * p.K, p, n, y + static_cast<size_t>(m) * N, N);
    if (M - m == 1) tile_avx2<BITS, 1>(x + static_cast<size_t>(m) * p.K, p, n, y + static_cast<size_t>(m) * N, N);
  }
  if (n < n1) block_generic(x, p, y, M, N, n, n1);
}

// AVX-512: one register holds the eight lanes of two weight rows, as in row_linear.cc; the
// quantized values of both rows are widened together and dequantized with [s_r0 | s_r1].
__attribute__((target("avx512f,avx512dq,avx2,fma"))) inline __m512 both(__m256 lo, __m256 hi) {
  // Into a zero register: GCC 12 warns about the undefined upper half of its widening casts.
  return _mm512_insertf32x8(_mm512_insertf32x8(_mm512_setzero_ps(), lo, 0), hi, 1);
}

// Group g's value of `t` [N, G] for rows n and n + 1, each over its eight lanes.
__attribute__((target("avx512f,avx512dq,avx2,fma"))) inline __m512 group_pair(const float* t, int n, int G, int g) {
  return both(_mm256_set1_ps(t[static_cast<size_t>(n) * G + g]), _mm256_set1_ps(t[static_cast<size_t>(n + 1) * G + g]));
}

template <int BITS>
__attribute__((target("avx512f,avx512dq,avx2,fma"))) inline __m512 qpair(const uint8_t* r0, const uint8_t* r1, int k) {
  if constexpr (BITS == 8) {
    const __m128i v = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(r0 + k)),
                                         _mm_loadl_epi64(reinterpret_cast<const __m128i*>(r1 + k)));
    return _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));
  } else {
    uint32_t u0, u1;
    std::memcpy(&u0, r0 + k / 2, sizeof u0);
    std::memcpy(&u1, r1 + k / 2, sizeof u1);
    const __m512i words = _mm512_inserti64x4(_mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi32(static_cast<int>(u0)), 0),
                                             _mm256_set1_epi32(static_cast<int>(u1)), 1);
    const __m512i shifts = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(words, shifts), _mm512_set1_epi32(15)));
  }
}

template <int BITS, int MT>
__attribute__((target("avx512f,avx512dq,avx2,fma"))) inline void tile_avx512(const float* x, const Packed& p, int n,
                                                                           float* y, int N) {
  const uint8_t* r0 = p.row(n);
  const uint8_t* r1 = p.row(n + 1);
  const uint8_t* r2 = p.row(n + 2);
  const uint8_t* r3 = p.row(n + 3);
  const char* pf = reinterpret_cast<const char*>(r0) + kPrefetchAhead;
  __m512 lo[MT], hi[MT];  // lo: rows n, n+1; hi: rows n+2, n+3
  for (int m = 0; m < MT; ++m) lo[m] = hi[m] = _mm512_setzero_ps();
  const int G = p.groups();
  for (int g = 0; g < G; ++g) {
    const __m512 sa = group_pair(p.scales, n, G, g), ba = group_pair(p.biases, n, G, g);
    const __m512 sb = group_pair(p.scales, n + 2, G, g), bb = group_pair(p.biases, n + 2, G, g);
    for (int k = g * p.group; k < (g + 1) * p.group; k += 8) {
      if ((k / 8) % (16 / BITS) == 0) _mm_prefetch(pf + static_cast<size_t>(k / 8) * 4 * BITS, _MM_HINT_T0);
      const __m512 a = _mm512_fmadd_ps(qpair<BITS>(r0, r1, k), sa, ba);
      const __m512 b = _mm512_fmadd_ps(qpair<BITS>(r2, r3, k), sb, bb);
      for (int m = 0; m < MT; ++m) {
        const __m512 xv = _mm512_broadcast_f32x8(_mm256_loadu_ps(x + static_cast<size_t>(m) * p.K + k));
        lo[m] = _mm512_fmadd_ps(xv, a, lo[m]);
        hi[m] = _mm512_fmadd_ps(xv, b, hi[m]);
      }
    }
  }
  for (int m = 0; m < MT; ++m) {
    float* yr = y + static_cast<size_t>(m) * N + n;
    yr[0] = reduce8(_mm512_extractf32x8_ps(lo[m], 0));
    yr[1] = reduce8(_mm512_extractf32x8_ps(lo[m], 1));
    yr[2] = reduce8(_mm512_extractf32x8_ps(hi[m], 0));
    yr[3] = reduce8(_mm512_extractf32x8_ps(hi[m], 1));
  }
}

template <int BITS>
__attribute__((target("avx512f,avx512dq,avx2,fma"))) void block_avx512(const float* x, const Packed& p, float* y, int M,
                                                                     int N, int n0, int n1) {
  int n = n0;
  for (; n + 4 <= n1; n += 4) {
    for (int m = 0; m < M; m += 8) {
      const float* xm = x + static_cast<size_t>(m) * p.K;
      float* ym = y + static_cast<size_t>(m) * N;
      switch (std::min(8, M - m)) {
        case 8: tile_avx512<BITS, 8>(xm, p, n, ym, N); break;
        case 7: tile_avx512<BITS, 7>(xm, p, n, ym, N); break;
        case 6: tile_avx512<BITS, 6>(xm, p, n, ym, N); break;
        case 5: tile_avx512<BITS, 5>(xm, p, n, ym, N); break;
        case 4: tile_avx512<BITS, 4>(xm, p, n, ym, N); break;
        case 3: tile_avx512<BITS, 3>(xm, p, n, ym, N); break;
        case 2: tile_avx512<BITS, 2>(xm, p, n, ym, N); break;
        default: tile_avx512<BITS, 1>(xm, p, n, ym, N); break;
      }
    }
  }
  if (n < n1) block_generic(x, p, y, M, N, n, n1);
}

#endif

enum class Isa { Generic, Avx2, Avx512 };

Isa best_isa() {
#ifdef MLXR_X86
  if (has_avx512()) return Isa::Avx512;
  if (has_avx2_fma()) return Isa::Avx2;
#endif
  return Isa::Generic;
}

void run_block(Isa isa, const float* x, const Packed& p, float* y, int M, int N, int n0, int n1) {
#ifdef MLXR_X86
  if (isa == Isa::Avx512) {
    return p.bits == 8 ? block_avx512<8>(x, p, y, M, N, n0, n1) : block_avx512<4>(x, p, y, M, N, n0, n1);
  }
  if (isa == Isa::Avx2) {
    return p.bits == 8 ? block_avx2<8>(x, p, y, M, N, n0, n1) : block_avx2<4>(x, p, y, M, N, n0, n1);
  }
#endif
  (void)isa;
  block_generic(x, p, y, M, N, n0, n1);
}

// y [M, N]: split over two cores by weight rows when large enough, as row_linear does.
void row_quantized_kernel(const float* x, const Packed& p, float* y, int M, int N) {
  if (nibble_dot_applies(p)) return nibble_dot_kernel(x, p, y, M, N);
  const Isa isa = best_isa();
  auto block = [&](int n0, int n1) { run_block(isa, x, p, y, M, N, n0, n1); };
  split_columns(N, static_cast<size_t>(N) * p.K * std::max(M, 1), block);
}

class RowQuantizedLinear : public CpuOnlyUnary {
 public:
  RowQuantizedLinear(mx::Stream s, int group, int bits) : CpuOnlyUnary(s), group_(group), bits_(bits) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    // x is read through RowMajor; the packed weight, scales and biases are row-contiguous.
    auto held = hold_row_inputs({inputs[1], inputs[2], inputs[3], inputs[0]}, out, stream(), "RowQuantizedLinear", 3);
    const int K = held[3].shape(-1), N = held[0].shape(0);
    const int M = K > 0 ? static_cast<int>(held[3].size() / K) : 0;
    mx::cpu::get_command_encoder(stream()).dispatch(
        [w = held[0], s = held[1], b = held[2], x = held[3], out = mx::array::unsafe_weak_copy(out), M, K, N,
         group = group_, bits = bits_]() mutable {
          RowMajor in;
          const Packed p{w.data<uint8_t>(), s.data<float>(), b.data<float>(), K, group, bits};
          row_quantized_kernel(in(x), p, out.data<float>(), M, N);
        });
  }

  DEFINE_NAME(RowQuantizedLinear)
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const RowQuantizedLinear&>(other);
    return group_ == o.group_ && bits_ == o.bits_;
  }

 private:
  int group_;
  int bits_;
};

}  // namespace

ArrayPtr row_quantized_linear(const Array& x, const Array& w, const Array& scales, const Array& biases, int32_t group,
                              int32_t bits) {
  const auto& xi = x.inner;
  check_packing(bits, group, "row_quantized_linear");
  if (xi.ndim() < 1 || xi.dtype() != mx::float32) throw std::invalid_argument("row_quantized_linear: x must be float32 [.., K]");
  const int K = xi.shape(-1);
  const auto& wi = w.inner;
  if (wi.ndim() != 2 || wi.dtype() != mx::uint32 || static_cast<int64_t>(wi.shape(1)) * 32 != static_cast<int64_t>(K) * bits) {
    throw std::invalid_argument("row_quantized_linear: w must be uint32 [N, K·bits/32] for x [.., K]");
  }
  const int N = wi.shape(0);
  for (const auto* t : {&scales.inner, &biases.inner}) {
    if (t->ndim() != 2 || t->dtype() != mx::float32 || t->shape(0) != N || t->shape(1) * group != K) {
      throw std::invalid_argument("row_quantized_linear: scales and biases must be float32 [N, K / group]");
    }
  }
  auto s = mx::default_stream(mx::Device(mx::Device::cpu));
  auto shape = xi.shape();
  shape.back() = N;
  std::vector<mx::array> in{xi, row_contiguous(wi, s), row_contiguous(scales.inner, s), row_contiguous(biases.inner, s)};
  return std::make_unique<Array>(mx::array(shape, mx::float32, std::make_shared<RowQuantizedLinear>(s, group, bits), in));
}

void check_packing(int bits, int group, const std::string& kernel) {
  if (bits != 4 && bits != 8) throw std::invalid_argument(kernel + ": bits must be 4 or 8");
  if (group != 32 && group != 64 && group != 128) throw std::invalid_argument(kernel + ": group must be 32, 64 or 128");
}

int row_matrix_cols(const RowMatrix& m, const std::string& kernel) {
  if (m.w.ndim() != 2) throw std::invalid_argument(kernel + ": weight matrices must be 2-D");
  if (m.bits == 0) return m.w.shape(1);
  const int K = static_cast<int>(static_cast<int64_t>(m.w.shape(1)) * 32 / m.bits);
  for (const auto* t : {&*m.scales, &*m.biases}) {
    if (t->ndim() != 2 || t->shape(0) != m.w.shape(0) || t->shape(1) * m.group != K) {
      throw std::invalid_argument(kernel + ": a packed matrix's scales and biases must be [N, K / group]");
    }
  }
  return K;
}

void row_matrix_apply(const float* x, const RowMatrix& m, float* y, int M, int K, int N) {
  if (m.bits == 0) return row_linear_array(x, m.w, y, M, K, N);
  const Packed p{m.w.data<uint8_t>(), m.scales->data<float>(), m.biases->data<float>(), K, m.group, m.bits};
  row_quantized_kernel(x, p, y, M, N);
}

bool row_quantized_int8_activations(int32_t K, int32_t bits) {
  return nibble_dot_applies(Packed{nullptr, nullptr, nullptr, K, 32, bits});
}

bool row_quantized_paths_agree(int32_t M, int32_t K, int32_t N, int32_t bits, int32_t group) {
  if ((bits != 4 && bits != 8) || K % group != 0) return false;
  if (bits == 4 && K % 128 == 0 && !nibble_dot_paths_agree(M, K, N, group)) return false;
  const RandomPacked r(M, K, N, bits, group, 2024u + static_cast<uint32_t>(bits));
  const Packed& p = r.p;
  std::vector<float> want(static_cast<size_t>(M) * N), got(want.size());
  run_block(Isa::Generic, r.x.data(), p, want.data(), M, N, 0, N);
  for (Isa isa : {Isa::Avx2, Isa::Avx512}) {
#ifdef MLXR_X86
    if (isa == Isa::Avx512 && !has_avx512()) continue;
    if (!has_avx2_fma()) continue;
#else
    continue;
#endif
    std::fill(got.begin(), got.end(), 0.0f);
    run_block(isa, r.x.data(), p, got.data(), M, N, 0, N);
    if (std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) != 0) return false;
  }
  return true;
}

}  // namespace mlxr
