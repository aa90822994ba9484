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

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/fast.h"
#include "mlx/primitives.h"
#include "mlx/transforms.h"
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
// weak handles to the inputs for the dispatched closure (read through RowMajor: any strides).
std::vector<mx::array> hold_all(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs,
                                mx::Stream stream, const char* kernel) {
  auto held = hold_row_inputs(inputs, outputs[0], stream, kernel, 0);
  auto& enc = mx::cpu::get_command_encoder(stream);
  for (size_t i = 1; i < outputs.size(); ++i) {
    outputs[i].set_data(mx::allocator::malloc(outputs[i].nbytes()));
    enc.set_output_array(outputs[i]);
  }
  return held;
}

// Rotates each head of rows [R, heads·D] in place: row r (position positions[r % L]) turns pair
// (i, i + D/2) by positions · inv[i] (MLX's non-traditional RoPE over all D features).
void rope_rows(float* x, int R, int L, int heads, int D, const int32_t* positions, const float* inv) {
  const int half = D / 2;
  std::vector<float> c(half), s(half);
  for (int r = 0; r < R; ++r) {
    const float p = static_cast<float>(positions[r % L]);
    for (int i = 0; i < half; ++i) {
      const float theta = p * inv[i];
      c[i] = std::cos(theta);
      s[i] = std::sin(theta);
    }
    for (int h = 0; h < heads; ++h) {
      float* v = x + (static_cast<size_t>(r) * heads + h) * D;
      for (int i = 0; i < half; ++i) {
        const float a = v[i], b = v[i + half];
        v[i] = a * c[i] - b * s[i];
        v[i + half] = a * s[i] + b * c[i];
      }
    }
  }
}

// rows [B·L, heads·D] -> out [B, heads, L, D] (the attention's and the cache's layout).
void to_heads(const float* rows, float* out, int B, int L, int heads, int D) {
  for (int b = 0; b < B; ++b) {
    for (int l = 0; l < L; ++l) {
      const float* src = rows + (static_cast<size_t>(b) * L + l) * heads * D;
      for (int h = 0; h < heads; ++h) {
        std::copy(src + static_cast<size_t>(h) * D, src + static_cast<size_t>(h + 1) * D,
                  out + ((static_cast<size_t>(b) * heads + h) * L + l) * D);
      }
    }
  }
}

// Per weight matrix of a node, in order: (bits, group), bits 0 for a dense matrix. A packed
// matrix's scales and biases follow the node's fixed inputs, in matrix order.
using Packing = std::vector<std::pair<int, int>>;
constexpr size_t kQkvInputs = 9;
constexpr size_t kFfnInputs = 10;
constexpr size_t kFfnPleInputs = 14;
constexpr size_t kPreNormFfnInputs = 7;

// The node's weight matrices (inputs at `slots`) as the kernels read them.
std::vector<RowMatrix> matrices(const std::vector<mx::array>& held, size_t fixed, const std::vector<size_t>& slots,
                                const Packing& packing) {
  std::vector<RowMatrix> out;
  size_t extra = fixed, i = 0;
  for (size_t slot : slots) {
    const auto [bits, group] = packing[i++];
    RowMatrix m{held[slot], std::nullopt, std::nullopt, group, bits};
    if (bits > 0) {
      m.scales = held[extra];
      m.biases = held[extra + 1];
      extra += 2;
    }
    out.push_back(std::move(m));
  }
  return out;
}

// What a node laying out per-head projections is configured by (RowQkv, RowNormedHeads).
class HeadsNode : public CpuOnlyMulti {
 public:
  HeadsNode(mx::Stream s, int head_dim, int batch, float eps, Packing packing)
      : CpuOnlyMulti(s), d_(head_dim), b_(batch), eps_(eps), packing_(std::move(packing)) {}

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const HeadsNode*>(&other);
    return o && d_ == o->d_ && b_ == o->b_ && eps_ == o->eps_ && packing_ == o->packing_;
  }

 protected:
  int d_;
  int b_;
  float eps_;
  Packing packing_;
};

