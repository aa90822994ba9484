// A DSpark drafter's greedy Markov walk over its block, for several requests, in one graph node
// (f32, CPU).
//
// The walk is sequential: position k's logits are the backbone's u_k plus W2·W1[x_{k−1}], and its
// token x_k = argmax feeds position k+1. Composed from MLX's ops that is about a dozen nodes a
// position (gather, product, add, argmax, casts, slices), ~70 per proposal of a γ = 6 block, each
// microseconds of host work. Here it is a loop. The arithmetic is the composed form's: the
// product is row_linear's kernel (row-invariant), the add is u + p in f32 and argmax takes the
// first maximum, so the tokens and logits are bit for bit those of the composed walk.
#include "mlx-core/src/sys/shim.h"

#include <cstdint>
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

// inputs: u [T, V] f32 (request after request, n_s rows each), w1 [V, r] f32, w2 [V, r] f32,
// anchors [R] uint32. outputs: tokens [T] uint32, logits [T, V] f32, e1 [T, r] f32.
class RowMarkovGreedy : public CpuOnlyMulti {
 public:
  RowMarkovGreedy(mx::Stream s, std::vector<int> ns) : CpuOnlyMulti(s), ns_(std::move(ns)) {}

  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    auto held = hold_row_inputs(inputs, outputs[0], stream(), "RowMarkovGreedy", 0);
    auto& enc = mx::cpu::get_command_encoder(stream());
    for (size_t i = 1; i < outputs.size(); ++i) {
      outputs[i].set_data(mx::allocator::malloc(outputs[i].nbytes()));
      enc.set_output_array(outputs[i]);
    }
    enc.dispatch([held = std::move(held), tokens = outputs[0].data<uint32_t>(), logits = outputs[1].data<float>(),
                  e1 = outputs[2].data<float>(), ns = ns_]() {
      RowMajor in;
      const float* u = in(held[0]);
      const float* w1 = in(held[1]);
      const uint32_t* anchors = held[3].data<uint32_t>();  // contiguous: built so
      const int V = held[0].shape(1), r = held[1].shape(1);
      std::vector<float> p(V);
      size_t row = 0;
      for (size_t s = 0; s < ns.size(); ++s) {
        uint32_t prev = anchors[s];
        for (int k = 0; k < ns[s]; ++k, ++row) {
          float* e = e1 + row * r;
          const float* src = w1 + static_cast<size_t>(prev) * r;
          std::copy(src, src + r, e);
          row_linear_array(e, held[2], p.data(), 1, r, V);
          float* l = logits + row * V;
          const float* ur = u + row * V;
          uint32_t best = 0;
          for (int v = 0; v < V; ++v) {
            l[v] = ur[v] + p[v];
            if (l[v] > l[best]) best = static_cast<uint32_t>(v);
          }
          tokens[row] = best;
          prev = best;
        }
      }
    });
  }

  DEFINE_NAME(RowMarkovGreedy)
  bool is_equivalent(const mx::Primitive& other) const override {
    return ns_ == static_cast<const RowMarkovGreedy&>(other).ns_;
  }

 private:
  std::vector<int> ns_;
};

}  // namespace

std::unique_ptr<ArrayList> row_markov_greedy(const Array& u, const Array& w1, const Array& w2, const Array& anchors,
                                             rust::Slice<const int32_t> ns) {
  auto s = mx::default_stream(mx::Device(mx::Device::cpu));
  const auto &ui = u.inner, &w1i = w1.inner, &w2i = w2.inner, &ai = anchors.inner;
  auto fail = [](const std::string& what) { throw std::invalid_argument("row_markov_greedy: " + what); };
  if (ui.dtype() != mx::float32 || w1i.dtype() != mx::float32) fail("u and w1 must be float32");
  if (w2i.dtype() != mx::float32 && w2i.dtype() != mx::bfloat16) fail("w2 must be float32 or bfloat16");
  if (ai.dtype() != mx::uint32) fail("anchors must be uint32");
  if (ui.ndim() != 2 || w1i.ndim() != 2 || w2i.ndim() != 2 || ai.ndim() != 1) {
    fail("expected u [T, V], w1 [V, r], w2 [V, r], anchors [R]");
  }
  const int V = ui.shape(1);
  if (w1i.shape(0) != V || w2i.shape(0) != V || w1i.shape(1) != w2i.shape(1)) fail("w1 and w2 must be [V, r]");
  if (static_cast<size_t>(ai.shape(0)) != ns.size()) fail("one block length per anchor");
  int64_t total = 0;
  for (int32_t n : ns) {
    if (n < 0) fail("block lengths must not be negative");
    total += n;
  }
  if (total != ui.shape(0)) fail("u must hold the blocks' rows");
  std::vector<int> lens(ns.begin(), ns.end());
  const int T = ui.shape(0), r = w1i.shape(1);
  auto outs = mx::array::make_arrays({{T}, {T, V}, {T, r}}, {mx::uint32, mx::float32, mx::float32},
                                     std::make_shared<RowMarkovGreedy>(s, std::move(lens)),
                                     {ui, row_contiguous(w1i, s), row_contiguous(w2i, s), row_contiguous(ai, s)});
  auto l = std::make_unique<ArrayList>();
  l->items = std::move(outs);
  return l;
}

}  // namespace mlxr
