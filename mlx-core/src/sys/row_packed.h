// One MLX-affine packed matrix as the packed row kernels read it (row_quantized.cc, and the
// 4-bit integer path in row_nibble_dot.cc).
#pragma once

#include <cstddef>
#include <cstdint>

namespace mlxr {

// N rows of K·bits/8 bytes, scales and biases [N, K / group]. Packing (MLX affine): groups of
// `group` consecutive inputs share a scale and a bias; 8-bit weights are one byte each in input
// order, 4-bit ones two per byte, the earlier input in the low nibble.
struct Packed {
  const uint8_t* bytes;
  const float* scales;
  const float* biases;
  int K;
  int group;
  int bits;
  size_t row_bytes() const { return static_cast<size_t>(K) * bits / 8; }
  const uint8_t* row(int n) const { return bytes + static_cast<size_t>(n) * row_bytes(); }
  int groups() const { return K / group; }
};

// Whether x · Wᵀ for this 4-bit matrix takes the integer path (row_nibble_dot.cc): K a multiple
// of 128 and MLX_CORE_Q4_F32 unset.
bool nibble_dot_applies(const Packed& p);
// y [M, N] = x [M, K] · Wᵀ on the integer path, split over two cores when large enough.
void nibble_dot_kernel(const float* x, const Packed& p, float* y, int M, int N);
// Whether its vector forms give the portable form's bits on random input.
bool nibble_dot_paths_agree(int M, int K, int N, int group);

}  // namespace mlxr