// What a layer-tail node is configured by (RowFfn, RowPreNormFfn).
class TailNode : public CpuOnlyUnary {
 public:
  TailNode(mx::Stream s, float eps, Packing packing) : CpuOnlyUnary(s), eps_(eps), packing_(std::move(packing)) {}

  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const TailNode*>(&other);
    return o && eps_ == o->eps_ && packing_ == o->packing_;
  }

 protected:
  float eps_;
  Packing packing_;
};

// inputs: x [R = B·L, H], input norm [H], wq [Hq·D, H], q norm [D], wk [Hkv·D, H], k norm [D],
// wv [Hkv·D, H], positions [L] int32, RoPE inverse frequencies [D/2]. outputs: q [B, Hq, L, D]
// and k [B, Hkv, L, D] (each head normed with its weight, then roped), v [B, Hkv, L, D] (each
// head normed without weight). The cache stays outside.
class RowQkv : public HeadsNode {
 public:
  using HeadsNode::HeadsNode;

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto held = hold_all(inputs, outputs, stream(), "RowQkv");
    std::vector<float*> outs;
    for (auto& o : outputs) outs.push_back(o.data<float>());
    auto w = matrices(held, kQkvInputs, {2, 4, 6}, packing_);
    mx::cpu::get_command_encoder(stream()).dispatch([held = std::move(held), w = std::move(w), outs, d = d_, B = b_,
                                                     eps = eps_]() {
      const int R = held[0].shape(0), H = held[0].shape(1), L = R / B;
      const int nq = held[2].shape(0), nk = held[4].shape(0);
      const int32_t* positions = held[7].data<int32_t>();  // contiguous: checked when built
      RowMajor in;
      const float* inv = in(held[8]);
      std::vector<float> xn(static_cast<size_t>(R) * H), rows(static_cast<size_t>(R) * nq);
      rms_rows(in(held[0]), in(held[1]), xn.data(), R, H, eps);
      // q: project, norm each head, rotate, lay out by head.
      row_matrix_apply(xn.data(), w[0], rows.data(), R, H, nq);
      rms_rows(rows.data(), in(held[3]), rows.data(), R * (nq / d), d, eps);
      rope_rows(rows.data(), R, L, nq / d, d, positions, inv);
      to_heads(rows.data(), outs[0], B, L, nq / d, d);
      // k: the same with its own norm; v: normed without weight, not rotated.
      row_matrix_apply(xn.data(), w[1], rows.data(), R, H, nk);
      rms_rows(rows.data(), in(held[5]), rows.data(), R * (nk / d), d, eps);
      rope_rows(rows.data(), R, L, nk / d, d, positions, inv);
      to_heads(rows.data(), outs[1], B, L, nk / d, d);
      row_matrix_apply(xn.data(), w[2], rows.data(), R, H, nk);
      rms_rows(rows.data(), nullptr, rows.data(), R * (nk / d), d, eps);
      to_heads(rows.data(), outs[2], B, L, nk / d, d);
    });
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    const int L = inputs[0].shape(0) / b_;
    return {{b_, inputs[2].shape(0) / d_, L, d_}, {b_, inputs[4].shape(0) / d_, L, d_},
            {b_, inputs[6].shape(0) / d_, L, d_}};
  }

  DEFINE_NAME(RowQkv)
};

