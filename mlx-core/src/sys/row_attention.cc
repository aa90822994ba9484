// Row-invariant single-query attention in f32 on the CPU: one primitive for all the rows of a
// decode step or a stepwise verify window, each row attending to its own keys.
//
// A stepwise verify must give every row the bits a one-token decode step gives it. Composing
// MLX's ops for that costs about ten graph nodes per row and layer (slices, two matmuls, a
// softmax, reshapes), and on a CPU every node costs ~10 µs of scheduling whatever its size. This
// kernel does a whole layer's rows in one node, with an arithmetic that depends only on the
// row's own query, keys and values: scores as eight-lane dot products reduced in a fixed tree,
// the maximum, exponentials and their sum in key order, then the value rows accumulated in key
// order and divided by the sum. Decode steps use the same kernel, so both agree bit for bit.
#include "mlx-core/src/sys/shim.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "mlx/backend/cpu/encoder.h"
#include "mlx/primitives.h"
#include "mlx-core/src/sys/row_kernel.h"


namespace mx = mlx::core;

namespace mlxr {
namespace {

// Fixed-order dot product: lane l sums k ≡ l (mod 8) with FMAs, lanes reduced pairwise, then
// the tail. The AVX2 form below computes exactly this (one FMA per lane per step).
inline float reduce_lanes(const float* lane) {
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

// scores[j] ← exp(scores[j] − m), returning their sum taken in key order.
inline float exponentiate(float* scores, int L, float m) {
  float sum = 0.0f;
  for (int j = 0; j < L; ++j) {
    scores[j] = std::exp(scores[j] - m);
    sum += scores[j];
  }
  return sum;
}

// One query row `q` [D] over `L` keys/values into `out` [D]: scores, their maximum,
// exponentials summed in key order, values accumulated in key order with FMAs, then divided by
// the sum. Key j's D floats start at k[j] and value j's at v[j], so cache buffers are read in
// place, whatever their layout and however many pieces a row's keys come in.
void attend_row_generic(const float* q, const float* const* k, const float* const* v, int L, int D, float scale,
                        float* out, float* scores) {
  float m = -INFINITY;
  for (int j = 0; j < L; ++j) {
    const float* kr = k[j];
    float lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int d = 0;
    for (; d + 8 <= D; d += 8) {
      for (int l = 0; l < 8; ++l) lane[l] = std::fma(q[d + l], kr[d + l], lane[l]);
    }
    float s = reduce_lanes(lane);
    for (; d < D; ++d) s = std::fma(q[d], kr[d], s);
    scores[j] = s * scale;
    m = std::max(m, scores[j]);
  }
  const float sum = exponentiate(scores, L, m);
  for (int d = 0; d < D; ++d) out[d] = 0.0f;
  for (int j = 0; j < L; ++j) {
    const float* vr = v[j];
    for (int d = 0; d < D; ++d) out[d] = std::fma(scores[j], vr[d], out[d]);
  }
  const float inv = 1.0f / sum;
  for (int d = 0; d < D; ++d) out[d] *= inv;
}

#ifdef MLXR_X86
__attribute__((target("avx2,fma"))) void attend_row_avx2(const float* q, const float* const* k,
                                                         const float* const* v, int L, int D, float scale,
                                                         float* out, float* scores) {
  const int d8 = D & ~7;
  float m = -INFINITY;
  alignas(32) float lane[8];
  for (int j = 0; j < L; ++j) {
    const float* kr = k[j];
    __m256 acc = _mm256_setzero_ps();
    for (int d = 0; d < d8; d += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + d), _mm256_loadu_ps(kr + d), acc);
    _mm256_store_ps(lane, acc);
    float s = reduce_lanes(lane);
    for (int d = d8; d < D; ++d) s = std::fma(q[d], kr[d], s);
    scores[j] = s * scale;
    m = std::max(m, scores[j]);
  }
  const float sum = exponentiate(scores, L, m);
  for (int d = 0; d < D; ++d) out[d] = 0.0f;
  for (int j = 0; j < L; ++j) {
    const float* vr = v[j];
    const __m256 p = _mm256_set1_ps(scores[j]);
    int d = 0;
    for (; d < d8; d += 8) _mm256_storeu_ps(out + d, _mm256_fmadd_ps(p, _mm256_loadu_ps(vr + d), _mm256_loadu_ps(out + d)));
    for (; d < D; ++d) out[d] = std::fma(scores[j], vr[d], out[d]);
  }
  const float inv = 1.0f / sum;
  for (int d = 0; d < D; ++d) out[d] *= inv;
}

#endif

void attend_row(const float* q, const std::vector<const float*>& k, const std::vector<const float*>& v, int D,
                float scale, float* out, std::vector<float>& scores) {
  const int L = static_cast<int>(k.size());
  scores.resize(k.size());
#ifdef MLXR_X86
  if (has_avx2_fma()) return attend_row_avx2(q, k.data(), v.data(), L, D, scale, out, scores.data());
#endif
  attend_row_generic(q, k.data(), v.data(), L, D, scale, out, scores.data());
}

// Keys and values are read through their strides when each row's D floats are contiguous
// (a cache buffer sliced along its rows is), which saves copying the whole cache for every
// query row of every layer. Strides are only known once an input is evaluated, so the check
// is made in the kernel, which copies anything else to row-major itself.
bool rows_readable(const mx::array& a) {
  const auto& st = a.strides();
  return (a.shape(3) == 1 || st[3] == 1) && st[0] >= 0 && st[1] >= 0 && st[2] >= 0;
}

// A [B, H, L, D] array's elements in row-major order.
std::vector<float> row_major(const mx::array& a) {
  std::vector<float> out(a.size());
  const auto& st = a.strides();
  const float* p = a.data<float>();
  size_t o = 0;
  for (int b = 0; b < a.shape(0); ++b)
    for (int h = 0; h < a.shape(1); ++h)
      for (int l = 0; l < a.shape(2); ++l)
        for (int d = 0; d < a.shape(3); ++d) out[o++] = p[b * st[0] + h * st[1] + l * st[2] + d * st[3]];
  return out;
}

// A [B, H, L, D] input read in place: its element (b, h, l, 0) and the D floats after it.
struct Rows {
  const float* base;
  size_t sb, sh, sl;
  int L;
  const float* row(int b, int h, int l) const { return base + b * sb + h * sh + l * sl; }
};

class RowAttention : public CpuOnlyMulti {
 public:
  RowAttention(mx::Stream s, float scale, std::vector<int> segments)
      : CpuOnlyMulti(s), scale_(scale), segments_(std::move(segments)) {}

