// 4-bit weights against 8-bit activations: integer dot products for few-row products.
//
// Dequantizing a 4-bit weight in registers (widen, convert, fma) costs more instructions than
// streaming its half byte, so the f32 packed kernel is bound by instructions, no faster than the
// 8-bit one. This path does what llama.cpp's q4 kernels do: each input row is quantized to 8 bits
// in blocks of 32 inputs (scale sx = max|x| / 127, values rounded to nearest, ties to even), and
// nibbles are multiplied by those bytes with integer dot products, 64 products an instruction
// where the CPU has them (AVX-512 VNNI; AVX2 pairs bytes with maddubs).
//
// Exactness across batch sizes is kept by construction. Per chunk of 128 inputs, lane i (0..15)
// takes the exact integer sum of the eight products of inputs 8i..8i+7 (integers: the same in any
// order), then adds to its f32 accumulator fma(isum, s·sx, acc) and fma(b, sx·Σq, acc), with s
// and b the scale and bias of the weights' group, sx the activation block's scale and Σq the
// integer sum of those eight rounded inputs. The sixteen lanes end in one fixed tree (lane i plus
// lane i+8, then row_linear's eight-lane tree). Every quantity is a function of the row alone, so
// a row's bits do not depend on the number of rows, and the AVX-512, AVX2 and portable forms
// give the same bits (tested).
//
// The rounding of activations to 8 bits is the price: outputs differ from the dequantized f32
// product by about 1/254 of an input block's largest value per input, as llama.cpp's q4_0 and
// q8_0 paths do. MLX_CORE_Q4_F32=1 keeps 4-bit products on the f32 kernel (row_quantized.cc).
#include "mlx-core/src/sys/shim.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "mlx-core/src/sys/row_kernel.h"
#include "mlx-core/src/sys/row_packed.h"
#include "mlx-core/src/sys/row_split.h"

namespace mlxr {
namespace {

constexpr int kChunk = 128;        // inputs per chunk: 64 packed bytes
constexpr int kLanes = 16;         // lanes per chunk, eight inputs each
constexpr int kActivationBlock = 32;  // inputs sharing one activation scale

// Input rows quantized for the integer path. Per chunk of 128 inputs, the 64 bytes of the even
// inputs then the 64 of the odd ones: byte t of the packed weights holds inputs 2t (low nibble)
// and 2t + 1 (high nibble), so nibbles and activations line up byte for byte.
struct QuantizedRows {
  int K = 0;
  std::vector<int8_t> q;      // [M, K]
  std::vector<float> scale;   // [M, K / 8]: each lane's activation scale sx
  std::vector<float> sum;     // [M, K / 8]: each lane's sum of its eight rounded inputs, sx·Σq
  const int8_t* q_row(int m) const { return q.data() + static_cast<size_t>(m) * K; }
  const float* scale_row(int m) const { return scale.data() + static_cast<size_t>(m) * (K / 8); }
  const float* sum_row(int m) const { return sum.data() + static_cast<size_t>(m) * (K / 8); }
};

QuantizedRows quantize_rows(const float* x, int M, int K) {
  QuantizedRows r;
  r.K = K;
  r.q.assign(static_cast<size_t>(M) * K, 0);
  r.scale.assign(static_cast<size_t>(M) * K / 8, 0.0f);
  r.sum.assign(r.scale.size(), 0.0f);
  for (int m = 0; m < M; ++m) {
    const float* xr = x + static_cast<size_t>(m) * K;
    int8_t* q = r.q.data() + static_cast<size_t>(m) * K;
    float* sc = r.scale.data() + static_cast<size_t>(m) * (K / 8);
    float* su = r.sum.data() + static_cast<size_t>(m) * (K / 8);
    for (int b = 0; b < K; b += kActivationBlock) {
      float amax = 0.0f;
      for (int k = b; k < b + kActivationBlock; ++k) {
        const float a = std::fabs(xr[k]);
        if (std::isnan(a) || a > amax) amax = a;  // a NaN sticks
      }
      // A non-finite block gives a non-finite scale, hence non-finite outputs, as f32 would.
      const bool finite = std::isfinite(amax);
      const float sx = amax / 127.0f;
      const float inv = finite && amax > 0.0f ? 127.0f / amax : 0.0f;
      for (int k = b; k < b + kActivationBlock; ++k) {
        const float v = finite ? std::nearbyint(xr[k] * inv) : 0.0f;
        const int c = k / kChunk, t = k % kChunk;
        q[c * kChunk + (t % 2) * (kChunk / 2) + t / 2] = static_cast<int8_t>(std::clamp(v, -127.0f, 127.0f));
      }
      for (int l = b / 8; l < (b + kActivationBlock) / 8; ++l) sc[l] = sx;
    }
    // The bias term multiplies the sum of the *rounded* inputs: with the same rounding on both
    // terms the error is Σ w·(x̂ − x) over the dequantized (centred) weights, three times smaller
    // here than pairing rounded inputs with nibbles (0..15) and exact ones with the bias.
    for (int l = 0; l < K / 8; ++l) {
      int32_t qs = 0;
      for (int j = 0; j < 8; ++j) {
        const int k = 8 * l + j, c = k / kChunk, t = k % kChunk;
        qs += q[c * kChunk + (t % 2) * (kChunk / 2) + t / 2];
      }
      su[l] = static_cast<float>(qs) * sc[l];
    }
  }
  return r;
}

// The sixteen lanes' fixed tree: lane i plus lane i + 8, then row_linear's eight-lane tree.
inline float reduce16(const float* a) {
  float t[8];
  for (int i = 0; i < 8; ++i) t[i] = a[i] + a[i + 8];
  return ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));
}

