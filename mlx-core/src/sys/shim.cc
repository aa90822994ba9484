// Implementation of the bridge declared in shim.h. Kept thin: argument conversion only, so
// every numerical decision stays with MLX itself.
#include "mlx-core/src/sys/shim.h"

#include <unordered_set>

#include "mlx/primitives.h"

#include <dlfcn.h>

#include <cstring>
#include <stdexcept>

#include "mlx-core/src/sys/mod.rs.h"

namespace mx = mlx::core;

#ifdef MLX_CORE_BLAS_ANCHOR
// The build script links an optimized BLAS ahead of libmlx so that MLX's undefined `cblas_*`
// resolve to it. Nothing else references that library, and rustc links with --as-needed and
// --gc-sections, which would drop it. A reference from a start-up constructor (.init_array is
// never collected) keeps it in the executable's DT_NEEDED list; the constructor does nothing.
extern "C" void cblas_sgemm();
__attribute__((constructor)) static void mlx_core_blas_anchor() {
  void (*volatile keep)() = &cblas_sgemm;
  (void)keep;
}
#endif

namespace mlxr {
namespace {

// The one place dtypes are translated, by name in both directions.
mx::Dtype to_dtype(DtypeCode code) {
  switch (code) {
    case DtypeCode::Bool: return mx::bool_;
    case DtypeCode::U8: return mx::uint8;
    case DtypeCode::U16: return mx::uint16;
    case DtypeCode::U32: return mx::uint32;
    case DtypeCode::U64: return mx::uint64;
    case DtypeCode::I8: return mx::int8;
    case DtypeCode::I16: return mx::int16;
    case DtypeCode::I32: return mx::int32;
    case DtypeCode::I64: return mx::int64;
    case DtypeCode::F16: return mx::float16;
    case DtypeCode::F32: return mx::float32;
    case DtypeCode::F64: return mx::float64;
    case DtypeCode::Bf16: return mx::bfloat16;
    case DtypeCode::C64: return mx::complex64;
  }
  throw std::invalid_argument("unknown dtype code " + std::to_string(static_cast<int32_t>(code)));
}

DtypeCode from_dtype(mx::Dtype d) {
  switch (d.val()) {
    case mx::Dtype::Val::bool_: return DtypeCode::Bool;
    case mx::Dtype::Val::uint8: return DtypeCode::U8;
    case mx::Dtype::Val::uint16: return DtypeCode::U16;
    case mx::Dtype::Val::uint32: return DtypeCode::U32;
    case mx::Dtype::Val::uint64: return DtypeCode::U64;
    case mx::Dtype::Val::int8: return DtypeCode::I8;
    case mx::Dtype::Val::int16: return DtypeCode::I16;
    case mx::Dtype::Val::int32: return DtypeCode::I32;
    case mx::Dtype::Val::int64: return DtypeCode::I64;
    case mx::Dtype::Val::float16: return DtypeCode::F16;
    case mx::Dtype::Val::float32: return DtypeCode::F32;
    case mx::Dtype::Val::float64: return DtypeCode::F64;
    case mx::Dtype::Val::bfloat16: return DtypeCode::Bf16;
    case mx::Dtype::Val::complex64: return DtypeCode::C64;
  }
  throw std::invalid_argument("an MLX dtype this binding does not know");
}

mx::Shape to_shape(rust::Slice<const int32_t> s) { return mx::Shape(s.begin(), s.end()); }
std::vector<int> to_ints(rust::Slice<const int32_t> s) { return std::vector<int>(s.begin(), s.end()); }

ArrayPtr wrap(mx::array a) { return std::make_unique<Array>(std::move(a)); }

std::optional<mx::array> opt(const ArrayList& l) {
  if (l.items.empty()) return std::nullopt;
  return l.items[0];
}

std::unique_ptr<ArrayList> wrap_list(std::vector<mx::array> v) {
  auto l = std::make_unique<ArrayList>();
  l->items = std::move(v);
  return l;
}

mx::Device to_device(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::Cpu: return mx::Device(mx::Device::cpu);
    case DeviceKind::Gpu: return mx::Device(mx::Device::gpu);
  }
  throw std::invalid_argument("unknown device kind " + std::to_string(static_cast<int32_t>(kind)));
}

}  // namespace

