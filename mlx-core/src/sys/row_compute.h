// The host functions behind the row primitives, for kernels that chain several of them in one
// graph node (row_layer.cc). Each keeps its primitive's guarantee: an output row's bits depend on
// that row's inputs alone, never on how many rows are computed together.
#pragma once

#include <cstddef>

namespace mlxr {

// y [M, N] = x [M, K] · w [N, K]ᵀ (row_linear.cc), split over two cores when large enough.
void row_linear_kernel(const float* x, const float* w, float* y, int M, int K, int N);

// y = gelu_approx(x) elementwise over n values (row_gelu.cc); y may alias x.
void gelu_kernel(const float* x, float* y, size_t n);

}  // namespace mlxr