  // inputs: q [B, Hq, n, D] row-contiguous, then for each row i its keys and values as
  // segments_[i] pairs k, v [B, Hkv, L_s, D], attended as their concatenation along L (each
  // row of D floats contiguous; any strides over B, Hkv and L).
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    mx::array& out = outputs[0];
    // Nothing must be row-contiguous: q is read through RowMajor, keys and values through their
    // strides.
    auto held = hold_row_inputs(inputs, out, stream(), "RowAttention", 0);
    mx::cpu::get_command_encoder(stream()).dispatch([held = std::move(held), out = mx::array::unsafe_weak_copy(out), scale = scale_,
                  segments = segments_]() mutable {
      const mx::array& q = held[0];
      const int B = q.shape(0), Hq = q.shape(1), n = q.shape(2), D = q.shape(3);
      RowMajor q_rows;
      const float* qd = q_rows(q);
      std::vector<float> scores;
      std::vector<const float*> kp, vp;
      std::vector<std::vector<float>> copies;  // inputs whose rows are not contiguous
      auto rows = [&](const mx::array& a) {
        if (rows_readable(a)) {
          const auto& st = a.strides();
          return Rows{a.data<float>(), size_t(st[0]), size_t(st[1]), size_t(st[2]), a.shape(2)};
        }
        copies.push_back(row_major(a));
        const size_t l = size_t(a.shape(2)) * D;
        return Rows{copies.back().data(), size_t(a.shape(1)) * l, l, size_t(D), a.shape(2)};
      };
      size_t next = 1;
      for (int i = 0; i < n; ++i) {
        std::vector<std::pair<Rows, Rows>> segs;
        for (int s = 0; s < segments[i]; ++s, next += 2) segs.emplace_back(rows(held[next]), rows(held[next + 1]));
        const int rep = Hq / held[next - 2].shape(1);
        for (int b = 0; b < B; ++b) {
          for (int h = 0; h < Hq; ++h) {
            kp.clear();
            vp.clear();
            for (const auto& [k, v] : segs) {
              for (int l = 0; l < k.L; ++l) {
                kp.push_back(k.row(b, h / rep, l));
                vp.push_back(v.row(b, h / rep, l));
              }
            }
            const size_t qi = ((static_cast<size_t>(b) * Hq + h) * n + i) * D;
            attend_row(qd + qi, kp, vp, D, scale, out.data<float>() + qi, scores);
          }
        }
        copies.clear();
      }
    });
  }