ArrayPtr clone_array(const Array& a) { return wrap(a.inner); }

rust::Vec<int32_t> shape(const Array& a) {
  rust::Vec<int32_t> out;
  for (auto d : a.inner.shape()) out.push_back(d);
  return out;
}

DtypeCode dtype(const Array& a) { return from_dtype(a.inner.dtype()); }
size_t nbytes(const Array& a) { return a.inner.nbytes(); }

bool sole_holder(const Array& a) { return a.inner.is_available() && a.inner.is_donatable(); }

size_t buffer_address(const Array& a) {
  if (!a.inner.is_available()) return 0;
  return reinterpret_cast<size_t>(a.inner.data<void>());
}

rust::String mlx_version() { return rust::String(mx::version()); }

rust::String blas_core() {
  // Looked up rather than linked: the BLAS may be BLIS, or none, and only OpenBLAS has it.
  using CoreName = char* (*)();
  auto f = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  const char* name = f != nullptr ? f() : nullptr;
  return rust::String(name != nullptr ? name : "");
}

ArrayPtr from_bytes(rust::Slice<const uint8_t> data, rust::Slice<const int32_t> shp, DtypeCode code) {
  auto dt = to_dtype(code);
  auto sh = to_shape(shp);
  size_t n = 1;
  for (auto d : sh) {
    if (d < 0) throw std::invalid_argument("negative dimension in shape");
    n *= static_cast<size_t>(d);
  }
  if (n * dt.size() != data.size()) {
    throw std::invalid_argument("byte length " + std::to_string(data.size()) + " does not match shape (" +
                                std::to_string(n) + " elements of " + std::to_string(dt.size()) + " bytes)");
  }
  // Build a uint8 buffer and reinterpret it: one copy, valid for every dtype including bf16.
  mx::array bytes(reinterpret_cast<const uint8_t*>(data.data()), mx::Shape{static_cast<int>(data.size())},
                  mx::uint8);
  if (data.size() == 0) return wrap(mx::zeros(sh, dt));
  auto typed = mx::view(bytes, dt);
  return wrap(mx::reshape(typed, sh));
}

ArrayPtr scalar_f64(double v, DtypeCode code) {
  // Like MLX's Python binding: the value is taken as a float and converted to the target dtype.
  auto dt = to_dtype(code);
  if (mx::issubdtype(dt, mx::integer) || dt == mx::bool_) {
    return wrap(mx::astype(mx::array(static_cast<int64_t>(v), mx::int64), dt));
  }
  return wrap(mx::array(static_cast<float>(v), dt));
}

ArrayPtr full(rust::Slice<const int32_t> shp, double v, DtypeCode code) {
  auto s = scalar_f64(v, code);
  return wrap(mx::full(to_shape(shp), s->inner, to_dtype(code)));
}

ArrayPtr arange(double start, double stop, double step, DtypeCode code) {
  return wrap(mx::arange(start, stop, step, to_dtype(code)));
}

rust::Vec<uint8_t> to_bytes(const Array& a) {
  auto c = mx::contiguous(a.inner, false);
  c.eval();
  rust::Vec<uint8_t> out;
  size_t n = c.nbytes();
  out.reserve(n);
  const uint8_t* p = c.data<uint8_t>();
  for (size_t i = 0; i < n; ++i) out.push_back(p[i]);
  return out;
}

void eval(const ArrayList& l) { mx::eval(l.items); }
void async_eval(const ArrayList& l) { mx::async_eval(l.items); }
void synchronize() { mx::synchronize(); }

