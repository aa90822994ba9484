// A dense decoder layer's few-row chains as two graph nodes (f32, CPU): the attention's input
// side (norm, q/k/v projections, per-head norms) and everything after attention (output
// projection, the norm sandwiches, the GeGLU MLP, residuals, layer scalar).
//
// On a small model a decode step is a few hundred tiny graph nodes, and MLX spends ~10 µs of host
// work per node (graph walk, allocation, dispatch to the stream's thread): the 6.8M default spent
// ~4 ms a token on that against ~1 ms of arithmetic. Here those chains run as plain loops inside
// one node each. Every step is per row (the products are row_linear's kernel, the norms reduce a
// row in a fixed order, gelu is elementwise), so a row's bits do not depend on how many rows are
// computed together: a decode step and the same position in a verify window still agree.
#include "mlx-core/src/sys/shim.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "mlx-core/src/sys/row_compute.h"
#include "mlx-core/src/sys/row_kernel.h"

namespace mx = mlx::core;

namespace mlxr {
namespace {

// y = x / sqrt(mean(x²) + eps) · w over `rows` rows of n (w null: no weight). Eight partial sums
// in a fixed order: a row's bits are its own. y may alias x.
void rms_rows(const float* x, const float* w, float* y, int rows, int n, float eps) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + static_cast<size_t>(r) * n;
    float* yr = y + static_cast<size_t>(r) * n;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8) {
      for (int l = 0; l < 8; ++l) acc[l] += xr[i + l] * xr[i + l];
    }
    float tail = 0;
    for (; i < n; ++i) tail += xr[i] * xr[i];
    const float ss = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7])) + tail;
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
    if (w) {
      for (int j = 0; j < n; ++j) yr[j] = (xr[j] * inv) * w[j];
    } else {
      for (int j = 0; j < n; ++j) yr[j] = xr[j] * inv;
    }
  }
}

// Allocates every output and registers inputs and outputs with the stream's encoder; returns
// weak handles to the inputs for the dispatched closure (all inputs must be row-contiguous).
std::vector<mx::array> hold_all(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs,
                                mx::Stream stream, const char* kernel) {
  auto held = hold_row_inputs(inputs, outputs[0], stream, kernel);
  auto& enc = mx::cpu::get_command_encoder(stream);
  for (size_t i = 1; i < outputs.size(); ++i) {
    outputs[i].set_data(mx::allocator::malloc(outputs[i].nbytes()));
    enc.set_output_array(outputs[i]);
  }
  return held;
}

// inputs: x [R, H], input norm [H], wq [Hq·D, H], q norm [D], wk [Hkv·D, H], k norm [D],
// wv [Hkv·D, H]. outputs: q [R, Hq·D], k [R, Hkv·D] (each head normed with its weight), v
// [R, Hkv·D] (each head normed without weight). Rope and the cache stay outside.
class RowQkv : public CpuOnlyMulti {
 public:
  RowQkv(mx::Stream s, int head_dim, float eps) : CpuOnlyMulti(s), d_(head_dim), eps_(eps) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto held = hold_all(inputs, outputs, stream(), "RowQkv");
    std::vector<float*> outs;
    for (auto& o : outputs) outs.push_back(o.data<float>());
    mx::cpu::get_command_encoder(stream()).dispatch([held = std::move(held), outs, d = d_, eps = eps_]() {
      const int R = held[0].shape(0), H = held[0].shape(1);
      const int nq = held[2].shape(0), nk = held[4].shape(0);
      std::vector<float> xn(static_cast<size_t>(R) * H);
      rms_rows(held[0].data<float>(), held[1].data<float>(), xn.data(), R, H, eps);
      row_linear_kernel(xn.data(), held[2].data<float>(), outs[0], R, H, nq);
      row_linear_kernel(xn.data(), held[4].data<float>(), outs[1], R, H, nk);
      row_linear_kernel(xn.data(), held[6].data<float>(), outs[2], R, H, nk);
      // Per-head norms: a [R, heads·D] buffer is R·heads rows of D.
      rms_rows(outs[0], held[3].data<float>(), outs[0], R * (nq / d), d, eps);
      rms_rows(outs[1], held[5].data<float>(), outs[1], R * (nk / d), d, eps);
      rms_rows(outs[2], nullptr, outs[2], R * (nk / d), d, eps);
    });
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    const int R = inputs[0].shape(0);
    return {{R, inputs[2].shape(0)}, {R, inputs[4].shape(0)}, {R, inputs[6].shape(0)}};
  }

  DEFINE_NAME(RowQkv)
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const RowQkv&>(other);
    return d_ == o.d_ && eps_ == o.eps_;
  }

 private:
  int d_;
  float eps_;
};