  DEFINE_NAME(RowAttention)
  bool is_equivalent(const mx::Primitive& other) const override {
    const auto& o = static_cast<const RowAttention&>(other);
    return scale_ == o.scale_ && segments_ == o.segments_;
  }

 private:
  float scale_;
  std::vector<int> segments_;
};


// A stepwise forward's cache writes and its attention in one node per layer, for all the
// sessions of a batched step. Written with graph ops, every session costs each layer several
// nodes (slices of its new rows, buffer updates or copies, views of each row's keys), ~10 µs of
// host work apiece; here the host only computes the plan below (plain integers), and the node
// rebuilds each session's buffer and attends each row over ranges of it with `attend_row`, so the
// rows get the bits `RowAttention` gives them over the same keys in the same order.
//
// Plan (int32, flat): S, then per session `rows, len, in_place, copies, copies × (dst, src, start,
// count)`
// (src 0: the old buffer's rows, 1: the session's new rows; copies apply in order), then per query
// row (the sessions' rows in turn) `ranges, ranges × (start, end)` into its session's buffer.
// Without writes the sessions' buffers are read as given and their copies must be empty.
//
// In place: MLX donates an input buffer to an output only when nothing else holds the input, and
// every output of a multi-output node holds its inputs, so this node could never be donated a
// buffer. The caller checks instead, while building the graph, that its cache held the buffers
// alone (`sole_holder`) and gives them up to the node, which then rewrites them where the plan
// allows it (same length, the old rows at most shifted down) instead of copying them.
struct RowCopy {
  int dst, src, start, count;
};

struct SessionPlan {
  int rows = 0, len = 0;
  bool in_place = false;  // the caller holds the buffers alone: they may be rewritten in place
  std::vector<RowCopy> copies;
  // The new buffer can be the old one rewritten: same length, one copy from the old rows first,
  // moving them down (memmove, so it reads rows before anything overwrites them), the rest from
  // the new rows.
  bool shiftable() const {
    for (size_t i = 0; i < copies.size(); ++i) {
      const auto& c = copies[i];
      if (c.src == 0 && (i > 0 || c.dst > c.start)) return false;
    }
    return true;
  }
};

struct CachePlan {
  std::vector<SessionPlan> sessions;
  std::vector<std::vector<std::pair<int, int>>> reads;  // per query row
};

CachePlan parse_plan(rust::Slice<const int32_t> flat) {
  size_t at = 0;
  auto next = [&]() -> int {
    if (at >= flat.size()) throw std::invalid_argument("row_cache_attention: the plan ends early");
    return flat[at++];
  };
  CachePlan p;
  const int S = next();
  if (S < 1) throw std::invalid_argument("row_cache_attention: the plan needs at least one session");
  int total = 0;
  for (int s = 0; s < S; ++s) {
    SessionPlan sp;
    sp.rows = next();
    sp.len = next();
    sp.in_place = next() != 0;
    const int n = next();
    if (sp.rows < 1 || sp.len < 1 || n < 0) throw std::invalid_argument("row_cache_attention: bad session header");
    std::vector<bool> covered(static_cast<size_t>(sp.len), false);
    for (int c = 0; c < n; ++c) {
      RowCopy rc{next(), next(), next(), next()};
      const int64_t end = int64_t(rc.dst) + rc.count, from_end = int64_t(rc.start) + rc.count;
      if (rc.dst < 0 || rc.count < 0 || rc.start < 0 || end > sp.len || (rc.src != 0 && rc.src != 1) ||
          (rc.src == 1 && from_end > sp.rows)) {
        throw std::invalid_argument("row_cache_attention: a copy falls outside its buffer or rows");
      }
      std::fill(covered.begin() + rc.dst, covered.begin() + end, true);
      sp.copies.push_back(rc);
    }
    // Every row of a rebuilt buffer is written (a read-only plan has no buffer to rebuild).
    if (n > 0 && std::find(covered.begin(), covered.end(), false) != covered.end()) {
      throw std::invalid_argument("row_cache_attention: the copies leave rows of a new buffer unwritten");
    }
    total += sp.rows;
    p.sessions.push_back(std::move(sp));
  }
  for (int i = 0; i < total; ++i) {
    const int n = next();
    if (n < 1) throw std::invalid_argument("row_cache_attention: every row needs at least one key range");
    std::vector<std::pair<int, int>> r;
    for (int j = 0; j < n; ++j) {
      const int a = next(), b = next();
      if (a < 0 || b <= a) throw std::invalid_argument("row_cache_attention: empty or reversed key range");
      r.emplace_back(a, b);
    }
    p.reads.push_back(std::move(r));
  }
  if (at != flat.size()) throw std::invalid_argument("row_cache_attention: the plan has trailing entries");
  return p;
}

class RowCacheAttention : public CpuOnlyMulti {
 public:
  RowCacheAttention(mx::Stream s, float scale, CachePlan plan, bool writes)
      : CpuOnlyMulti(s), scale_(scale), plan_(std::move(plan)), writes_(writes) {}