rust::Vec<rust::String> pending_nodes(const ArrayList& l) {
  // Depth-first over the unevaluated arrays these depend on; siblings (outputs of one
  // multi-output node) count once, through their primitive.
  std::unordered_set<std::uintptr_t> seen;
  std::vector<mx::array> stack(l.items.begin(), l.items.end());
  rust::Vec<rust::String> names;
  while (!stack.empty()) {
    mx::array a = stack.back();
    stack.pop_back();
    if (a.is_available() || !a.has_primitive()) continue;
    if (!seen.insert(reinterpret_cast<std::uintptr_t>(&a.primitive())).second) continue;
    names.push_back(rust::String(a.primitive().name()));
    for (const auto& in : a.inputs()) stack.push_back(in);
  }
  return names;
}

std::unique_ptr<ArrayList> new_list() { return std::make_unique<ArrayList>(); }
void list_push(ArrayList& l, const Array& a) { l.items.push_back(a.inner); }
size_t list_len(const ArrayList& l) { return l.items.size(); }
ArrayPtr list_get(const ArrayList& l, size_t i) {
  if (i >= l.items.size()) throw std::out_of_range("array list index out of range");
  return wrap(l.items[i]);
}

ArrayPtr unary(UnaryOp op, const Array& a) {
  const auto& x = a.inner;
  switch (op) {
    case UnaryOp::Negative: return wrap(mx::negative(x));
    case UnaryOp::Exp: return wrap(mx::exp(x));
    case UnaryOp::Log: return wrap(mx::log(x));
    case UnaryOp::Tanh: return wrap(mx::tanh(x));
    case UnaryOp::Sigmoid: return wrap(mx::sigmoid(x));
    case UnaryOp::Sqrt: return wrap(mx::sqrt(x));
    case UnaryOp::Rsqrt: return wrap(mx::rsqrt(x));
    case UnaryOp::Abs: return wrap(mx::abs(x));
    case UnaryOp::Square: return wrap(mx::square(x));
    case UnaryOp::LogicalNot: return wrap(mx::logical_not(x));
    case UnaryOp::IsNan: return wrap(mx::isnan(x));
    case UnaryOp::Floor: return wrap(mx::floor(x));
    case UnaryOp::Log1p: return wrap(mx::log1p(x));
    case UnaryOp::Erf: return wrap(mx::erf(x));
    case UnaryOp::IsInf: return wrap(mx::isinf(x));
  }
  throw std::invalid_argument("unknown unary op code " + std::to_string(static_cast<int32_t>(op)));
}

ArrayPtr binary(BinaryOp op, const Array& a, const Array& b) {
  const auto& x = a.inner;
  const auto& y = b.inner;
  switch (op) {
    case BinaryOp::Add: return wrap(mx::add(x, y));
    case BinaryOp::Subtract: return wrap(mx::subtract(x, y));
    case BinaryOp::Multiply: return wrap(mx::multiply(x, y));
    case BinaryOp::Divide: return wrap(mx::divide(x, y));
    case BinaryOp::Maximum: return wrap(mx::maximum(x, y));
    case BinaryOp::Minimum: return wrap(mx::minimum(x, y));
    case BinaryOp::Power: return wrap(mx::power(x, y));
    case BinaryOp::Equal: return wrap(mx::equal(x, y));
    case BinaryOp::NotEqual: return wrap(mx::not_equal(x, y));
    case BinaryOp::Less: return wrap(mx::less(x, y));
    case BinaryOp::LessEqual: return wrap(mx::less_equal(x, y));
    case BinaryOp::Greater: return wrap(mx::greater(x, y));
    case BinaryOp::GreaterEqual: return wrap(mx::greater_equal(x, y));
    case BinaryOp::LogicalAnd: return wrap(mx::logical_and(x, y));
    case BinaryOp::LogicalOr: return wrap(mx::logical_or(x, y));
    case BinaryOp::FloorDivide: return wrap(mx::floor_divide(x, y));
    case BinaryOp::Remainder: return wrap(mx::remainder(x, y));
  }
  throw std::invalid_argument("unknown binary op code " + std::to_string(static_cast<int32_t>(op)));
}