// inputs: attention output a [R, Hq·D], residual x [R, H], wo [H, Hq·D], post-attention norm
// [H], pre-feedforward norm [H], w_gate [F, H], w_up [F, H], w_down [H, F], post-feedforward
// norm [H], layer scalar [1]; with a per-layer input (Gemma-4's PLE), also that input
// pli [R, P], its gate w_pg [P, H], projection w_pp [H, P] and post norm [H]. output [R, H]:
//   h = x + norm(a·woᵀ)·post_attn;  t = norm(h)·pre_ff;
//   h = h + norm((gelu(t·w_gateᵀ) ∗ t·w_upᵀ)·w_downᵀ)·post_ff;
//   with PLE: h = h + norm((gelu(h·w_pgᵀ) ∗ pli)·w_ppᵀ)·post_ple;  out = h · scalar.
class RowFfn : public TailNode {
 public:
  RowFfn(mx::Stream s, float eps, Packing packing, bool ple) : TailNode(s, eps, std::move(packing)), ple_(ple) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    auto held = hold_row_inputs(inputs, out, stream(), "RowFfn", 0);
    auto w = ple_ ? matrices(held, kFfnPleInputs, {2, 5, 6, 7, 11, 12}, packing_)
                  : matrices(held, kFfnInputs, {2, 5, 6, 7}, packing_);
    mx::cpu::get_command_encoder(stream()).dispatch([held = std::move(held), w = std::move(w), y = out.data<float>(),
                                                     eps = eps_, ple = ple_]() {
      const int R = held[0].shape(0), A = held[0].shape(1), H = held[1].shape(1), F = held[5].shape(0);
      const size_t rh = static_cast<size_t>(R) * H, rf = static_cast<size_t>(R) * F;
      std::vector<float> h(rh), t(rh), g(rf), u(rf);
      RowMajor in;
      row_matrix_apply(in(held[0]), w[0], t.data(), R, A, H);
      rms_rows(t.data(), in(held[3]), t.data(), R, H, eps);
      const float* x = in(held[1]);
      for (size_t i = 0; i < rh; ++i) h[i] = x[i] + t[i];
      rms_rows(h.data(), in(held[4]), t.data(), R, H, eps);
      row_matrix_apply(t.data(), w[1], g.data(), R, H, F);
      row_matrix_apply(t.data(), w[2], u.data(), R, H, F);
      gelu_kernel(g.data(), g.data(), rf);
      for (size_t i = 0; i < rf; ++i) g[i] *= u[i];
      row_matrix_apply(g.data(), w[3], t.data(), R, F, H);
      rms_rows(t.data(), in(held[8]), t.data(), R, H, eps);
      for (size_t i = 0; i < rh; ++i) h[i] += t[i];
      if (ple) {
        const int P = held[10].shape(1);
        const size_t rp = static_cast<size_t>(R) * P;
        std::vector<float> p(rp);
        row_matrix_apply(h.data(), w[4], p.data(), R, H, P);
        gelu_kernel(p.data(), p.data(), rp);
        const float* pli = in(held[10]);
        for (size_t i = 0; i < rp; ++i) p[i] *= pli[i];
        row_matrix_apply(p.data(), w[5], t.data(), R, P, H);
        rms_rows(t.data(), in(held[13]), t.data(), R, H, eps);
        for (size_t i = 0; i < rh; ++i) h[i] += t[i];
      }
      const float scalar = in(held[9])[0];
      for (size_t i = 0; i < rh; ++i) y[i] = h[i] * scalar;
    });
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {{inputs[1].shape(0), inputs[1].shape(1)}};
  }

  DEFINE_NAME(RowFfn)
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto* o = dynamic_cast<const RowFfn*>(&other);
    return o && TailNode::is_equivalent(other) && ple_ == o->ple_;
  }

 private:
  bool ple_;
};

// A pre-norm layer's attention input (DSpark's backbone and its context projection): no
// per-head norms, no rotation. inputs: x [R = B·L, H], norm [H], then one matrix w_i
// [heads_i·D, H] per output (packed ones' scales and biases after them). outputs: per matrix,
// (rms_norm(x)·norm)·w_iᵀ laid out by head, [B, heads_i, L, D].
class RowNormedHeads : public HeadsNode {
 public:
  using HeadsNode::HeadsNode;

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto held = hold_all(inputs, outputs, stream(), "RowNormedHeads");
    std::vector<float*> outs;
    for (auto& o : outputs) outs.push_back(o.data<float>());
    auto w = matrices(held, 2 + packing_.size(), slots(packing_.size()), packing_);
    mx::cpu::get_command_encoder(stream()).dispatch([held = std::move(held), w = std::move(w), outs, d = d_, B = b_,
                                                     eps = eps_]() {
      const int R = held[0].shape(0), H = held[0].shape(1), L = R / B;
      RowMajor in;
      std::vector<float> xn(static_cast<size_t>(R) * H), rows;
      rms_rows(in(held[0]), in(held[1]), xn.data(), R, H, eps);
      for (size_t i = 0; i < w.size(); ++i) {
        const int n = w[i].w.shape(0);
        rows.resize(static_cast<size_t>(R) * n);
        row_matrix_apply(xn.data(), w[i], rows.data(), R, H, n);
        to_heads(rows.data(), outs[i], B, L, n / d, d);
      }
    });
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    const int L = inputs[0].shape(0) / b_;
    std::vector<mx::Shape> out;
    for (size_t i = 0; i < packing_.size(); ++i) out.push_back({b_, inputs[2 + i].shape(0) / d_, L, d_});
    return out;
  }

  // The input slots of the matrices: 2, 3, ...
  static std::vector<size_t> slots(size_t n) {
    std::vector<size_t> out;
    for (size_t i = 0; i < n; ++i) out.push_back(2 + i);
    return out;
  }

  DEFINE_NAME(RowNormedHeads)
};