void block_generic(const QuantizedRows& xq, const Packed& p, float* y, int M, int N, int n0, int n1) {
  const int G = p.groups();
  for (int n = n0; n < n1; ++n) {
    const uint8_t* r = p.row(n);
    const float* s = p.scales + static_cast<size_t>(n) * G;
    const float* b = p.biases + static_cast<size_t>(n) * G;
    for (int m = 0; m < M; ++m) {
      const int8_t* q = xq.q_row(m);
      const float* sx = xq.scale_row(m);
      const float* xs = xq.sum_row(m);
      float acc[kLanes] = {};
      for (int c = 0; c < p.K / kChunk; ++c) {
        const uint8_t* w = r + c * (kChunk / 2);
        const int8_t* qc = q + c * kChunk;
        for (int i = 0; i < kLanes; ++i) {
          int32_t isum = 0;
          for (int t = 4 * i; t < 4 * i + 4; ++t) isum += (w[t] & 15) * qc[t] + (w[t] >> 4) * qc[kChunk / 2 + t];
          const int g = (c * kChunk + 8 * i) / p.group, lane = c * kLanes + i;
          acc[i] = std::fma(static_cast<float>(isum), s[g] * sx[lane], acc[i]);
          acc[i] = std::fma(b[g], xs[lane], acc[i]);
        }
      }
      y[static_cast<size_t>(m) * N + n] = reduce16(acc);
    }
  }
}

#ifdef MLXR_X86
// Lane i's weight group within a chunk, as an index into the chunk's 128 / group scales.
inline int lane_group(int i, int group) { return 8 * i / group; }