ArrayPtr where_(const Array& c, const Array& a, const Array& b) { return wrap(mx::where(c.inner, a.inner, b.inner)); }
ArrayPtr astype(const Array& a, DtypeCode code) { return wrap(mx::astype(a.inner, to_dtype(code))); }
ArrayPtr view(const Array& a, DtypeCode code) { return wrap(mx::view(a.inner, to_dtype(code))); }

ArrayPtr reshape(const Array& a, rust::Slice<const int32_t> s) { return wrap(mx::reshape(a.inner, to_shape(s))); }
ArrayPtr transpose(const Array& a, rust::Slice<const int32_t> axes) {
  return wrap(mx::transpose(a.inner, to_ints(axes)));
}
ArrayPtr expand_dims(const Array& a, int32_t axis) { return wrap(mx::expand_dims(a.inner, axis)); }
ArrayPtr squeeze(const Array& a, int32_t axis) { return wrap(mx::squeeze(a.inner, axis)); }
ArrayPtr broadcast_to(const Array& a, rust::Slice<const int32_t> s) {
  return wrap(mx::broadcast_to(a.inner, to_shape(s)));
}
ArrayPtr slice(const Array& a, rust::Slice<const int32_t> start, rust::Slice<const int32_t> stop,
               rust::Slice<const int32_t> strides) {
  return wrap(mx::slice(a.inner, to_shape(start), to_shape(stop), to_shape(strides)));
}
ArrayPtr slice_update(const Array& src, const Array& update, rust::Slice<const int32_t> start,
                      rust::Slice<const int32_t> stop, rust::Slice<const int32_t> strides) {
  return wrap(mx::slice_update(src.inner, update.inner, to_shape(start), to_shape(stop), to_shape(strides)));
}
ArrayPtr concatenate(const ArrayList& l, int32_t axis) { return wrap(mx::concatenate(l.items, axis)); }
ArrayPtr contiguous(const Array& a) { return wrap(mx::contiguous(a.inner, false)); }

ArrayPtr take(const Array& a, const Array& idx, int32_t axis) { return wrap(mx::take(a.inner, idx.inner, axis)); }
ArrayPtr take_along_axis(const Array& a, const Array& idx, int32_t axis) {
  return wrap(mx::take_along_axis(a.inner, idx.inner, axis));
}
ArrayPtr put_along_axis(const Array& a, const Array& idx, const Array& values, int32_t axis) {
  return wrap(mx::put_along_axis(a.inner, idx.inner, values.inner, axis));
}
ArrayPtr argpartition(const Array& a, int32_t kth, int32_t axis) { return wrap(mx::argpartition(a.inner, kth, axis)); }
ArrayPtr sort(const Array& a, int32_t axis) { return wrap(mx::sort(a.inner, axis)); }
ArrayPtr argsort(const Array& a, int32_t axis) { return wrap(mx::argsort(a.inner, axis)); }

ArrayPtr reduce(ReduceOp op, const Array& a, rust::Slice<const int32_t> axes, bool keepdims) {
  auto ax = to_ints(axes);
  switch (op) {
    case ReduceOp::Sum: return wrap(mx::sum(a.inner, ax, keepdims));
    case ReduceOp::Max: return wrap(mx::max(a.inner, ax, keepdims));
    case ReduceOp::Min: return wrap(mx::min(a.inner, ax, keepdims));
    case ReduceOp::Mean: return wrap(mx::mean(a.inner, ax, keepdims));
    case ReduceOp::LogSumExp: return wrap(mx::logsumexp(a.inner, ax, keepdims));
    case ReduceOp::Prod: return wrap(mx::prod(a.inner, ax, keepdims));
  }
  throw std::invalid_argument("unknown reduction code " + std::to_string(static_cast<int32_t>(op)));
}
ArrayPtr argmax(const Array& a, int32_t axis, bool keepdims) { return wrap(mx::argmax(a.inner, axis, keepdims)); }
ArrayPtr argmin(const Array& a, int32_t axis, bool keepdims) { return wrap(mx::argmin(a.inner, axis, keepdims)); }
ArrayPtr softmax(const Array& a, rust::Slice<const int32_t> axes, bool precise) {
  return wrap(mx::softmax(a.inner, to_ints(axes), precise));
}
ArrayPtr cumsum(const Array& a, int32_t axis, bool reverse, bool inclusive) {
  return wrap(mx::cumsum(a.inner, axis, reverse, inclusive));
}