// A pre-norm layer after attention (DSpark's backbone). inputs: a [R, A], x [R, H], wo [H, A],
// feed-forward norm [H], w_gate [F, H], w_up [F, H], w_down [H, F]. output [R, H]:
//   h = x + a·woᵀ;  out = h + (gelu(t·w_gateᵀ) ∗ t·w_upᵀ)·w_downᵀ with t = rms_norm(h)·ff_norm.
class RowPreNormFfn : public TailNode {
 public:
  using TailNode::TailNode;

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    auto held = hold_row_inputs(inputs, out, stream(), "RowPreNormFfn", 0);
    auto w = matrices(held, kPreNormFfnInputs, {2, 4, 5, 6}, packing_);
    mx::cpu::get_command_encoder(stream()).dispatch([held = std::move(held), w = std::move(w), y = out.data<float>(),
                                                     eps = eps_]() {
      const int R = held[0].shape(0), A = held[0].shape(1), H = held[1].shape(1), F = held[4].shape(0);
      const size_t rh = static_cast<size_t>(R) * H, rf = static_cast<size_t>(R) * F;
      std::vector<float> h(rh), t(rh), g(rf), u(rf);
      RowMajor in;
      row_matrix_apply(in(held[0]), w[0], t.data(), R, A, H);
      const float* x = in(held[1]);
      for (size_t i = 0; i < rh; ++i) h[i] = x[i] + t[i];
      rms_rows(h.data(), in(held[3]), t.data(), R, H, eps);
      row_matrix_apply(t.data(), w[1], g.data(), R, H, F);
      row_matrix_apply(t.data(), w[2], u.data(), R, H, F);
      gelu_kernel(g.data(), g.data(), rf);
      for (size_t i = 0; i < rf; ++i) g[i] *= u[i];
      row_matrix_apply(g.data(), w[3], t.data(), R, F, H);
      for (size_t i = 0; i < rh; ++i) y[i] = h[i] + t[i];
    });
  }

  std::vector<mx::Shape> output_shapes(const std::vector<mx::array>& inputs) override {
    return {{inputs[1].shape(0), inputs[1].shape(1)}};
  }

  DEFINE_NAME(RowPreNormFfn)
};

// rms_norm(x)·w over the last axis of f32 x (w optional) in one node: MLX's fast::rms_norm has
// no CPU kernel and runs as five composed nodes. Each row reduced in a fixed order (rms_rows).
class RowRmsNorm : public CpuOnlyUnary {
 public:
  RowRmsNorm(mx::Stream s, float eps) : CpuOnlyUnary(s), eps_(eps) {}

  void eval_cpu(const std::vector<mx::array>& inputs, mx::array& out) override {
    auto held = hold_row_inputs(inputs, out, stream(), "RowRmsNorm", 0);
    mx::cpu::get_command_encoder(stream()).dispatch([held = std::move(held), y = out.data<float>(), eps = eps_]() {
      RowMajor in;
      const int n = held[0].shape(-1);
      const int rows = n > 0 ? static_cast<int>(held[0].size() / n) : 0;
      rms_rows(in(held[0]), held.size() > 1 ? in(held[1]) : nullptr, y, rows, n, eps);
    });
  }

  // Through MLX's own rms_norm (training never needs this node's form).
  std::vector<mx::array> vjp(const std::vector<mx::array>& primals, const std::vector<mx::array>& cotangents,
                             const std::vector<int>& argnums, const std::vector<mx::array>&) override {
    auto s = stream();
    const float eps = eps_;
    auto composed = [s, eps](const std::vector<mx::array>& in) {
      std::optional<mx::array> w;
      if (in.size() > 1) w = in[1];
      return std::vector<mx::array>{mx::fast::rms_norm(in[0], w, eps, s)};
    };
    auto grads = mx::vjp(composed, primals, cotangents).second;
    std::vector<mx::array> out;
    for (int a : argnums) out.push_back(grads[a]);
    return out;
  }

