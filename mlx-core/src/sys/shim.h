// C++ side of the mlx-core bridge. Every function may throw; the bridge declares all of them
// `-> Result`, so cxx turns exceptions into Rust errors instead of aborting.
#pragma once

#include <memory>
#include <vector>

#include "mlx/mlx.h"
#include "rust/cxx.h"

namespace mlxr {

// An owned handle to an MLX array (MLX arrays are themselves refcounted handles).
struct Array {
  mlx::core::array inner;
  explicit Array(mlx::core::array a) : inner(std::move(a)) {}
};

// A list of arrays, used for variadic arguments (concatenate, eval) and multi-output ops.
struct ArrayList {
  std::vector<mlx::core::array> items;
};

using ArrayPtr = std::unique_ptr<Array>;

// A Rust closure being differentiated (opaque; defined by the Rust side of the bridge).
struct GradCtx;

// The bridge's shared enums (defined in the generated mod.rs.h, with these underlying types).
enum class DtypeCode : std::int32_t;
enum class UnaryOp : std::int32_t;
enum class BinaryOp : std::int32_t;
enum class ReduceOp : std::int32_t;
enum class DeviceKind : std::int32_t;

// ---- handles and metadata ----
ArrayPtr clone_array(const Array& a);
rust::Vec<int32_t> shape(const Array& a);
DtypeCode dtype(const Array& a);
size_t nbytes(const Array& a);
// Whether `a` is evaluated and nothing but this handle holds it or its buffer.
bool sole_holder(const Array& a);
// The address of an evaluated array's data (0 before evaluation).
size_t buffer_address(const Array& a);
rust::String mlx_version();
rust::String blas_core();

// ---- construction and readback ----
ArrayPtr from_bytes(rust::Slice<const uint8_t> data, rust::Slice<const int32_t> shape, DtypeCode dtype);
ArrayPtr scalar_f64(double v, DtypeCode dtype);
ArrayPtr full(rust::Slice<const int32_t> shape, double v, DtypeCode dtype);
ArrayPtr arange(double start, double stop, double step, DtypeCode dtype);
rust::Vec<uint8_t> to_bytes(const Array& a);
void eval(const ArrayList& l);
void async_eval(const ArrayList& l);
void synchronize();
// The primitive names of the unevaluated graph nodes behind these arrays, one per node.
rust::Vec<rust::String> pending_nodes(const ArrayList& l);

// ---- lists ----
std::unique_ptr<ArrayList> new_list();
void list_push(ArrayList& l, const Array& a);
size_t list_len(const ArrayList& l);
ArrayPtr list_get(const ArrayList& l, size_t i);

// ---- elementwise ----
ArrayPtr unary(UnaryOp op, const Array& a);
ArrayPtr binary(BinaryOp op, const Array& a, const Array& b);
ArrayPtr where_(const Array& cond, const Array& a, const Array& b);
ArrayPtr astype(const Array& a, DtypeCode dtype);
ArrayPtr view(const Array& a, DtypeCode dtype);

// ---- shapes ----
ArrayPtr reshape(const Array& a, rust::Slice<const int32_t> shape);
ArrayPtr transpose(const Array& a, rust::Slice<const int32_t> axes);
ArrayPtr expand_dims(const Array& a, int32_t axis);
ArrayPtr squeeze(const Array& a, int32_t axis);
ArrayPtr broadcast_to(const Array& a, rust::Slice<const int32_t> shape);
ArrayPtr slice(const Array& a, rust::Slice<const int32_t> start, rust::Slice<const int32_t> stop,
               rust::Slice<const int32_t> strides);
ArrayPtr slice_update(const Array& src, const Array& update, rust::Slice<const int32_t> start,
                      rust::Slice<const int32_t> stop, rust::Slice<const int32_t> strides);
ArrayPtr concatenate(const ArrayList& l, int32_t axis);
ArrayPtr contiguous(const Array& a);

// ---- indexing / ordering ----
ArrayPtr take(const Array& a, const Array& indices, int32_t axis);
ArrayPtr take_along_axis(const Array& a, const Array& indices, int32_t axis);
ArrayPtr put_along_axis(const Array& a, const Array& indices, const Array& values, int32_t axis);
ArrayPtr argpartition(const Array& a, int32_t kth, int32_t axis);
ArrayPtr sort(const Array& a, int32_t axis);
ArrayPtr argsort(const Array& a, int32_t axis);

// ---- reductions ----
// op: 0 sum, 1 max, 2 min, 3 mean, 4 logsumexp, 5 prod
ArrayPtr reduce(ReduceOp op, const Array& a, rust::Slice<const int32_t> axes, bool keepdims);
ArrayPtr argmax(const Array& a, int32_t axis, bool keepdims);
ArrayPtr argmin(const Array& a, int32_t axis, bool keepdims);
ArrayPtr softmax(const Array& a, rust::Slice<const int32_t> axes, bool precise);
ArrayPtr cumsum(const Array& a, int32_t axis, bool reverse, bool inclusive);

// ---- linear algebra ----
ArrayPtr matmul(const Array& a, const Array& b);
// x [M, K] @ w [N, K]ᵀ in f32 with every row's bits independent of M (row_linear.cc).
ArrayPtr row_linear(const Array& x, const Array& w);
// gelu_approx of f32 x on the CPU in one vectorized pass, each element's bits a function of its
// value alone (row_gelu.cc).
ArrayPtr row_gelu(const Array& x);
// cap · tanh(x / cap) of f32 x on the CPU in one vectorized pass, elementwise (row_gelu.cc).
ArrayPtr row_softcap(const Array& x, float cap);
// log_softmax over the last axis of f32 x on the CPU, one vectorized pass per row, each row's
// bits its own (row_gelu.cc); whether its AVX2 and portable sums agree on a row of n.
ArrayPtr row_log_softmax(const Array& x);
bool row_log_softmax_paths_agree(int32_t n);
// The instruction set row_linear runs with here ("avx512", "avx2" or "generic").
rust::String row_linear_isa();
// Whether the AVX-512 and AVX2 forms give the same bits on random [M, K] x [N, K] (true when
// only one form runs here).
bool row_linear_paths_agree(int M, int K, int N);
// x [.., K] (f32) @ Wᵀ for an MLX-affine 8- or 4-bit W read packed (uint32 [N, K·bits/32], f32
// scales and biases [N, K / group]), with row_linear's row invariance (row_quantized.cc).
ArrayPtr row_quantized_linear(const Array& x, const Array& w, const Array& scales, const Array& biases, int32_t group,
                              int32_t bits);
// Whether the vector forms of row_quantized_linear give the portable form's bits on random input.
bool row_quantized_paths_agree(int32_t M, int32_t K, int32_t N, int32_t bits, int32_t group);
// Whether a K-column matrix of `bits` takes the 4-bit integer path (row_nibble_dot.cc).
bool row_quantized_int8_activations(int32_t K, int32_t bits);
// Single-query attention of each row of q [B, Hq, n, D] over its own keys and values, given as
// segments[i] pairs k, v [B, Hkv, L, D] taken in order (inputs: q, then row 0's pairs, row 1's,
// …), with every row's bits independent of n and of how its keys are cut (row_attention.cc).
ArrayPtr row_attention(const ArrayList& inputs, rust::Slice<const int32_t> segments, float scale);
// A stepwise forward's cache writes and row attention for several sessions in one node: each
// session's buffers rebuilt from a host plan of row copies, each row attending over key ranges
// of its session's buffer (row_attention.cc).
std::unique_ptr<ArrayList> row_cache_attention(const ArrayList& inputs, rust::Slice<const int32_t> plan, bool writes,
                                               float scale);
// A dense decoder layer's attention input side for few f32 rows, one node (row_layer.cc):
// inputs x [B·L, H], input norm, wq, q norm, wk, k norm, wv, positions [L] (int32), RoPE inverse
// frequencies; outputs q, k, v [B, heads, L, head_dim], each head RMS-normed (v without weight),
// q and k roped.
// `packing`: (bits, group) per projection (wq, wk, wv), bits 0 for dense; a packed (uint32)
// matrix's f32 scales and biases follow the nine inputs, in that order. Empty: all dense.
std::unique_ptr<ArrayList> row_qkv(const ArrayList& inputs, rust::Slice<const int32_t> packing, int32_t head_dim,
                                   int32_t batch, float eps);
// The rest of the layer after attention, one node (row_layer.cc): inputs a, x, wo, post-attention
// norm, pre-feedforward norm, w_gate, w_up, w_down, post-feedforward norm, layer scalar.
// `ple`: four more inputs, the per-layer input [R, P], its gate [P, H], projection [H, P] and
// post norm [H]. `packing` as row_qkv's, for wo, w_gate, w_up, w_down (and the PLE gate and
// projection), scales and biases after the fixed inputs.
ArrayPtr row_ffn(const ArrayList& inputs, rust::Slice<const int32_t> packing, bool ple, float eps);
// A pre-norm layer's attention input (DSpark's backbone), one node (row_layer.cc): inputs x
// [B·L, H], norm [H], then n ≥ 1 projections [heads·head_dim, H] (packed ones' scales and biases
// after them); outputs, per projection, rms_norm(x)·norm·wᵀ as [B, heads, L, head_dim].
// `packing`: (bits, group) per projection, n pairs.
std::unique_ptr<ArrayList> row_normed_heads(const ArrayList& inputs, rust::Slice<const int32_t> packing,
                                            int32_t head_dim, int32_t batch, float eps);
// A pre-norm layer after attention (DSpark's backbone), one node: inputs a, x, wo, feed-forward
// norm, w_gate, w_up, w_down; `packing` as row_ffn's for the four matrices.
ArrayPtr row_prenorm_ffn(const ArrayList& inputs, rust::Slice<const int32_t> packing, float eps);
// rms_norm over the last axis of f32 x, times the optional weight (inputs: x [, w]), one node.
ArrayPtr row_rms_norm(const ArrayList& inputs, float eps);
// The greedy Markov walk of R draft blocks in one node (row_markov.cc): u [T, V], w1 and w2
// [V, r], anchors [R] uint32, block lengths ns (Σ = T); outputs tokens [T] uint32, logits
// [T, V], e1 [T, r].
std::unique_ptr<ArrayList> row_markov_greedy(const Array& u, const Array& w1, const Array& w2, const Array& anchors,
                                             rust::Slice<const int32_t> ns);
// σ(Σ_j parts_j[r]·w_j + (log max softmax, entropy)(logits[r])·w_law + b) per row r, one node;
// `law_of` holds zero or one logits [R, V] (row_confidence.cc). All float32.
ArrayPtr row_confidence(const ArrayList& parts, const Array& w, const Array& b, const ArrayList& law_of);
// The filtered, tempered distribution of each row of f32 logits [R, V] (mlx-lm's order: top-p,
// min-p, top-k on the logprobs, then 1/T), one node (row_sample.cc). min_p 0 and top_k 0 are off.
ArrayPtr row_probs(const Array& logits, float inv_t, double top_p, double min_p, int32_t min_keep, int32_t top_k);
// One inverse-CDF draw per row of weights [R, V] with u [R]; with a q in `residual_of`, from the
// residual max(weights − q, 0), or from the weights where its mass is at most empty_mass.
ArrayPtr row_draw(const Array& weights, const Array& u, const ArrayList& residual_of, float empty_mass);

// ---- fast ----
// `weight` holds zero or one array: MLX's optional weight.
ArrayPtr rms_norm(const Array& x, const ArrayList& weight, float eps);
// `base` is used when `freqs` is empty.
ArrayPtr rope(const Array& x, int32_t dims, bool traditional, float base, float scale,
              const Array& offset, const ArrayList& freqs);
ArrayPtr sdpa(const Array& q, const Array& k, const Array& v, float scale, rust::Str mask_mode,
              const ArrayList& mask);

// ---- quantization ----
std::unique_ptr<ArrayList> quantize(const Array& w, int32_t group_size, int32_t bits, rust::Str mode);
ArrayPtr dequantize(const Array& w, const Array& scales, const ArrayList& biases, int32_t group_size,
                    int32_t bits, rust::Str mode);
ArrayPtr quantized_matmul(const Array& x, const Array& w, const Array& scales,
                          const ArrayList& biases, bool transpose, int32_t group_size,
                          int32_t bits, rust::Str mode);
ArrayPtr gather_qmm(const Array& x, const Array& w, const Array& scales, const ArrayList& biases,
                    const Array& rhs_indices, bool transpose, int32_t group_size, int32_t bits,
                    rust::Str mode, bool sorted_indices);
ArrayPtr gather_mm(const Array& a, const Array& b, const Array& rhs_indices, bool sorted_indices);

// ---- random ----
ArrayPtr random_key(uint64_t seed);
std::unique_ptr<ArrayList> random_split(const Array& key, int32_t num);
ArrayPtr random_uniform(const Array& low, const Array& high, rust::Slice<const int32_t> shape,
                        DtypeCode dtype, const Array& key);
ArrayPtr random_normal(rust::Slice<const int32_t> shape, DtypeCode dtype, float loc, float scale,
                       const Array& key);
ArrayPtr random_categorical(const Array& logits, int32_t axis, const Array& key);

// ---- io ----
std::unique_ptr<ArrayList> load_safetensors(rust::Str path, rust::Vec<rust::String>& names,
                                            rust::Vec<rust::String>& metadata);
void save_safetensors(rust::Str path, rust::Slice<const rust::String> names, const ArrayList& arrays,
                      rust::Slice<const rust::String> metadata);

// ---- device ----
void set_default_device(DeviceKind kind);
DeviceKind default_device();
bool device_available(DeviceKind kind);

// ---- streams (identified by index and device kind) ----
int32_t new_stream(DeviceKind kind);
int32_t default_stream(DeviceKind kind);
void set_default_stream(int32_t index, DeviceKind kind);
void synchronize_stream(int32_t index, DeviceKind kind);

// ---- autodiff ----
// Runs MLX's value_and_grad over the Rust closure in `ctx`: the closure's outputs (the first is
// the scalar loss), then the gradients of the loss with respect to inputs[argnums] in sorted
// argnum order.
std::unique_ptr<ArrayList> value_and_grad(GradCtx& ctx, const ArrayList& inputs, rust::Slice<const int32_t> argnums);
// MLX's vjp: the closure's outputs, then one vector-Jacobian product per primal.
std::unique_ptr<ArrayList> vjp(GradCtx& ctx, const ArrayList& primals, const ArrayList& cotangents);
ArrayPtr stop_gradient(const Array& a);

}  // namespace mlxr