ArrayPtr matmul(const Array& a, const Array& b) { return wrap(mx::matmul(a.inner, b.inner)); }

ArrayPtr rms_norm(const Array& x, const ArrayList& weight, float eps) {
  return wrap(mx::fast::rms_norm(x.inner, opt(weight), eps));
}

ArrayPtr rope(const Array& x, int32_t dims, bool traditional, float base, float scale, const Array& offset,
              const ArrayList& freqs) {
  auto f = opt(freqs);
  std::optional<float> b = f ? std::nullopt : std::optional<float>(base);
  return wrap(mx::fast::rope(x.inner, dims, traditional, b, scale, offset.inner, f));
}

ArrayPtr sdpa(const Array& q, const Array& k, const Array& v, float scale, rust::Str mask_mode,
              const ArrayList& mask) {
  return wrap(mx::fast::scaled_dot_product_attention(q.inner, k.inner, v.inner, scale, std::string(mask_mode),
                                                     opt(mask)));
}

std::unique_ptr<ArrayList> quantize(const Array& w, int32_t group_size, int32_t bits, rust::Str mode) {
  return wrap_list(mx::quantize(w.inner, group_size, bits, std::string(mode)));
}

ArrayPtr dequantize(const Array& w, const Array& scales, const ArrayList& biases, int32_t group_size,
                    int32_t bits, rust::Str mode) {
  return wrap(mx::dequantize(w.inner, scales.inner, opt(biases), group_size, bits, std::string(mode)));
}

ArrayPtr quantized_matmul(const Array& x, const Array& w, const Array& scales, const ArrayList& biases,
                          bool transpose, int32_t group_size, int32_t bits, rust::Str mode) {
  return wrap(mx::quantized_matmul(x.inner, w.inner, scales.inner, opt(biases), transpose, group_size, bits,
                                   std::string(mode)));
}

ArrayPtr gather_qmm(const Array& x, const Array& w, const Array& scales, const ArrayList& biases,
                    const Array& rhs_indices, bool transpose, int32_t group_size, int32_t bits, rust::Str mode,
                    bool sorted_indices) {
  return wrap(mx::gather_qmm(x.inner, w.inner, scales.inner, opt(biases), std::nullopt, rhs_indices.inner,
                             transpose, group_size, bits, std::string(mode), std::nullopt, sorted_indices));
}

ArrayPtr gather_mm(const Array& a, const Array& b, const Array& rhs_indices, bool sorted_indices) {
  return wrap(mx::gather_mm(a.inner, b.inner, std::nullopt, rhs_indices.inner, sorted_indices));
}

ArrayPtr random_key(uint64_t seed) { return wrap(mx::random::key(seed)); }

std::unique_ptr<ArrayList> random_split(const Array& key, int32_t num) {
  auto keys = mx::random::split(key.inner, num);
  std::vector<mx::array> out;
  for (int i = 0; i < num; ++i) out.push_back(mx::take(keys, i, 0));
  return wrap_list(std::move(out));
}

ArrayPtr random_uniform(const Array& low, const Array& high, rust::Slice<const int32_t> shp, DtypeCode code,
                        const Array& key) {
  return wrap(mx::random::uniform(low.inner, high.inner, to_shape(shp), to_dtype(code), key.inner));
}

ArrayPtr random_normal(rust::Slice<const int32_t> shp, DtypeCode code, float loc, float scale, const Array& key) {
  return wrap(mx::random::normal(to_shape(shp), to_dtype(code), loc, scale, key.inner));
}