  DEFINE_NAME(RowRmsNorm)
  bool is_equivalent(const mx::Primitive& other) const override {
    return eps_ == static_cast<const RowRmsNorm&>(other).eps_;
  }

 private:
  float eps_;
};

// Inputs as the kernels take them: f32, bf16 allowed for the weight `matrices`, uint32 for a
// packed one (whose f32 scales and biases follow the `fixed` inputs), int32 at `int_input`.
std::vector<mx::array> prepared(const ArrayList& l, size_t fixed, const char* kernel, mx::Stream s,
                                size_t int_input = SIZE_MAX, const std::vector<size_t>& matrices = {},
                                const Packing& packing = {}) {
  size_t packed = 0;
  for (const auto& [bits, group] : packing) {
    if (bits != 0) check_packing(bits, group, kernel);
    packed += bits != 0;
  }
  if (packing.size() != matrices.size()) {
    throw std::invalid_argument(std::string(kernel) + ": one packing entry per weight matrix expected");
  }
  const size_t expected = fixed + 2 * packed;
  if (l.items.size() != expected) {
    throw std::invalid_argument(std::string(kernel) + ": expected " + std::to_string(expected) + " inputs, got " +
                                std::to_string(l.items.size()));
  }
  std::vector<mx::array> out;
  for (size_t i = 0; i < l.items.size(); ++i) {
    const auto& a = l.items[i];
    const auto at = std::find(matrices.begin(), matrices.end(), i);
    const bool matrix = at != matrices.end();
    const bool is_packed = matrix && packing[at - matrices.begin()].first != 0;
    const bool ok = i == int_input ? a.dtype() == mx::int32
                    : is_packed    ? a.dtype() == mx::uint32
                                   : a.dtype() == mx::float32 || (matrix && a.dtype() == mx::bfloat16);
    if (!ok) {
      throw std::invalid_argument(std::string(kernel) + ": input " + std::to_string(i) + " is not " +
                                  (i == int_input ? "int32" : is_packed ? "uint32 (packed)" : matrix ? "float32 or bfloat16" : "float32"));
    }
    // Activations stay as they are (RowMajor reads any strides); weight matrices, their scales
    // and biases and positions are read in place, so they must be row-contiguous (evaluated
    // weights are: no copy).
    out.push_back(i == int_input || matrix || i >= fixed ? row_contiguous(a, s) : a);
  }
  return out;
}

Packing packing_of(rust::Slice<const int32_t> flat, const char* kernel) {
  if (flat.size() % 2 != 0) throw std::invalid_argument(std::string(kernel) + ": packing comes as (bits, group) pairs");
  Packing p;
  for (size_t i = 0; i + 1 < flat.size(); i += 2) p.emplace_back(flat[i], flat[i + 1]);
  return p;
}

void expect(bool ok, const char* kernel, const char* what) {
  if (!ok) throw std::invalid_argument(std::string(kernel) + ": " + what);
}

}  // namespace