// inputs: attention output a [R, Hq·D], residual x [R, H], wo [H, Hq·D], post-attention norm
// [H], pre-feedforward norm [H], w_gate [F, H], w_up [F, H], w_down [H, F], post-feedforward
// norm [H], layer scalar [1]. output [R, H]:
//   h = x + norm(a·woᵀ)·post_attn;  t = norm(h)·pre_ff;
//   out = (h + norm((gelu(t·w_gateᵀ) ∗ t·w_upᵀ)·w_downᵀ)·post_ff) · scalar.
class RowFfn : public CpuOnlyUnary {
 public:
  RowFfn(mx::Stream s, float eps) : CpuOnlyUnary(s), eps_(eps) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    auto held = hold_row_inputs(inputs, out, stream(), "RowFfn");
    mx::cpu::get_command_encoder(stream()).dispatch([held = std::move(held), y = out.data<float>(), eps = eps_]() {
      const int R = held[0].shape(0), A = held[0].shape(1), H = held[1].shape(1), F = held[5].shape(0);
      const size_t rh = static_cast<size_t>(R) * H, rf = static_cast<size_t>(R) * F;
      std::vector<float> h(rh), t(rh), g(rf), u(rf);
      row_linear_kernel(held[0].data<float>(), held[2].data<float>(), t.data(), R, A, H);
      rms_rows(t.data(), held[3].data<float>(), t.data(), R, H, eps);
      const float* x = held[1].data<float>();
      for (size_t i = 0; i < rh; ++i) h[i] = x[i] + t[i];
      rms_rows(h.data(), held[4].data<float>(), t.data(), R, H, eps);
      row_linear_kernel(t.data(), held[5].data<float>(), g.data(), R, H, F);
      row_linear_kernel(t.data(), held[6].data<float>(), u.data(), R, H, F);
      gelu_kernel(g.data(), g.data(), rf);
      for (size_t i = 0; i < rf; ++i) g[i] *= u[i];
      row_linear_kernel(g.data(), held[7].data<float>(), t.data(), R, F, H);
      rms_rows(t.data(), held[8].data<float>(), t.data(), R, H, eps);
      const float scalar = held[9].data<float>()[0];
      for (size_t i = 0; i < rh; ++i) y[i] = (h[i] + t[i]) * scalar;
    });
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {{inputs[1].shape(0), inputs[1].shape(1)}};
  }

  DEFINE_NAME(RowFfn)
  bool is_equivalent(const mx::Primitive& other) const override {
    return eps_ == static_cast<const RowFfn&>(other).eps_;
  }

 private:
  float eps_;
};

// Inputs as the kernels need them: f32 and row-contiguous. Evaluated arrays that already are
// (weights) are passed as they are, sparing a copy node per weight per step.
std::vector<mx::array> prepared(const ArrayList& l, size_t expected, const char* kernel, mx::Stream s) {
  if (l.items.size() != expected) {
    throw std::invalid_argument(std::string(kernel) + ": expected " + std::to_string(expected) + " inputs, got " +
                                std::to_string(l.items.size()));
  }
  std::vector<mx::array> out;
  for (size_t i = 0; i < l.items.size(); ++i) {
    const auto& a = l.items[i];
    if (a.dtype() != mx::float32) {
      throw std::invalid_argument(std::string(kernel) + ": input " + std::to_string(i) + " is not float32");
    }
    out.push_back(a.is_available() && a.flags().row_contiguous ? a : mx::contiguous(a, false, s));
  }
  return out;
}

void expect(bool ok, const char* kernel, const char* what) {
  if (!ok) throw std::invalid_argument(std::string(kernel) + ": " + what);
}

}  // namespace

std::unique_ptr<ArrayList> row_qkv(const ArrayList& inputs, int32_t head_dim, float eps) {
  auto s = mx::default_stream(mx::Device(mx::Device::cpu));
  auto in = prepared(inputs, 7, "row_qkv", s);
  const int H = in[0].ndim() == 2 ? in[0].shape(1) : -1;
  expect(H > 0 && head_dim > 0, "row_qkv", "expected x [R, H] and a positive head_dim");
  for (int i : {2, 4, 6}) {
    expect(in[i].ndim() == 2 && in[i].shape(1) == H && in[i].shape(0) % head_dim == 0, "row_qkv",
           "projection weights must be [heads·head_dim, H]");
  }
  expect(in[4].shape(0) == in[6].shape(0), "row_qkv", "k and v projections must have the same shape");
  for (int i : {3, 5}) expect(in[i].size() == static_cast<size_t>(head_dim), "row_qkv", "q/k norms must be [head_dim]");
  expect(in[1].size() == static_cast<size_t>(H), "row_qkv", "the input norm must be [H]");
  auto prim = std::make_shared<RowQkv>(s, head_dim, eps);
  auto shapes = prim->output_shapes(in);
  auto outs = mx::array::make_arrays(shapes, {mx::float32, mx::float32, mx::float32}, prim, in);
  auto l = std::make_unique<ArrayList>();
  l->items = std::move(outs);
  return l;
}

ArrayPtr row_ffn(const ArrayList& inputs, float eps) {
  auto s = mx::default_stream(mx::Device(mx::Device::cpu));
  auto in = prepared(inputs, 10, "row_ffn", s);
  expect(in[0].ndim() == 2 && in[1].ndim() == 2 && in[0].shape(0) == in[1].shape(0), "row_ffn",
         "expected a [R, A] and x [R, H]");
  const int A = in[0].shape(1), H = in[1].shape(1);
  expect(in[2].ndim() == 2 && in[2].shape(0) == H && in[2].shape(1) == A, "row_ffn", "wo must be [H, A]");
  expect(in[5].ndim() == 2 && in[5].shape(1) == H && in[6].shape() == in[5].shape(), "row_ffn",
         "gate and up weights must be [F, H]");
  const int F = in[5].shape(0);
  expect(in[7].ndim() == 2 && in[7].shape(0) == H && in[7].shape(1) == F, "row_ffn", "the down weight must be [H, F]");
  for (int i : {3, 4, 8}) expect(in[i].size() == static_cast<size_t>(H), "row_ffn", "norm weights must be [H]");
  expect(in[9].size() == 1, "row_ffn", "the layer scalar must hold one value");
  const int R = in[1].shape(0);
  auto prim = std::make_shared<RowFfn>(s, eps);
  return std::make_unique<Array>(mx::array({R, H}, mx::float32, prim, std::move(in)));
}

}  // namespace mlxr