  // inputs: q [1, Hq, R, D]; with writes k_new, v_new [1, Hkv, R, D]; then per session its key
  // and value buffers [1, Hkv, L_s, D] (rows of D floats contiguous, any other strides).
  // outputs: [1, Hq, R, D]; with writes each session's new key and value buffers [1, Hkv, len, D].
  void eval_cpu(const std::vector<mx::array>& inputs, std::vector<mx::array>& outputs) override {
    const size_t first = writes_ ? 3 : 1;
    std::vector<bool> in_place(outputs.size(), false);
    outputs[0].set_data(mx::allocator::malloc(outputs[0].nbytes()));
    for (size_t o = 1; o < outputs.size(); ++o) {
      const auto& old = inputs[first + o - 1];
      const auto& sp = plan_.sessions[(o - 1) / 2];
      in_place[o] = sp.in_place && sp.shiftable() && old.flags().row_contiguous && old.shape() == outputs[o].shape();
      if (in_place[o]) {
        outputs[o].copy_shared_buffer(old);
      } else {
        outputs[o].set_data(mx::allocator::malloc(outputs[o].nbytes()));
      }
    }
    auto& enc = mx::cpu::get_command_encoder(stream());
    std::vector<mx::array> held, outs;
    for (const auto& a : inputs) {
      enc.set_input_array(a);
      held.push_back(mx::array::unsafe_weak_copy(a));
    }
    for (auto& a : outputs) {
      enc.set_output_array(a);
      outs.push_back(mx::array::unsafe_weak_copy(a));
    }
    enc.dispatch([held = std::move(held), outs = std::move(outs), in_place = std::move(in_place), plan = plan_,
                  scale = scale_, first]() mutable {
      const mx::array& q = held[0];
      const int Hq = q.shape(1), R = q.shape(2), D = q.shape(3);
      const int Hkv = held[first].shape(1);
      const int rep = Hq / Hkv;
      RowMajor q_rows, kv_rows;
      const float* qd = q_rows(q);
      const float* kn = first == 3 ? kv_rows(held[1]) : nullptr;  // [Hkv, R, D]
      const float* vn = first == 3 ? kv_rows(held[2]) : nullptr;
      std::vector<std::vector<float>> copies;
      // Each session's key and value buffers as the rows read: the new ones, or the inputs.
      std::vector<std::pair<Rows, Rows>> bufs;
      int row0 = 0;  // the session's first row in q and the new rows
      for (size_t s = 0; s < plan.sessions.size(); ++s) {
        const auto& sp = plan.sessions[s];
        std::pair<Rows, Rows> pair;
        for (int kv = 0; kv < 2; ++kv) {
          const mx::array& old = held[first + 2 * s + kv];
          Rows src;
          if (rows_readable(old)) {
            const auto& st = old.strides();
            src = Rows{old.data<float>(), size_t(st[0]), size_t(st[1]), size_t(st[2]), old.shape(2)};
          } else {
            copies.push_back(row_major(old));
            const size_t l = size_t(old.shape(2)) * D;
            src = Rows{copies.back().data(), size_t(Hkv) * l, l, size_t(D), old.shape(2)};
          }
          if (first == 1) {
            (kv == 0 ? pair.first : pair.second) = src;
            continue;
          }
          mx::array& out = outs[1 + 2 * s + kv];
          float* dst = out.data<float>();
          const size_t l = size_t(sp.len) * D;
          const float* fresh = kv == 0 ? kn : vn;
          for (const auto& c : sp.copies) {
            if (c.count == 0 || (c.src == 0 && in_place[1 + 2 * s + kv] && c.dst == c.start)) continue;
            for (int h = 0; h < Hkv; ++h) {
              for (int r = 0; r < c.count; ++r) {
                const float* from = c.src == 0 ? src.row(0, h, c.start + r)
                                               : fresh + (size_t(h) * R + row0 + c.start + r) * D;
                std::memmove(dst + h * l + size_t(c.dst + r) * D, from, sizeof(float) * D);
              }
            }
          }
          (kv == 0 ? pair.first : pair.second) = Rows{dst, size_t(Hkv) * l, l, size_t(D), sp.len};
        }
        bufs.push_back(pair);
        row0 += sp.rows;
      }
      std::vector<float> scores;
      std::vector<const float*> kp, vp;
      float* od = outs[0].data<float>();
      int i = 0;
      for (size_t s = 0; s < plan.sessions.size(); ++s) {
        const auto& [k, v] = bufs[s];
        for (int r = 0; r < plan.sessions[s].rows; ++r, ++i) {
          for (int h = 0; h < Hq; ++h) {
            kp.clear();
            vp.clear();
            for (const auto& [a, b] : plan.reads[i]) {
              for (int l = a; l < b; ++l) {
                kp.push_back(k.row(0, h / rep, l));
                vp.push_back(v.row(0, h / rep, l));
              }
            }
            const size_t qi = (static_cast<size_t>(h) * R + i) * D;
            attend_row(qd + qi, kp, vp, D, scale, od + qi, scores);
          }
        }
      }
    });
  }