std::unique_ptr<ArrayList> row_qkv(const ArrayList& inputs, rust::Slice<const int32_t> packing_flat, int32_t head_dim,
                                   int32_t batch, float eps) {
  auto s = mx::default_stream(mx::Device(mx::Device::cpu));
  auto packing = packing_of(packing_flat, "row_qkv");
  if (packing.empty()) packing.assign(3, {0, 0});
  auto in = prepared(inputs, kQkvInputs, "row_qkv", s, 7, {2, 4, 6}, packing);
  const int H = in[0].ndim() == 2 ? in[0].shape(1) : -1;
  expect(H > 0 && head_dim > 0 && head_dim % 2 == 0, "row_qkv", "expected x [R, H] and an even head_dim");
  expect(batch > 0 && in[0].shape(0) % batch == 0, "row_qkv", "x's rows must be batch · L");
  for (const auto& m : matrices(in, kQkvInputs, {2, 4, 6}, packing)) {
    expect(row_matrix_cols(m, "row_qkv") == H && m.w.shape(0) % head_dim == 0, "row_qkv",
           "projection weights must be [heads·head_dim, H]");
  }
  expect(in[4].shape(0) == in[6].shape(0), "row_qkv", "k and v projections must have the same shape");
  for (int i : {3, 5}) expect(in[i].size() == static_cast<size_t>(head_dim), "row_qkv", "q/k norms must be [head_dim]");
  expect(in[1].size() == static_cast<size_t>(H), "row_qkv", "the input norm must be [H]");
  expect(in[7].size() == static_cast<size_t>(in[0].shape(0) / batch), "row_qkv", "positions must be [L]");
  expect(in[8].size() == static_cast<size_t>(head_dim / 2), "row_qkv", "inverse frequencies must be [head_dim / 2]");
  auto prim = std::make_shared<RowQkv>(s, head_dim, batch, eps, std::move(packing));
  auto shapes = prim->output_shapes(in);
  auto outs = mx::array::make_arrays(shapes, {mx::float32, mx::float32, mx::float32}, prim, in);
  auto l = std::make_unique<ArrayList>();
  l->items = std::move(outs);
  return l;
}

ArrayPtr row_rms_norm(const ArrayList& inputs, float eps) {
  auto s = mx::default_stream(mx::Device(mx::Device::cpu));
  expect(!inputs.items.empty() && inputs.items.size() <= 2, "row_rms_norm", "expected x and at most one weight");
  auto in = prepared(inputs, inputs.items.size(), "row_rms_norm", s);
  expect(in[0].ndim() >= 1, "row_rms_norm", "x must have a last axis");
  if (in.size() == 2) {
    expect(in[1].size() == static_cast<size_t>(in[0].shape(-1)), "row_rms_norm", "the weight must match x's last axis");
  }
  const auto shape = in[0].shape();
  auto prim = std::make_shared<RowRmsNorm>(s, eps);
  return std::make_unique<Array>(mx::array(shape, mx::float32, prim, std::move(in)));
}

ArrayPtr row_ffn(const ArrayList& inputs, rust::Slice<const int32_t> packing_flat, bool ple, float eps) {
  auto s = mx::default_stream(mx::Device(mx::Device::cpu));
  auto packing = packing_of(packing_flat, "row_ffn");
  const size_t fixed = ple ? kFfnPleInputs : kFfnInputs;
  const std::vector<size_t> slots = ple ? std::vector<size_t>{2, 5, 6, 7, 11, 12} : std::vector<size_t>{2, 5, 6, 7};
  if (packing.empty()) packing.assign(slots.size(), {0, 0});
  auto in = prepared(inputs, fixed, "row_ffn", s, SIZE_MAX, slots, packing);
  expect(in[0].ndim() == 2 && in[1].ndim() == 2 && in[0].shape(0) == in[1].shape(0), "row_ffn",
         "expected a [R, A] and x [R, H]");
  const int A = in[0].shape(1), H = in[1].shape(1);
  // Columns of each weight matrix, in `slots` order: wo, w_gate, w_up, w_down (, PLE gate, projection).
  std::vector<int> cols;
  for (const auto& m : matrices(in, fixed, slots, packing)) cols.push_back(row_matrix_cols(m, "row_ffn"));
  expect(in[2].shape(0) == H && cols[0] == A, "row_ffn", "wo must be [H, A]");
  expect(cols[1] == H && cols[2] == H && in[5].shape(0) == in[6].shape(0), "row_ffn", "gate and up weights must be [F, H]");
  const int F = in[5].shape(0);
  expect(in[7].shape(0) == H && cols[3] == F, "row_ffn", "the down weight must be [H, F]");
  for (int i : {3, 4, 8}) expect(in[i].size() == static_cast<size_t>(H), "row_ffn", "norm weights must be [H]");
  expect(in[9].size() == 1, "row_ffn", "the layer scalar must hold one value");
  const int R = in[1].shape(0);
  if (ple) {
    expect(in[10].ndim() == 2 && in[10].shape(0) == R, "row_ffn", "the per-layer input must be [R, P]");
    const int P = in[10].shape(1);
    expect(in[11].shape(0) == P && cols[4] == H, "row_ffn", "the per-layer input gate must be [P, H]");
    expect(in[12].shape(0) == H && cols[5] == P, "row_ffn", "the per-layer projection must be [H, P]");
    expect(in[13].size() == static_cast<size_t>(H), "row_ffn", "the per-layer post norm must be [H]");
  }
  auto prim = std::make_shared<RowFfn>(s, eps, std::move(packing), ple);
  return std::make_unique<Array>(mx::array({R, H}, mx::float32, prim, std::move(in)));
}

