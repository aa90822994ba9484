// What every single-node CPU kernel of mlx-core shares: the CPU feature check that picks its
// vector path, the set-up before its work runs (inputs checked row-contiguous, the output
// allocated, both registered with the CPU command encoder, weak handles kept for the dispatched
// closure), and the base classes that refuse the GPU (these kernels have no GPU form: callers
// pick them only on the CPU, see mlx_core::blas::row_kernels_for).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"

#if defined(__x86_64__) || defined(_M_X64)
// GCC 12's AVX-512 headers build widening casts and broadcasts from a self-initialized
// "undefined" register and then warn about it (-Wmaybe-uninitialized) wherever they are inlined.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#define MLXR_X86 1
#endif

namespace mlxr {

#ifdef MLXR_X86
// Whether this CPU runs the AVX2 + FMA paths (checked once per process).
inline bool has_avx2_fma() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}

// Whether the AVX-512 forms run (same bits as the AVX2 ones); MLX_CORE_NO_AVX512 turns them off.
inline bool has_avx512() {
  static const bool yes = has_avx2_fma() && __builtin_cpu_supports("avx512f") &&
                          __builtin_cpu_supports("avx512dq") && std::getenv("MLX_CORE_NO_AVX512") == nullptr;
  return yes;
}

// How far ahead of its use a few-row product prefetches its weight stream. Blocks of four weight
// rows read side by side are a pattern the hardware prefetcher follows poorly; one software
// prefetch per cache line consumed, this many bytes ahead in the (contiguous) block stream,
// doubles a one-row product's bandwidth on a bf16 matrix (~9 -> ~17 GB/s on one core).
constexpr size_t kPrefetchAhead = 8192;

// The sum of eight lanes in the row kernels' one fixed order (a row's bits may not depend on the
// path that computed its lanes): ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)).
__attribute__((target("avx2,fma"))) inline float reduce8(__m256 v) {
  // Fixed tree: (l0+l4, l1+l5, l2+l6, l3+l7), then (0+2, 1+3), then 0+1.
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
  return _mm_cvtss_f32(s);
}
#endif

// Registers `inputs` and `out` with the CPU encoder of `stream` and allocates `out`; returns
// weak handles to the inputs for the dispatched closure. The first `contiguous` inputs (all by
// default) must be row-contiguous: callers pass mx::contiguous copies.
inline std::vector<mlx::core::array> hold_row_inputs(const std::vector<mlx::core::array>& inputs,
                                                     mlx::core::array& out, mlx::core::Stream stream,
                                                     const char* kernel, size_t contiguous = SIZE_MAX) {
  namespace mx = mlx::core;
  for (size_t i = 0; i < inputs.size() && i < contiguous; ++i) {
    if (!inputs[i].flags().row_contiguous) {
      throw std::invalid_argument(std::string(kernel) + ": inputs must be row-contiguous");
    }
  }
  out.set_data(mx::allocator::malloc(out.nbytes()));
  auto& enc = mx::cpu::get_command_encoder(stream);
  std::vector<mx::array> held;
  for (const auto& a : inputs) {
    enc.set_input_array(a);
    held.push_back(mx::array::unsafe_weak_copy(a));
  }
  enc.set_output_array(out);
  return held;
}

// `a` as the kernels read it, row-contiguous: an evaluated array that already is (weights, mostly)
// is passed as it is, anything else through a copy node. Sparing a node per weight matters: each
// costs several microseconds of host work per step.
inline mlx::core::array row_contiguous(const mlx::core::array& a, mlx::core::Stream s) {
  return a.is_available() && a.flags().row_contiguous ? a : mlx::core::contiguous(a, false, s);
}

// Row-major f32 data of a kernel's input whatever its strides: the array's own buffer when it is
// row-contiguous, otherwise a copy this object holds. Kernels resolve their activations this way
// at run time, where a Contiguous graph node per input would cost more than the copy of a few
// rows (whether a lazy array will be contiguous is not known when the graph is built).
class RowMajor {
 public:
  const float* operator()(const mlx::core::array& a) {
    if (a.flags().row_contiguous) return a.data<float>();
    copies_.emplace_back(a.size());
    float* out = copies_.back().data();
    const auto& shape = a.shape();
    const auto& strides = a.strides();
    const int nd = static_cast<int>(shape.size());
    std::vector<int> idx(nd, 0);
    const float* base = a.data<float>();
    for (size_t i = 0; i < a.size(); ++i) {
      int64_t off = 0;
      for (int d = 0; d < nd; ++d) off += static_cast<int64_t>(idx[d]) * strides[d];
      out[i] = base[off];
      for (int d = nd - 1; d >= 0 && ++idx[d] == shape[d]; --d) idx[d] = 0;
    }
    return out;
  }

 private:
  std::vector<std::vector<float>> copies_;
};

// A one-output kernel with only a CPU implementation.
class CpuOnlyUnary : public mlx::core::UnaryPrimitive {
 public:
  using mlx::core::UnaryPrimitive::UnaryPrimitive;
  void eval_gpu(const std::vector<mlx::core::array>&, mlx::core::array&) override {
    throw std::runtime_error(std::string(name()) + " runs on the CPU only");
  }
};

// A kernel with several outputs and only a CPU implementation.
class CpuOnlyMulti : public mlx::core::Primitive {
 public:
  using mlx::core::Primitive::Primitive;
  void eval_gpu(const std::vector<mlx::core::array>&, std::vector<mlx::core::array>&) override {
    throw std::runtime_error(std::string(name()) + " runs on the CPU only");
  }
};

}  // namespace mlxr
