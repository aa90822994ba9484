// One MLX-affine packed matrix as the packed row kernels read it (row_quantized.cc, and the
// 4-bit integer path in row_nibble_dot.cc).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

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

// A random packed [N, K] matrix and [M, K] inputs from `seed`, for the checks that a kernel's
// vector forms give its portable form's bits.
struct RandomPacked {
  std::vector<uint8_t> bytes;
  std::vector<float> scales, biases, x;
  Packed p;
  RandomPacked(int M, int K, int N, int bits, int group, uint32_t seed)
      : bytes(static_cast<size_t>(N) * K * bits / 8),
        scales(static_cast<size_t>(N) * (K / group)),
        biases(scales.size()),
        x(static_cast<size_t>(M) * K),
        p{nullptr, nullptr, nullptr, K, group, bits} {
    auto next = [&seed] {
      seed = seed * 1664525u + 1013904223u;
      return seed;
    };
    auto unit = [&] {
      return static_cast<float>(static_cast<int32_t>(next() >> 8) - (1 << 23)) / static_cast<float>(1 << 23);
    };
    for (auto& b : bytes) b = static_cast<uint8_t>(next() >> 24);
    for (auto& v : scales) v = 0.01f + 0.02f * std::fabs(unit());
    for (auto& v : biases) v = 0.1f * unit();
    for (auto& v : x) v = unit();
    p = Packed{bytes.data(), scales.data(), biases.data(), K, group, bits};
  }
  RandomPacked(const RandomPacked&) = delete;  // p points into this object's vectors
  RandomPacked& operator=(const RandomPacked&) = delete;
};

// Whether x · Wᵀ for this 4-bit matrix takes the integer path (row_nibble_dot.cc): K a multiple
// of 128 and MLX_CORE_Q4_F32 unset.
bool nibble_dot_applies(const Packed& p);
// y [M, N] = x [M, K] · Wᵀ on the integer path, split over two cores when large enough.
void nibble_dot_kernel(const float* x, const Packed& p, float* y, int M, int N);
// Whether its vector forms give the portable form's bits on random input.
bool nibble_dot_paths_agree(int M, int K, int N, int group);

}  // namespace mlxr