// AVX2: a chunk's sixteen lanes in two registers (lanes 0..7 from its first 32 packed bytes,
// 8..15 from the next 32). maddubs pairs u8 nibbles with s8 activations into i16 (at most
// 2·15·127, no saturation), madd with ones sums the pairs into the lanes' i32.
__attribute__((target("avx2,fma"))) void block_avx2(const QuantizedRows& xq, const Packed& p, float* y, int M, int N,
                                                   int n0, int n1) {
  const int G = p.groups();
  const __m256i low4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  for (int n = n0; n < n1; ++n) {
    const uint8_t* r = p.row(n);
    const float* s = p.scales + static_cast<size_t>(n) * G;
    const float* b = p.biases + static_cast<size_t>(n) * G;
    for (int m = 0; m < M; ++m) {
      const int8_t* q = xq.q_row(m);
      const float* sx = xq.scale_row(m);
      const float* xs = xq.sum_row(m);
      __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
      for (int c = 0; c < p.K / kChunk; ++c) {
        alignas(32) float sl[kLanes], bl[kLanes];
        for (int i = 0; i < kLanes; ++i) {
          const int g = c * (kChunk / p.group) + lane_group(i, p.group);
          sl[i] = s[g];
          bl[i] = b[g];
        }
        for (int h = 0; h < 2; ++h) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r + c * (kChunk / 2) + 32 * h));
          const __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
          const int8_t* qc = q + c * kChunk + 32 * h;
          const __m256i xe = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qc));
          const __m256i xo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qc + kChunk / 2));
          const __m256i isum = _mm256_add_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(lo, xe), ones),
                                                _mm256_madd_epi16(_mm256_maddubs_epi16(hi, xo), ones));
          const int lane = c * kLanes + 8 * h;
          const __m256 scale = _mm256_mul_ps(_mm256_load_ps(sl + 8 * h), _mm256_loadu_ps(sx + lane));
          acc[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc[h]);
          acc[h] = _mm256_fmadd_ps(_mm256_load_ps(bl + 8 * h), _mm256_loadu_ps(xs + lane), acc[h]);
        }
      }
      y[static_cast<size_t>(m) * N + n] = reduce8(_mm256_add_ps(acc[0], acc[1]));
    }
  }
}

inline bool has_vnni() {
  static const bool yes =
      has_avx512() && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vnni");
  return yes;
}

#define MLXR_VNNI "avx512f,avx512dq,avx512bw,avx512vnni,avx2,fma"

// A chunk's per-lane values of a [N, G] table for row n: its 128 / group entries spread over
// the lanes of their groups.
__attribute__((target(MLXR_VNNI))) inline __m512 lane_values(const float* t, int c, int group, __m512i spread) {
  const int per = kChunk / group;
  return _mm512_permutexvar_ps(spread, _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << per) - 1), t + c * per));
}

// Two weight rows (n, n + 1) against MT input rows: each chunk's nibbles are split once and
// shared by the MT rows' dot products.
template <int MT>
__attribute__((target(MLXR_VNNI))) inline void tile_vnni(const QuantizedRows& xq, int m0, const Packed& p, int n,
                                                        float* y, int N, __m512i spread) {
  const int G = p.groups();
  const uint8_t* r[2] = {p.row(n), p.row(n + 1)};
  const char* pf = reinterpret_cast<const char*>(r[0]) + kPrefetchAhead;
  const __m512i low4 = _mm512_set1_epi8(15);
  __m512 acc[MT][2];
  for (int m = 0; m < MT; ++m) acc[m][0] = acc[m][1] = _mm512_setzero_ps();
  for (int c = 0; c < p.K / kChunk; ++c) {
    // The two rows are one contiguous stream of 2·K/2 bytes, consumed 128 bytes a chunk.
    _mm_prefetch(pf + static_cast<size_t>(c) * 128, _MM_HINT_T0);
    _mm_prefetch(pf + static_cast<size_t>(c) * 128 + 64, _MM_HINT_T0);
    __m512i lo[2], hi[2];
    __m512 s[2], b[2];
    for (int j = 0; j < 2; ++j) {
      const __m512i v = _mm512_loadu_si512(r[j] + c * (kChunk / 2));
      lo[j] = _mm512_and_si512(v, low4);
      hi[j] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
      s[j] = lane_values(p.scales + static_cast<size_t>(n + j) * G, c, p.group, spread);
      b[j] = lane_values(p.biases + static_cast<size_t>(n + j) * G, c, p.group, spread);
    }
    for (int m = 0; m < MT; ++m) {
      const int8_t* qc = xq.q_row(m0 + m) + c * kChunk;
      const __m512i xe = _mm512_loadu_si512(qc), xo = _mm512_loadu_si512(qc + kChunk / 2);
      const __m512 sx = _mm512_loadu_ps(xq.scale_row(m0 + m) + c * kLanes);
      const __m512 xs = _mm512_loadu_ps(xq.sum_row(m0 + m) + c * kLanes);
      for (int j = 0; j < 2; ++j) {
        const __m512i isum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(_mm512_setzero_si512(), lo[j], xe), hi[j], xo);
        acc[m][j] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(s[j], sx), acc[m][j]);
        acc[m][j] = _mm512_fmadd_ps(b[j], xs, acc[m][j]);
      }
    }
  }
  for (int m = 0; m < MT; ++m) {
    for (int j = 0; j < 2; ++j) {
      const __m256 t = _mm256_add_ps(_mm512_extractf32x8_ps(acc[m][j], 0), _mm512_extractf32x8_ps(acc[m][j], 1));
      y[static_cast<size_t>(m0 + m) * N + n + j] = reduce8(t);
    }
  }
}

