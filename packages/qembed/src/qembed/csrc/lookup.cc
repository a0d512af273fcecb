// qembed_lookup: ids -> quantized rows -> dequantized -> pooled, in one pass (Paddle custom CPU op).
//
// Inputs (the parameters quant_embedding stores, see qembed.ext):
//   Ids    int64 or int32, any shape; pooled modes pool over its last axis.
//   Codes  int8 [rows, dim] (one code per value), or [rows, ceil(dim / k)] bytes of k packed codes.
//   Scale  float32 or float16, [rows, 1] (per row) or [1].
//   Offset optional [rows, 1] of Scale's dtype: value = code value * scale + offset.
//   Values optional float32: unpacked, [256] value of code c at c + 128 (log codes); packed, [256, k]
//          the k code values of byte b at row b + 128 (required when packed). Without it an unpacked
//          code's value is the code.
// Attrs: dim, packed (codes per byte k; 1 = unpacked), pooling ("none", "sum", "mean", "sqrt_mean"),
//   padding_idx (negative: none). Ids equal to padding_idx give zero rows ("none") or are left out of the
//   bag (pooled; mean and sqrt_mean count only the others; a bag without ids pools to zeros).
// The arithmetic is the op sequence's (code value * scale, then + offset, each rounded to float32; a float16
// scale or offset widened to float32 first, which is exact) and bags are summed id by id in order; build with
// -ffp-contract=off so no multiply-add is fused. The x86-64 build holds AVX-512, AVX2 and baseline code paths,
// one chosen at run time (see Dispatch): build it without -march, so that the baseline path runs anywhere.

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "paddle/extension.h"

namespace {

enum class Pool { kNone, kSum, kMean, kSqrtMean };

Pool ParsePool(const std::string& name) {
  if (name == "none") return Pool::kNone;
  if (name == "sum") return Pool::kSum;
  if (name == "mean") return Pool::kMean;
  if (name == "sqrt_mean") return Pool::kSqrtMean;
  PD_THROW("qembed_lookup: pooling must be none, sum, mean or sqrt_mean, got ", name);
}

// One value per row (or one for the table), stored float32 or float16.
struct Column {
  const void* data = nullptr;
  bool half = false;
  float operator[](int64_t i) const {
    return half ? static_cast<float>(static_cast<const phi::dtype::float16*>(data)[i])
                : static_cast<const float*>(data)[i];
  }
};

Column ColumnOf(const paddle::Tensor& t) {
  if (t.dtype() == paddle::DataType::FLOAT16) return {t.data<phi::dtype::float16>(), true};
  return {t.data<float>(), false};
}

struct Table {
  const int8_t* codes;
  int64_t rows;
  int64_t width;  // bytes per row
  int64_t dim;
  int64_t per_byte;  // codes per byte (1: unpacked)
  Column scale;
  bool per_row;
  Column offset;  // data nullptr: none
  const float* values;  // nullptr: code value = code
};

// out[d] (=, or += when Add) the dequantized row `id`.
template <bool Add>
inline void Row(const Table& t, int64_t id, float* out) {
  const int8_t* c = t.codes + id * t.width;
  const float s = t.per_row ? t.scale[id] : t.scale[0];
  const bool has_offset = t.offset.data != nullptr;
  const float o = has_offset ? t.offset[id] : 0.0f;
  const int64_t dim = t.dim;
  if (t.per_byte == 1) {
    if (t.values) {
      const float* v = t.values + 128;
      for (int64_t d = 0; d < dim; ++d) {
        float x = v[c[d]] * s;
        if (has_offset) x = x + o;
        out[d] = Add ? out[d] + x : x;
      }
    } else if (has_offset) {
      for (int64_t d = 0; d < dim; ++d) {
        float x = static_cast<float>(c[d]) * s + o;
        out[d] = Add ? out[d] + x : x;
      }
    } else {
      for (int64_t d = 0; d < dim; ++d) {
        float x = static_cast<float>(c[d]) * s;
        out[d] = Add ? out[d] + x : x;
      }
    }
    return;
  }
  const int64_t k = t.per_byte;
  const float* lut = t.values + 128 * k;
  int64_t d = 0;
  for (int64_t b = 0; b < t.width; ++b) {
    const float* v = lut + c[b] * k;
    for (int64_t j = 0; j < k && d < dim; ++j, ++d) {
      float x = v[j] * s;
      if (has_offset) x = x + o;
      out[d] = Add ? out[d] + x : x;
    }
  }
}

// Checked before the kernel runs, in the baseline code path: the kernels below do arithmetic only.
template <typename Id>
void CheckIds(const Id* ids, int64_t n, int64_t rows) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    if (id < 0 || id >= rows) {  // (so a negative padding_idx, i.e. none, matches no id below)
      PD_THROW("qembed_lookup: id ", id, " is outside the table's ", rows, " rows; ids must be in [0, ", rows, ")");
    }
  }
}