ArrayPtr random_categorical(const Array& logits, int32_t axis, const Array& key) {
  return wrap(mx::random::categorical(logits.inner, axis, key.inner));
}

std::unique_ptr<ArrayList> load_safetensors(rust::Str path, rust::Vec<rust::String>& names,
                                            rust::Vec<rust::String>& metadata) {
  auto [arrays, meta] = mx::load_safetensors(std::string(path));
  auto out = std::make_unique<ArrayList>();
  for (auto& [k, v] : arrays) {
    names.push_back(rust::String(k));
    out->items.push_back(v);
  }
  for (auto& [k, v] : meta) {
    metadata.push_back(rust::String(k));
    metadata.push_back(rust::String(v));
  }
  return out;
}

void save_safetensors(rust::Str path, rust::Slice<const rust::String> names, const ArrayList& arrays,
                      rust::Slice<const rust::String> metadata) {
  if (names.size() != arrays.items.size()) throw std::invalid_argument("names and arrays differ in length");
  std::unordered_map<std::string, mx::array> m;
  for (size_t i = 0; i < names.size(); ++i) m.insert({std::string(names[i]), arrays.items[i]});
  std::unordered_map<std::string, std::string> meta;
  for (size_t i = 0; i + 1 < metadata.size(); i += 2) meta[std::string(metadata[i])] = std::string(metadata[i + 1]);
  mx::save_safetensors(std::string(path), std::move(m), std::move(meta));
}

void set_default_device(DeviceKind kind) { mx::set_default_device(to_device(kind)); }
DeviceKind default_device() {
  return mx::default_device() == mx::Device(mx::Device::cpu) ? DeviceKind::Cpu : DeviceKind::Gpu;
}
bool device_available(DeviceKind kind) { return mx::is_available(to_device(kind)); }

int32_t new_stream(DeviceKind kind) { return mx::new_stream(to_device(kind)).index; }
int32_t default_stream(DeviceKind kind) { return mx::default_stream(to_device(kind)).index; }
void set_default_stream(int32_t index, DeviceKind kind) { mx::set_default_stream(mx::Stream(index, to_device(kind))); }
void synchronize_stream(int32_t index, DeviceKind kind) { mx::synchronize(mx::Stream(index, to_device(kind))); }

// ---- autodiff ----
namespace {
// The closure MLX traces: hands the tracer inputs to Rust and returns what Rust computed. A
// Rust error comes back as a thrown rust::Error, which unwinds MLX's trace (its tracing state
// is RAII) and is caught by the cxx wrapper of the calling bridge function.
std::function<std::vector<mx::array>(const std::vector<mx::array>&)> traced(GradCtx& ctx) {
  return [&ctx](const std::vector<mx::array>& xs) {
    ArrayList in{xs};
    ArrayList out;
    grad_trampoline(ctx, in, out);
    return out.items;
  };
}
}  // namespace

std::unique_ptr<ArrayList> value_and_grad(GradCtx& ctx, const ArrayList& inputs, rust::Slice<const int32_t> argnums) {
  std::vector<int> nums(argnums.begin(), argnums.end());
  auto [values, grads] = mx::value_and_grad(traced(ctx), nums)(inputs.items);
  auto l = std::make_unique<ArrayList>();
  l->items = std::move(values);
  l->items.insert(l->items.end(), grads.begin(), grads.end());
  return l;
}

std::unique_ptr<ArrayList> vjp(GradCtx& ctx, const ArrayList& primals, const ArrayList& cotangents) {
  auto [outputs, vjps] = mx::vjp(traced(ctx), primals.items, cotangents.items);
  auto l = std::make_unique<ArrayList>();
  l->items = std::move(outputs);
  l->items.insert(l->items.end(), vjps.begin(), vjps.end());
  return l;
}

ArrayPtr stop_gradient(const Array& a) { return wrap(mx::stop_gradient(a.inner)); }

}  // namespace mlxr