__attribute__((target(MLXR_VNNI))) void block_vnni(const QuantizedRows& xq, const Packed& p, float* y, int M, int N,
                                                  int n0, int n1) {
  alignas(64) int32_t idx[kLanes];
  for (int i = 0; i < kLanes; ++i) idx[i] = lane_group(i, p.group);
  const __m512i spread = _mm512_load_si512(idx);
  int n = n0;
  for (; n + 2 <= n1; n += 2) {
    for (int m = 0; m < M; m += 4) {
      switch (std::min(4, M - m)) {
        case 4: tile_vnni<4>(xq, m, p, n, y, N, spread); break;
        case 3: tile_vnni<3>(xq, m, p, n, y, N, spread); break;
        case 2: tile_vnni<2>(xq, m, p, n, y, N, spread); break;
        default: tile_vnni<1>(xq, m, p, n, y, N, spread); break;
      }
    }
  }
  if (n < n1) block_generic(xq, p, y, M, N, n, n1);
}
#endif

enum class Isa { Generic, Avx2, Vnni };

Isa best_isa() {
#ifdef MLXR_X86
  if (has_vnni()) return Isa::Vnni;
  if (has_avx2_fma()) return Isa::Avx2;
#endif
  return Isa::Generic;
}

void run_block(Isa isa, const QuantizedRows& xq, const Packed& p, float* y, int M, int N, int n0, int n1) {
#ifdef MLXR_X86
  if (isa == Isa::Vnni) return block_vnni(xq, p, y, M, N, n0, n1);
  if (isa == Isa::Avx2) return block_avx2(xq, p, y, M, N, n0, n1);
#endif
  (void)isa;
  block_generic(xq, p, y, M, N, n0, n1);
}

}  // namespace

bool nibble_dot_applies(const Packed& p) {
  static const bool off = std::getenv("MLX_CORE_Q4_F32") != nullptr;
  return p.bits == 4 && p.K % kChunk == 0 && !off;
}

void nibble_dot_kernel(const float* x, const Packed& p, float* y, int M, int N) {
  const QuantizedRows xq = quantize_rows(x, M, p.K);
  const Isa isa = best_isa();
  split_columns(N, static_cast<size_t>(N) * p.K * std::max(M, 1) / 4,
                [&](int n0, int n1) { run_block(isa, xq, p, y, M, N, n0, n1); });
}

bool nibble_dot_paths_agree(int M, int K, int N, int group) {
  if (K % kChunk != 0 || K % group != 0) return false;
  const RandomPacked r(M, K, N, 4, group, 4242u + static_cast<uint32_t>(group));
  const Packed& p = r.p;
  const QuantizedRows xq = quantize_rows(r.x.data(), M, K);
  std::vector<float> want(static_cast<size_t>(M) * N), got(want.size());
  run_block(Isa::Generic, xq, p, want.data(), M, N, 0, N);
#ifdef MLXR_X86
  for (Isa isa : {Isa::Avx2, Isa::Vnni}) {
    if (isa == Isa::Vnni && !has_vnni()) continue;
    if (!has_avx2_fma()) continue;
    std::fill(got.begin(), got.end(), 0.0f);
    run_block(isa, xq, p, got.data(), M, N, 0, N);
    if (std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) != 0) return false;
  }
#endif
  return true;
}

}  // namespace mlxr