template <typename Id>
inline void Run(const Table& t, const Id* ids, int64_t bags, int64_t bag, Pool pool, int64_t padding_idx,
                float* out) {
  const int64_t dim = t.dim;
  if (pool == Pool::kNone) {
    for (int64_t i = 0; i < bags * bag; ++i) {
      float* o = out + i * dim;
      const int64_t id = static_cast<int64_t>(ids[i]);
      if (id == padding_idx) {
        std::memset(o, 0, sizeof(float) * dim);
      } else {
        Row<false>(t, id, o);
      }
    }
    return;
  }
  for (int64_t b = 0; b < bags; ++b) {
    float* o = out + b * dim;
    std::memset(o, 0, sizeof(float) * dim);
    int64_t n = 0;
    for (int64_t j = 0; j < bag; ++j) {
      const int64_t id = static_cast<int64_t>(ids[b * bag + j]);
      if (id == padding_idx) continue;
      Row<true>(t, id, o);
      ++n;
    }
    if (n == 0 || pool == Pool::kSum) continue;
    const float div = pool == Pool::kMean ? static_cast<float>(n) : std::sqrt(static_cast<float>(n));
    for (int64_t d = 0; d < dim; ++d) o[d] = o[d] / div;
  }
}

// ---- code paths per instruction set, chosen at run time ----------------------------------------------------
// Each path is Run compiled for one instruction set: `flatten` inlines Run and Row into the path's function, so
// the compiler vectorises them for that set. Vector and scalar float32 arithmetic round alike (no multiply-add is
// fused: -ffp-contract=off), so every path gives the same bits. QEMBED_ISA=avx512|avx2|x86-64 forces a path.
template <typename Id>
using Kernel = void (*)(const Table&, const Id*, int64_t, int64_t, Pool, int64_t, float*);

enum class Isa { kBaseline, kAvx2, kAvx512 };

#if defined(__x86_64__) && defined(__GNUC__)
#define QEMBED_PATH(name, isas)                                                                      \
  template <typename Id>                                                                               \
  __attribute__((target(isas), flatten)) void name(const Table& t, const Id* ids, int64_t bags, int64_t bag, \
                                                   Pool pool, int64_t padding_idx, float* out) {       \
    Run(t, ids, bags, bag, pool, padding_idx, out);                                                    \
  }
QEMBED_PATH(RunAvx512, "avx512f,avx512bw,avx512dq,avx512vl,avx2,popcnt")
QEMBED_PATH(RunAvx2, "avx2,popcnt")
#undef QEMBED_PATH

bool Supported(Isa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case Isa::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2");
    default:
      return true;
  }
}
#else
bool Supported(Isa isa) { return isa == Isa::kBaseline; }
#endif

const char* IsaName(Isa isa) {
  return isa == Isa::kAvx512 ? "avx512" : isa == Isa::kAvx2 ? "avx2" : "x86-64";
}

// The path this process uses: QEMBED_ISA's if set (an error if this CPU lacks it), else the widest it has.
// Empty message: chosen; else why QEMBED_ISA cannot be honoured.
struct Choice {
  Isa isa = Isa::kBaseline;
  std::string error;
};

Choice Choose() {
  Choice c;
  const char* forced = std::getenv("QEMBED_ISA");
  if (forced != nullptr && *forced != '\0') {
    const std::string want(forced);
    for (Isa isa : {Isa::kAvx512, Isa::kAvx2, Isa::kBaseline}) {
      if (want != IsaName(isa)) continue;
      c.isa = isa;
      if (!Supported(isa)) c.error = "QEMBED_ISA=" + want + " but this CPU lacks it; unset QEMBED_ISA";
      return c;
    }
    c.error = "QEMBED_ISA=" + want + " is not one of avx512, avx2, x86-64";
    return c;
  }
  for (Isa isa : {Isa::kAvx512, Isa::kAvx2}) {
    if (Supported(isa)) {
      c.isa = isa;
      return c;
    }
  }
  return c;
}

const Choice& Chosen() {
  static const Choice choice = Choose();
  return choice;
}

template <typename Id>
Kernel<Id> KernelFor(Isa isa) {
#if defined(__x86_64__) && defined(__GNUC__)
  if (isa == Isa::kAvx512) return RunAvx512<Id>;
  if (isa == Isa::kAvx2) return RunAvx2<Id>;
#endif
  return Run<Id>;
}

template <typename Id>
void Dispatch(const Table& t, const Id* ids, int64_t bags, int64_t bag, Pool pool, int64_t padding_idx, float* out) {
  const Choice& c = Chosen();
  PD_CHECK(c.error.empty(), "qembed_lookup: ", c.error);
  CheckIds(ids, bags * bag, t.rows);
  KernelFor<Id>(c.isa)(t, ids, bags, bag, pool, padding_idx, out);
}

std::vector<int64_t> OutShape(const std::vector<int64_t>& ids, int64_t dim, const std::string& pooling) {
  std::vector<int64_t> shape(ids);
  if (ParsePool(pooling) != Pool::kNone) {
    PD_CHECK(!shape.empty(), "qembed_lookup: pooled lookups need ids of rank >= 1 (the last axis is pooled)");
    shape.pop_back();
  }
  shape.push_back(dim);
  return shape;
}

}  // namespace