std::unique_ptr<ArrayList> row_normed_heads(const ArrayList& inputs, rust::Slice<const int32_t> packing_flat,
                                            int32_t head_dim, int32_t batch, float eps) {
  auto s = mx::default_stream(mx::Device(mx::Device::cpu));
  auto packing = packing_of(packing_flat, "row_normed_heads");
  expect(!packing.empty(), "row_normed_heads", "expected at least one projection (one packing entry each)");
  const size_t fixed = 2 + packing.size();
  const auto slots = RowNormedHeads::slots(packing.size());
  auto in = prepared(inputs, fixed, "row_normed_heads", s, SIZE_MAX, slots, packing);
  const int H = in[0].ndim() == 2 ? in[0].shape(1) : -1;
  expect(H > 0 && head_dim > 0, "row_normed_heads", "expected x [R, H] and a positive head_dim");
  expect(batch > 0 && in[0].shape(0) % batch == 0, "row_normed_heads", "x's rows must be batch · L");
  expect(in[1].size() == static_cast<size_t>(H), "row_normed_heads", "the norm must be [H]");
  for (const auto& m : matrices(in, fixed, slots, packing)) {
    expect(row_matrix_cols(m, "row_normed_heads") == H && m.w.shape(0) % head_dim == 0, "row_normed_heads",
           "projection weights must be [heads·head_dim, H]");
  }
  auto prim = std::make_shared<RowNormedHeads>(s, head_dim, batch, eps, std::move(packing));
  auto shapes = prim->output_shapes(in);
  auto outs = mx::array::make_arrays(shapes, std::vector<mx::Dtype>(shapes.size(), mx::float32), prim, in);
  auto l = std::make_unique<ArrayList>();
  l->items = std::move(outs);
  return l;
}

ArrayPtr row_prenorm_ffn(const ArrayList& inputs, rust::Slice<const int32_t> packing_flat, float eps) {
  auto s = mx::default_stream(mx::Device(mx::Device::cpu));
  auto packing = packing_of(packing_flat, "row_prenorm_ffn");
  const std::vector<size_t> slots{2, 4, 5, 6};
  if (packing.empty()) packing.assign(slots.size(), {0, 0});
  auto in = prepared(inputs, kPreNormFfnInputs, "row_prenorm_ffn", s, SIZE_MAX, slots, packing);
  expect(in[0].ndim() == 2 && in[1].ndim() == 2 && in[0].shape(0) == in[1].shape(0), "row_prenorm_ffn",
         "expected a [R, A] and x [R, H]");
  const int A = in[0].shape(1), H = in[1].shape(1);
  std::vector<int> cols;
  for (const auto& m : matrices(in, kPreNormFfnInputs, slots, packing)) cols.push_back(row_matrix_cols(m, "row_prenorm_ffn"));
  expect(in[2].shape(0) == H && cols[0] == A, "row_prenorm_ffn", "wo must be [H, A]");
  expect(cols[1] == H && cols[2] == H && in[4].shape(0) == in[5].shape(0), "row_prenorm_ffn",
         "gate and up weights must be [F, H]");
  expect(in[6].shape(0) == H && cols[3] == in[4].shape(0), "row_prenorm_ffn", "the down weight must be [H, F]");
  expect(in[3].size() == static_cast<size_t>(H), "row_prenorm_ffn", "the feed-forward norm must be [H]");
  const int R = in[1].shape(0);
  auto prim = std::make_shared<RowPreNormFfn>(s, eps, std::move(packing));
  return std::make_unique<Array>(mx::array({R, H}, mx::float32, prim, std::move(in)));
}

}  // namespace mlxr