  DEFINE_NAME(RowCacheAttention)

 private:
  float scale_;
  CachePlan plan_;
  bool writes_;
};

}  // namespace

ArrayPtr row_attention(const ArrayList& inputs, rust::Slice<const int32_t> segments, float scale) {
  const auto& in = inputs.items;
  if (in.empty()) throw std::invalid_argument("row_attention: expected q and each query row's (k, v) pairs");
  const auto& q = in[0];
  if (q.ndim() != 4) throw std::invalid_argument("row_attention: q must be [B, Hq, n, D]");
  const int n = q.shape(2);
  if (segments.size() != static_cast<size_t>(n)) {
    throw std::invalid_argument("row_attention: " + std::to_string(n) + " query rows need as many segment counts");
  }
  size_t pairs = 0;
  for (int32_t c : segments) {
    if (c < 1) throw std::invalid_argument("row_attention: every row needs at least one (k, v) pair");
    pairs += static_cast<size_t>(c);
  }
  if (in.size() != 1 + 2 * pairs) {
    throw std::invalid_argument("row_attention: expected " + std::to_string(pairs) + " (k, v) pairs, got " +
                                std::to_string(in.size() - 1) + " arrays");
  }
  auto s = mx::default_stream(mx::Device(mx::Device::cpu));
  std::vector<mx::array> args;
  args.reserve(in.size());
  size_t next = 1;
  for (int i = 0; i < n; ++i) {
    int keys = 0;
    for (int32_t c = 0; c < segments[i]; ++c, next += 2) {
      const auto& k = in[next];
      const auto& v = in[next + 1];
      for (const auto* a : {&k, &v}) {
        if (a->dtype() != mx::float32) throw std::invalid_argument("row_attention: only float32 is supported");
        if (a->ndim() != 4 || a->shape(0) != q.shape(0) || a->shape(3) != q.shape(3) || a->shape(1) == 0 ||
            q.shape(1) % a->shape(1) != 0 || a->shape(1) != in[next].shape(1)) {
          throw std::invalid_argument("row_attention: k/v must be [B, Hkv, L, D] with Hkv dividing Hq");
        }
      }
      if (k.shape(2) != v.shape(2)) throw std::invalid_argument("row_attention: k and v of a row differ in length");
      if (c > 0 && k.shape(1) != in[next - 2].shape(1)) {
        throw std::invalid_argument("row_attention: a row's segments differ in heads");
      }
      keys += k.shape(2);
      args.push_back(k);
      args.push_back(v);
    }
    if (keys == 0) throw std::invalid_argument("row_attention: a row has no keys");
  }
  args.insert(args.begin(), q);
  std::vector<int> segs(segments.begin(), segments.end());
  auto outs = mx::array::make_arrays({q.shape()}, {mx::float32},
                                     std::make_shared<RowAttention>(s, scale, std::move(segs)), args);
  return std::make_unique<Array>(outs[0]);
}

