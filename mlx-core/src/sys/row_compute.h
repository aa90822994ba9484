// The host functions behind the row primitives, for kernels that chain several of them in one
// graph node (row_layer.cc). Each keeps its primitive's guarantee: an output row's bits depend on
// that row's inputs alone, never on how many rows are computed together.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "mlx/array.h"

namespace mlxr {

// A bfloat16 weight as stored: the high half of the f32 with the same value.
using bf16_t = uint16_t;

// y [M, N] = x [M, K] · w [N, K]ᵀ (row_linear.cc), split over two cores when large enough.
// bf16 weights are read as the f32 values they are: the same bits as f32 weights.
void row_linear_kernel(const float* x, const float* w, float* y, int M, int K, int N);
void row_linear_kernel(const float* x, const bf16_t* w, float* y, int M, int K, int N);
// The same for a row-contiguous weight array of either dtype.
void row_linear_array(const float* x, const mlx::core::array& w, float* y, int M, int K, int N);

// A weight matrix as the fused kernels take it: dense (f32 or bf16 [N, K]), or MLX-affine
// packed when bits > 0 (uint32 [N, K·bits/32], f32 scales and biases [N, K / group]).
struct RowMatrix {
  mlx::core::array w;
  std::optional<mlx::core::array> scales, biases;
  int group = 0;
  int bits = 0;
};
// Throws, naming `kernel`, unless (bits, group) is a packing the packed kernel reads: 4 or 8
// bits, groups of 32, 64 or 128 (row_quantized.cc).
void check_packing(int bits, int group, const std::string& kernel);
// K, the columns a node multiplies by (a packed matrix's unpacked width); throws, naming
// `kernel`, unless the matrix is 2-D and a packed one's scales and biases are [N, K / group].
int row_matrix_cols(const RowMatrix& m, const std::string& kernel);
// y [M, N] = x [M, K] · Wᵀ for either form (row_quantized.cc): the packed form's rows are
// row_linear's on the matrix dequantized with fma(q, scale, bias), except 4-bit matrices with K
// a multiple of 128, which take the integer path (row_nibble_dot.cc); rows are their own either way.
void row_matrix_apply(const float* x, const RowMatrix& m, float* y, int M, int K, int N);

// y = gelu_approx(x) elementwise over n values (row_gelu.cc); y may alias x.
void gelu_kernel(const float* x, float* y, size_t n);

}  // namespace mlxr