std::vector<paddle::Tensor> LookupForward(const paddle::Tensor& ids, const paddle::Tensor& codes,
                                          const paddle::Tensor& scale, const paddle::optional<paddle::Tensor>& offset,
                                          const paddle::optional<paddle::Tensor>& values, int64_t dim, int64_t packed,
                                          const std::string& pooling, int64_t padding_idx) {
  PD_CHECK(ids.is_cpu() && codes.is_cpu(), "qembed_lookup runs on the CPU only");
  PD_CHECK(codes.dtype() == paddle::DataType::INT8 && codes.dims().size() == 2, "qembed_lookup: Codes must be int8 [rows, width]");
  PD_CHECK(scale.dtype() == paddle::DataType::FLOAT32 || scale.dtype() == paddle::DataType::FLOAT16,
           "qembed_lookup: Scale must be float32 or float16");
  PD_CHECK(packed == 1 || packed == 2 || packed == 4, "qembed_lookup: packed must be 1, 2 or 4 codes per byte");
  const int64_t rows = codes.dims()[0];
  Table t{codes.data<int8_t>(), rows, codes.dims()[1], dim, packed, ColumnOf(scale), scale.numel() > 1, Column{},
          nullptr};
  PD_CHECK(t.width * packed >= dim && t.width * packed - dim < packed,
           "qembed_lookup: Codes rows hold ", t.width * packed, " codes, not dim=", dim);
  PD_CHECK(scale.numel() == 1 || scale.numel() == rows, "qembed_lookup: Scale needs 1 or one per row values");
  if (offset) {
    PD_CHECK(offset->dtype() == scale.dtype() && offset->numel() == rows,
             "qembed_lookup: Offset must have Scale's dtype and one value per row");
    t.offset = ColumnOf(*offset);
  }
  if (values) {
    PD_CHECK(values->dtype() == paddle::DataType::FLOAT32 && values->numel() == 256 * packed,
             "qembed_lookup: Values must be float32 with 256 x codes-per-byte entries");
    t.values = values->data<float>();
  }
  PD_CHECK(packed == 1 || t.values != nullptr, "qembed_lookup: packed codes need Values (their byte table)");
  const Pool pool = ParsePool(pooling);
  const std::vector<int64_t> id_shape = ids.shape();
  const int64_t bag = pool == Pool::kNone || id_shape.empty() ? 1 : id_shape.back();
  const int64_t bags = bag == 0 ? 0 : ids.numel() / bag;
  auto out = paddle::empty(OutShape(id_shape, dim, pooling), paddle::DataType::FLOAT32, paddle::CPUPlace());
  float* o = out.data<float>();
  if (pool != Pool::kNone && bag == 0) {
    std::memset(o, 0, sizeof(float) * out.numel());  // every bag is empty
  } else if (ids.dtype() == paddle::DataType::INT64) {
    Dispatch(t, ids.data<int64_t>(), bags, bag, pool, padding_idx, o);
  } else if (ids.dtype() == paddle::DataType::INT32) {
    Dispatch(t, ids.data<int32_t>(), bags, bag, pool, padding_idx, o);
  } else {
    PD_THROW("qembed_lookup: Ids must be int64 or int32");
  }
  return {out};
}

std::vector<std::vector<int64_t>> LookupInferShape(const std::vector<int64_t>& ids, const std::vector<int64_t>& codes,
                                                   const std::vector<int64_t>& scale,
                                                   const paddle::optional<std::vector<int64_t>>& offset,
                                                   const paddle::optional<std::vector<int64_t>>& values, int64_t dim,
                                                   int64_t packed, const std::string& pooling, int64_t padding_idx) {
  return {OutShape(ids, dim, pooling)};
}

std::vector<paddle::DataType> LookupInferDtype(const paddle::DataType& ids, const paddle::DataType& codes,
                                               const paddle::DataType& scale,
                                               const paddle::optional<paddle::DataType>& offset,
                                               const paddle::optional<paddle::DataType>& values) {
  return {paddle::DataType::FLOAT32};
}

// The code path this process runs ("avx512", "avx2" or "x86-64"), or why QEMBED_ISA cannot be honoured
// (qembed.ext.isa() reads it).
extern "C" __attribute__((visibility("default"))) const char* qembed_lookup_isa() {
  const Choice& c = Chosen();
  return c.error.empty() ? IsaName(c.isa) : c.error.c_str();
}

PD_BUILD_OP(qembed_lookup)
    .Inputs({"Ids", "Codes", "Scale", paddle::Optional("Offset"), paddle::Optional("Values")})
    .Outputs({"Out"})
    .Attrs({"dim: int64_t", "packed: int64_t", "pooling: std::string", "padding_idx: int64_t"})
    .SetKernelFn(PD_KERNEL(LookupForward))
    .SetInferShapeFn(PD_INFER_SHAPE(LookupInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(LookupInferDtype));