std::unique_ptr<ArrayList> row_cache_attention(const ArrayList& inputs, rust::Slice<const int32_t> plan_flat, bool writes,
                                               float scale) {
  const char* k = "row_cache_attention: ";
  auto fail = [&](const std::string& what) { throw std::invalid_argument(k + what); };
  CachePlan plan = parse_plan(plan_flat);
  const auto& in = inputs.items;
  const size_t first = writes ? 3 : 1;
  const size_t S = plan.sessions.size();
  if (in.size() != first + 2 * S) {
    fail("expected q" + std::string(writes ? ", k_new, v_new" : "") + " and two buffers for each of " +
         std::to_string(S) + " sessions, got " + std::to_string(in.size()) + " arrays");
  }
  for (const auto& a : in) {
    if (a.dtype() != mx::float32) fail("only float32 is supported");
    if (a.ndim() != 4 || a.shape(0) != 1) fail("arrays must be [1, H, L, D]");
  }
  const auto& q = in[0];
  const int R = q.shape(2), D = q.shape(3), Hkv = in[first].shape(1);
  if (Hkv < 1 || q.shape(1) % Hkv != 0) fail("the key heads must divide the query heads");
  int total = 0;
  for (const auto& sp : plan.sessions) total += sp.rows;
  if (total != R) fail("the plan's sessions hold " + std::to_string(total) + " rows, q has " + std::to_string(R));
  if (writes) {
    for (size_t i : {size_t(1), size_t(2)}) {
      if (in[i].shape(1) != Hkv || in[i].shape(2) != R || in[i].shape(3) != D) fail("new keys/values must be [1, Hkv, R, D]");
    }
  }
  for (size_t s = 0; s < S; ++s) {
    const auto& sp = plan.sessions[s];
    const auto& kb = in[first + 2 * s];
    const auto& vb = in[first + 2 * s + 1];
    if (kb.shape() != vb.shape() || kb.shape(1) != Hkv || kb.shape(3) != D) {
      fail("session " + std::to_string(s) + "'s buffers must both be [1, Hkv, L, D]");
    }
    if (!writes && !sp.copies.empty()) fail("a read-only plan has no copies");
    if (writes && sp.copies.empty()) fail("session " + std::to_string(s) + "'s plan rebuilds nothing");
    for (const auto& c : sp.copies) {
      if (c.src == 0 && int64_t(c.start) + c.count > kb.shape(2)) {
        fail("a copy reads past session " + std::to_string(s) + "'s buffer");
      }
    }
  }
  int i = 0;
  for (size_t s = 0; s < S; ++s) {
    const int len = writes ? plan.sessions[s].len : in[first + 2 * s].shape(2);
    for (int r = 0; r < plan.sessions[s].rows; ++r, ++i) {
      for (const auto& [a, b] : plan.reads[i]) {
        if (b > len) fail("row " + std::to_string(i) + " reads past its session's buffer");
      }
    }
  }
  auto st = mx::default_stream(mx::Device(mx::Device::cpu));
  std::vector<mx::Shape> shapes{q.shape()};
  std::vector<mx::Dtype> dtypes{mx::float32};
  if (writes) {
    for (const auto& sp : plan.sessions) {
      for (int kv = 0; kv < 2; ++kv) {
        shapes.push_back({1, Hkv, sp.len, D});
        dtypes.push_back(mx::float32);
      }
    }
  }
  auto prim = std::make_shared<RowCacheAttention>(st, scale, std::move(plan), writes);
  auto l = std::make_unique<ArrayList>();
  l->items = mx::array::make_arrays(std::move(shapes), std::move(dtypes), prim, in);
  return l;
}

}  // namespace mlxr
