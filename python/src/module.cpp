// flashattn._flashattn: the nanobind extension behind the `flashattn` Python package.
//
// Zero-copy: every array arrives through nanobind's ndarray (DLPack or the buffer protocol) and is
// handed to the C++ API as a non-owning flashattn::Tensor with the caller's strides. Outputs are
// allocated by the Python layer (python/flashattn/_api.py, torch.py) and written in place here.
//
// The binding checks only what the C++ API cannot see (Python-side dtype/device descriptors, the
// number of dimensions, the device ordinal, cu_seqlens arrays); everything else — shapes, strides,
// head counts, option values — is checked once by the library (src/core), whose flashattn::Error
// becomes ValueError or TypeError here. Nothing is written when an error is raised.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cctype>
#include <cstdint>
#include <optional>
#include <string>

#include "flashattn/flashattn.hpp"
#include "flashattn/kvcache.hpp"

namespace nb = nanobind;
namespace fa = flashattn;

namespace {

using InArray = nb::ndarray<nb::ro>;  // read-only is fine for inputs
using OutArray = nb::ndarray<>;       // outputs must be writable

// ---- errors --------------------------------------------------------------------------------
// The binding's own rejections: raised as Python exceptions directly.
struct TypeErr : std::runtime_error {
  using std::runtime_error::runtime_error;
};
struct ValueErr : std::runtime_error {
  using std::runtime_error::runtime_error;
};


// ---- descriptors ---------------------------------------------------------------------------
std::string dtype_name(nb::dlpack::dtype dt) {
  using C = nb::dlpack::dtype_code;
  std::string base;
  switch (C(dt.code)) {
    case C::Int: base = "int"; break;
    case C::UInt: base = "uint"; break;
    case C::Float: base = "float"; break;
    case C::Bfloat: base = "bfloat"; break;
    case C::Complex: base = "complex"; break;
    case C::Bool: return "bool";
    default: base = "dlpack_code" + std::to_string(int(dt.code)) + "_"; break;
  }
  std::string s = base + std::to_string(int(dt.bits));
  if (dt.lanes != 1) s += "x" + std::to_string(int(dt.lanes));
  return s;
}

std::string device_name(int type, int id) {
  switch (type) {
    case nb::device::cpu::value: return "cpu";
    case nb::device::cuda::value: return "cuda:" + std::to_string(id);
    case nb::device::cuda_host::value: return "cuda_host (pinned host memory)";
    case nb::device::cuda_managed::value: return "cuda_managed";
    case nb::device::rocm::value: return "rocm:" + std::to_string(id);
    case nb::device::metal::value: return "metal";
    default: return "dlpack_device" + std::to_string(type);
  }
}

template <class A>
std::string shape_string(const A& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) {
    if (i) s += ", ";
    s += std::to_string(a.shape(i));
  }
  if (a.ndim() == 1) s += ",";
  return s + ")";
}

template <class A>
fa::DType to_dtype(const char* name, const A& a, bool uint16_is_bf16) {
  const nb::dlpack::dtype dt = a.dtype();
  using C = nb::dlpack::dtype_code;
  if (dt.lanes == 1 && dt.bits == 32 && dt.code == uint8_t(C::Float)) return fa::DType::f32;
  if (dt.lanes == 1 && dt.bits == 16 && dt.code == uint8_t(C::Float)) return fa::DType::f16;
  if (dt.lanes == 1 && dt.bits == 16 && dt.code == uint8_t(C::Bfloat)) return fa::DType::bf16;
  if (uint16_is_bf16 && dt.lanes == 1 && dt.bits == 16 && dt.code == uint8_t(C::UInt))
    return fa::DType::bf16;
  throw TypeErr(std::string(name) + ": expected dtype float32, float16 or bfloat16, got " +
                dtype_name(dt));
}

struct Where {
  fa::Device device;
  int id;
};

template <class A>
Where to_device(const char* name, const A& a) {
  if (a.device_type() == nb::device::cpu::value) return {fa::Device::cpu, 0};
  if (a.device_type() == nb::device::cuda::value) return {fa::Device::cuda, a.device_id()};
  throw TypeErr(std::string(name) + ": expected a cpu or cuda array, got one on " +
                device_name(a.device_type(), a.device_id()));
}

// A (batch, seqlen, heads, head_dim) array as a non-owning Tensor.
template <class A>
fa::Tensor to_tensor(const char* name, const A& a, bool uint16_is_bf16, const Where* ref,
                     const char* ref_name) {
  if (a.ndim() != 4)
    throw ValueErr(std::string(name) +
                   ": expected 4 dimensions (batch, seqlen, heads, head_dim), got shape " +
                   shape_string(a));
  fa::Tensor t;
  t.dtype = to_dtype(name, a, uint16_is_bf16);
  const Where w = to_device(name, a);
  if (ref && (w.device != ref->device || w.id != ref->id))
    throw TypeErr(std::string(name) + ": expected an array on the same device as " + ref_name +
                  " (" + device_name(ref->device == fa::Device::cpu ? 1 : 2, ref->id) +
                  "), got one on " + device_name(a.device_type(), a.device_id()));
  t.device = w.device;
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  for (int i = 0; i < 4; ++i) {
    t.shape[i] = int64_t(a.shape(i));
    t.strides[i] = a.stride(i);
  }
  return t;
}

// The fp32 log-sum-exp, (batch, heads, seqlen_q) in Python, (batch, heads, seqlen_q, 1) in C++.
template <class A>
fa::Tensor to_lse(const char* name, const A& a, const Where& ref) {
  if (a.ndim() != 3)
    throw ValueErr(std::string(name) + ": expected 3 dimensions (batch, heads, seqlen_q), got shape " +
                   shape_string(a));
  const nb::dlpack::dtype dt = a.dtype();
  if (!(dt.lanes == 1 && dt.bits == 32 && dt.code == uint8_t(nb::dlpack::dtype_code::Float)))
    throw TypeErr(std::string(name) + ": expected dtype float32, got " + dtype_name(dt));
  const Where w = to_device(name, a);
  if (w.device != ref.device || w.id != ref.id)
    throw TypeErr(std::string(name) + ": expected an array on the same device as q (" +
                  device_name(ref.device == fa::Device::cpu ? 1 : 2, ref.id) + "), got one on " +
                  device_name(a.device_type(), a.device_id()));
  fa::Tensor t;
  t.dtype = fa::DType::f32;
  t.device = w.device;
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  for (int i = 0; i < 3; ++i) {
    t.shape[i] = int64_t(a.shape(i));
    t.strides[i] = a.stride(i);
  }
  t.shape[3] = 1;
  t.strides[3] = 1;
  return t;
}

// An int32 array of `ndim` dimensions with a contiguous last dimension, on q's device (host memory
// for the CPU backend): seqused_k, cache_seqlens and cache_batch_idx (batch), block_table (batch, max_pages).
const int32_t* to_int32(const char* name, const InArray& a, size_t ndim, const Where& ref, const char* layout) {
  const nb::dlpack::dtype dt = a.dtype();
  if (!(dt.lanes == 1 && dt.bits == 32 && dt.code == uint8_t(nb::dlpack::dtype_code::Int)))
    throw TypeErr(std::string(name) + ": expected dtype int32, got " + dtype_name(dt));
  if (a.ndim() != ndim)
    throw ValueErr(std::string(name) + ": expected " + std::to_string(ndim) + " dimension" + (ndim > 1 ? "s " : " ") +
                   layout + ", got shape " + shape_string(a));
  if (a.shape(ndim - 1) > 1 && a.stride(ndim - 1) != 1)
    throw ValueErr(std::string(name) + ": expected a contiguous last dimension, got stride " +
                   std::to_string(a.stride(ndim - 1)));
  const Where w = to_device(name, a);
  if (w.device != ref.device || w.id != ref.id)
    throw TypeErr(std::string(name) + ": expected an array on the same device as q (" +
                  device_name(ref.device == fa::Device::cpu ? 1 : 2, ref.id) +
                  (ref.device == fa::Device::cpu ? ", host memory for the CPU backend"
                                                 : ", device memory for the CUDA backend") +
                  "), got one on " + device_name(a.device_type(), a.device_id()));
  return static_cast<const int32_t*>(a.data());
}

// int32 prefix sums (batch + 1 entries), in the memory the backend reads.
const int32_t* to_cu_seqlens(const char* name, const std::optional<InArray>& a, const Where& ref) {
  if (!a) return nullptr;
  const int32_t* p = to_int32(name, *a, 1, ref, "(batch + 1 prefix sums)");
  if (a->shape(0) < 2)
    throw ValueErr(std::string(name) + ": expected at least 2 entries (batch + 1), got " +
                   std::to_string(a->shape(0)));
  return p;
}

// A rotary table (seqlen_rotary, rotary_dim / 2) as the (1, seqlen_rotary, 1, rotary_dim / 2) Tensor
// the library takes.
fa::Tensor to_rotary(const char* name, const InArray& a, const Where& ref) {
  if (a.ndim() != 2)
    throw ValueErr(std::string(name) + ": expected 2 dimensions (seqlen_rotary, rotary_dim / 2), got shape " +
                   shape_string(a));
  fa::Tensor t;
  t.dtype = to_dtype(name, a, false);
  const Where w = to_device(name, a);
  if (w.device != ref.device || w.id != ref.id)
    throw TypeErr(std::string(name) + ": expected an array on the same device as q, got one on " +
                  device_name(a.device_type(), a.device_id()));
  t.device = w.device;
  t.data = const_cast<void*>(static_cast<const void*>(a.data()));
  t.shape = {1, int64_t(a.shape(0)), 1, int64_t(a.shape(1))};
  t.strides = {0, a.stride(0), 0, a.shape(1) > 1 ? a.stride(1) : 1};
  return t;
}

fa::Algorithm to_algorithm(const std::string& s) {
  if (s == "flash") return fa::Algorithm::flash;
  if (s == "standard") return fa::Algorithm::standard;
  throw ValueErr("algorithm: expected 'flash' or 'standard', got '" + s + "'");
}

struct PyOptions {
  double scale = 0;
  bool causal = false;
  int window_left = -1, window_right = -1;
  double softcap = 0;
  std::optional<InArray> cu_seqlens_q, cu_seqlens_k;
  int max_seqlen_q = 0, max_seqlen_k = 0;
  std::optional<InArray> seqused_k;
  std::string algorithm = "flash";
  bool deterministic = false;
  uintptr_t stream = 0;
};

// q_batch: q's shape[0] (the number of sequences without cu_seqlens).
fa::Options to_options(const PyOptions& o, const Where& ref, int64_t q_batch) {
  fa::Options opt;
  opt.scale = float(o.scale);
  opt.causal = o.causal;
  opt.window_left = o.window_left;
  opt.window_right = o.window_right;
  opt.softcap = float(o.softcap);
  opt.cu_seqlens_q = to_cu_seqlens("cu_seqlens_q", o.cu_seqlens_q, ref);
  opt.cu_seqlens_k = to_cu_seqlens("cu_seqlens_k", o.cu_seqlens_k, ref);
  if (o.cu_seqlens_q && o.cu_seqlens_k && o.cu_seqlens_q->shape(0) != o.cu_seqlens_k->shape(0))
    throw ValueErr("cu_seqlens_k: expected as many entries as cu_seqlens_q (" +
                   std::to_string(o.cu_seqlens_q->shape(0)) + "), got " +
                   std::to_string(o.cu_seqlens_k->shape(0)));
  opt.varlen_batch = o.cu_seqlens_q ? int(o.cu_seqlens_q->shape(0)) - 1 : 0;
  opt.max_seqlen_q = o.max_seqlen_q;
  opt.max_seqlen_k = o.max_seqlen_k;
  if (o.seqused_k) {  // one entry per sequence; the library checks the values
    const int64_t batch = o.cu_seqlens_q ? int64_t(opt.varlen_batch) : q_batch;
    opt.seqused_k = to_int32("seqused_k", *o.seqused_k, 1, ref, "(batch)");
    if (int64_t(o.seqused_k->shape(0)) != batch)
      throw ValueErr("seqused_k: expected " + std::to_string(batch) + " entries (one per sequence), got " +
                     std::to_string(o.seqused_k->shape(0)));
  }
  opt.algorithm = to_algorithm(o.algorithm);
  opt.deterministic = o.deterministic;
  opt.stream = reinterpret_cast<void*>(o.stream);
  return opt;
}

void forward(const InArray& q, const InArray& k, const InArray& v, const OutArray& out,
             const std::optional<OutArray>& lse, bool uint16_is_bf16, const PyOptions& o) {
  const fa::Tensor tq = to_tensor("q", q, uint16_is_bf16, nullptr, nullptr);
  const Where ref{tq.device, tq.device == fa::Device::cuda ? q.device_id() : 0};
  const fa::Tensor tk = to_tensor("k", k, uint16_is_bf16, &ref, "q");
  const fa::Tensor tv = to_tensor("v", v, uint16_is_bf16, &ref, "q");
  const fa::Tensor to = to_tensor("out", out, uint16_is_bf16, &ref, "q");
  std::optional<fa::Tensor> tl;
  if (lse) tl = to_lse("lse", *lse, ref);
  const fa::Options opt = to_options(o, ref, tq.shape[0]);
  nb::gil_scoped_release release;
  fa::forward(tq, tk, tv, to, tl ? &*tl : nullptr, opt);
}

void backward(const InArray& q, const InArray& k, const InArray& v, const InArray& out,
              const InArray& dout, const InArray& lse, const OutArray& dq, const OutArray& dk,
              const OutArray& dv, bool uint16_is_bf16, const PyOptions& o) {
  const fa::Tensor tq = to_tensor("q", q, uint16_is_bf16, nullptr, nullptr);
  const Where ref{tq.device, tq.device == fa::Device::cuda ? q.device_id() : 0};
  const fa::Tensor tk = to_tensor("k", k, uint16_is_bf16, &ref, "q");
  const fa::Tensor tv = to_tensor("v", v, uint16_is_bf16, &ref, "q");
  const fa::Tensor to = to_tensor("out", out, uint16_is_bf16, &ref, "q");
  const fa::Tensor tdo = to_tensor("dout", dout, uint16_is_bf16, &ref, "q");
  const fa::Tensor tl = to_lse("lse", lse, ref);
  const fa::Tensor tdq = to_tensor("dq", dq, uint16_is_bf16, &ref, "q");
  const fa::Tensor tdk = to_tensor("dk", dk, uint16_is_bf16, &ref, "q");
  const fa::Tensor tdv = to_tensor("dv", dv, uint16_is_bf16, &ref, "q");
  const fa::Options opt = to_options(o, ref, tq.shape[0]);
  nb::gil_scoped_release release;
  fa::backward(tq, tk, tv, to, tdo, tl, tdq, tdk, tdv, opt);
}

void merge_partial(const OutArray& out_acc, const OutArray& lse_acc, const InArray& part, const InArray& lse_part,
                   bool uint16_is_bf16, uintptr_t stream) {
  const fa::Tensor to = to_tensor("out_acc", out_acc, uint16_is_bf16, nullptr, nullptr);
  const Where ref{to.device, to.device == fa::Device::cuda ? out_acc.device_id() : 0};
  const fa::Tensor tp = to_tensor("part", part, uint16_is_bf16, &ref, "out_acc");
  const fa::Tensor tl = to_lse("lse_acc", lse_acc, ref);
  const fa::Tensor tlp = to_lse("lse_part", lse_part, ref);
  nb::gil_scoped_release release;
  fa::merge_partial(to, tl, tp, tlp, reinterpret_cast<void*>(stream));
}

}  // namespace

NB_MODULE(_flashattn, m) {
  m.doc() = "flashattn C++ core (internal; use the `flashattn` package)";
#ifdef FLASHATTN_VERSION
  m.attr("__version__") = FLASHATTN_VERSION;
#endif

  // A valid call that no kernel of this build and device takes (Error::Kind::unsupported): a
  // ValueError, so callers that catch bad input catch it too, with its own class to tell it apart.
  static PyObject* unsupported_error =
      PyErr_NewExceptionWithDoc("flashattn.UnsupportedError",
                                "A valid call that no kernel of this build and device takes (e.g. float32 with the "
                                "flash algorithm on CUDA); algorithm='standard' covers every valid call.",
                                PyExc_ValueError, nullptr);
  m.attr("UnsupportedError") = nb::borrow(unsupported_error);
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const TypeErr& e) {
      PyErr_SetString(PyExc_TypeError, e.what());
    } catch (const ValueErr& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const fa::Error& e) {
      PyObject* type = e.kind() == fa::Error::Kind::type          ? PyExc_TypeError
                       : e.kind() == fa::Error::Kind::unsupported ? unsupported_error
                                                                  : PyExc_ValueError;
      PyErr_SetString(type, e.what());
    }
  });

  // Options as keyword-only arguments (defaults as in flashattn::Options).
  auto opts = [](double scale, bool causal, int window_left, int window_right, double softcap,
                 std::optional<InArray> cu_seqlens_q, std::optional<InArray> cu_seqlens_k,
                 int max_seqlen_q, int max_seqlen_k, std::optional<InArray> seqused_k, std::string algorithm,
                 bool deterministic, uintptr_t stream) {
    PyOptions o;
    o.scale = scale;
    o.causal = causal;
    o.window_left = window_left;
    o.window_right = window_right;
    o.softcap = softcap;
    o.cu_seqlens_q = std::move(cu_seqlens_q);
    o.cu_seqlens_k = std::move(cu_seqlens_k);
    o.max_seqlen_q = max_seqlen_q;
    o.max_seqlen_k = max_seqlen_k;
    o.seqused_k = std::move(seqused_k);
    o.algorithm = std::move(algorithm);
    o.deterministic = deterministic;
    o.stream = stream;
    return o;
  };

  m.def(
      "forward",
      [opts](const InArray& q, const InArray& k, const InArray& v, const OutArray& out,
             const std::optional<OutArray>& lse, double scale, bool causal, int window_left,
             int window_right, double softcap, std::optional<InArray> cu_seqlens_q,
             std::optional<InArray> cu_seqlens_k, int max_seqlen_q, int max_seqlen_k,
             std::optional<InArray> seqused_k, std::string algorithm, bool deterministic, uintptr_t stream,
             bool uint16_is_bf16) {
        forward(q, k, v, out, lse, uint16_is_bf16,
                opts(scale, causal, window_left, window_right, softcap, std::move(cu_seqlens_q),
                     std::move(cu_seqlens_k), max_seqlen_q, max_seqlen_k, std::move(seqused_k),
                     std::move(algorithm), deterministic, stream));
      },
      nb::arg("q").noconvert(), nb::arg("k").noconvert(), nb::arg("v").noconvert(),
      nb::arg("out").noconvert(), nb::arg("lse").noconvert().none(), nb::kw_only(),
      nb::arg("scale") = 0.0, nb::arg("causal") = false, nb::arg("window_left") = -1,
      nb::arg("window_right") = -1, nb::arg("softcap") = 0.0,
      nb::arg("cu_seqlens_q").noconvert().none() = nb::none(),
      nb::arg("cu_seqlens_k").noconvert().none() = nb::none(), nb::arg("max_seqlen_q") = 0,
      nb::arg("max_seqlen_k") = 0, nb::arg("seqused_k").noconvert().none() = nb::none(),
      nb::arg("algorithm") = "flash", nb::arg("deterministic") = false, nb::arg("stream") = 0,
      nb::arg("uint16_is_bf16") = false,
      "Writes out (and lse when given) in place. Arrays (B, S, H, D); lse (B, H, Sq) float32. seqused_k: "
      "None, or int32 (batch,) on q's device: sequence b attends to its first seqused_k[b] keys only (the "
      "rest is padding, never read; causal and window align to seqused_k[b]). The CPU backend only: CUDA "
      "raises UnsupportedError.");

  m.def(
      "backward",
      [opts](const InArray& q, const InArray& k, const InArray& v, const InArray& out,
             const InArray& dout, const InArray& lse, const OutArray& dq, const OutArray& dk,
             const OutArray& dv, double scale, bool causal, int window_left, int window_right,
             double softcap, std::optional<InArray> cu_seqlens_q,
             std::optional<InArray> cu_seqlens_k, int max_seqlen_q, int max_seqlen_k,
             std::optional<InArray> seqused_k, std::string algorithm, bool deterministic, uintptr_t stream,
             bool uint16_is_bf16) {
        backward(q, k, v, out, dout, lse, dq, dk, dv, uint16_is_bf16,
                 opts(scale, causal, window_left, window_right, softcap, std::move(cu_seqlens_q),
                      std::move(cu_seqlens_k), max_seqlen_q, max_seqlen_k, std::move(seqused_k),
                      std::move(algorithm), deterministic, stream));
      },
      nb::arg("q").noconvert(), nb::arg("k").noconvert(), nb::arg("v").noconvert(),
      nb::arg("out").noconvert(), nb::arg("dout").noconvert(), nb::arg("lse").noconvert(),
      nb::arg("dq").noconvert(), nb::arg("dk").noconvert(), nb::arg("dv").noconvert(),
      nb::kw_only(), nb::arg("scale") = 0.0, nb::arg("causal") = false,
      nb::arg("window_left") = -1, nb::arg("window_right") = -1, nb::arg("softcap") = 0.0,
      nb::arg("cu_seqlens_q").noconvert().none() = nb::none(),
      nb::arg("cu_seqlens_k").noconvert().none() = nb::none(), nb::arg("max_seqlen_q") = 0,
      nb::arg("max_seqlen_k") = 0, nb::arg("seqused_k").noconvert().none() = nb::none(),
      nb::arg("algorithm") = "flash", nb::arg("deterministic") = false, nb::arg("stream") = 0,
      nb::arg("uint16_is_bf16") = false,
      "Writes dq, dk, dv in place. seqused_k: as forward's (the same array the forward took); the dk, dv rows "
      "past seqused_k[b] are written as zeros.");
  m.def(
      "forward_kvcache",
      [](const InArray& q, const OutArray& k_cache, const OutArray& v_cache, const OutArray& out,
         const std::optional<OutArray>& lse, const InArray& cache_seqlens, const std::optional<InArray>& k,
         const std::optional<InArray>& v, const std::optional<InArray>& rotary_cos,
         const std::optional<InArray>& rotary_sin, const std::optional<InArray>& cache_batch_idx,
         const std::optional<InArray>& block_table, double scale, bool causal, int window_left,
         int window_right, double softcap, bool rotary_interleaved, int num_splits, uintptr_t stream,
         bool check_on_device, bool uint16_is_bf16) {
        const fa::Tensor tq = to_tensor("q", q, uint16_is_bf16, nullptr, nullptr);
        const Where w{tq.device, q.device_id()};
        fa::KVCache c;
        c.k = to_tensor("k_cache", k_cache, uint16_is_bf16, &w, "q");
        c.v = to_tensor("v_cache", v_cache, uint16_is_bf16, &w, "q");
        c.seqlens = to_int32("cache_seqlens", cache_seqlens, 1, w, "(batch)");
        if (cache_batch_idx) c.batch_idx = to_int32("cache_batch_idx", *cache_batch_idx, 1, w, "(batch)");
        if (block_table) {
          c.block_table = to_int32("block_table", *block_table, 2, w, "(batch, max_pages)");
          c.max_pages = int64_t(block_table->shape(1));
          c.block_table_stride = block_table->shape(0) > 1 ? block_table->stride(0) : c.max_pages;
          if (int64_t(block_table->shape(0)) != tq.shape[0])
            throw ValueErr("block_table: expected " + std::to_string(tq.shape[0]) + " rows (q's batch), got shape " +
                           shape_string(*block_table));
        }
        if (int64_t(cache_seqlens.shape(0)) != tq.shape[0])
          throw ValueErr("cache_seqlens: expected " + std::to_string(tq.shape[0]) + " entries (q's batch), got shape " +
                         shape_string(cache_seqlens));
        if (cache_batch_idx && int64_t(cache_batch_idx->shape(0)) != tq.shape[0])
          throw ValueErr("cache_batch_idx: expected " + std::to_string(tq.shape[0]) + " entries (q's batch), got shape " +
                         shape_string(*cache_batch_idx));
        fa::KVCacheOptions o;
        o.scale = float(scale);
        o.causal = causal;
        o.window_left = window_left;
        o.window_right = window_right;
        o.softcap = float(softcap);
        o.rotary_interleaved = rotary_interleaved;
        o.num_splits = num_splits;
        o.stream = reinterpret_cast<void*>(stream);
        o.check_on_device = check_on_device;
        fa::Tensor tk, tv, tcos, tsin, tlse;
        if (k.has_value() != v.has_value()) throw ValueErr(k ? "v: expected it with k" : "k: expected it with v");
        if (k) {
          tk = to_tensor("k", *k, uint16_is_bf16, &w, "q");
          tv = to_tensor("v", *v, uint16_is_bf16, &w, "q");
          o.k_new = &tk;
          o.v_new = &tv;
        }
        if (rotary_cos.has_value() != rotary_sin.has_value())
          throw ValueErr(rotary_cos ? "rotary_sin: expected it with rotary_cos" : "rotary_cos: expected it with rotary_sin");
        if (rotary_cos) {
          tcos = to_rotary("rotary_cos", *rotary_cos, w);
          tsin = to_rotary("rotary_sin", *rotary_sin, w);
          o.rotary_cos = &tcos;
          o.rotary_sin = &tsin;
        }
        const fa::Tensor tout = to_tensor("out", out, uint16_is_bf16, &w, "q");
        if (lse) tlse = to_lse("softmax_lse", *lse, w);
        nb::gil_scoped_release release;
        fa::forward_kvcache(tq, c, tout, lse ? &tlse : nullptr, o);
      },
      nb::arg("q").noconvert(), nb::arg("k_cache").noconvert(), nb::arg("v_cache").noconvert(),
      nb::arg("out").noconvert(), nb::arg("lse").noconvert().none(), nb::kw_only(),
      nb::arg("cache_seqlens").noconvert(), nb::arg("k").noconvert().none() = nb::none(),
      nb::arg("v").noconvert().none() = nb::none(), nb::arg("rotary_cos").noconvert().none() = nb::none(),
      nb::arg("rotary_sin").noconvert().none() = nb::none(),
      nb::arg("cache_batch_idx").noconvert().none() = nb::none(),
      nb::arg("block_table").noconvert().none() = nb::none(), nb::arg("scale") = 0.0, nb::arg("causal") = false,
      nb::arg("window_left") = -1, nb::arg("window_right") = -1, nb::arg("softcap") = 0.0,
      nb::arg("rotary_interleaved") = true, nb::arg("num_splits") = 0, nb::arg("stream") = 0,
      nb::arg("check_on_device") = false, nb::arg("uint16_is_bf16") = false,
      "Appends k/v to the cache in place (rotated with the tables), then writes out (and lse) in place: "
      "attention of q over each sequence's first cache_seqlens[b] + S_new cached tokens. check_on_device "
      "(CUDA): lengths and pages checked by a kernel (no synchronization; out-of-range values write nothing "
      "and raise nothing) instead of on the host.");

  m.def("merge_partial", &merge_partial, nb::arg("out_acc").noconvert(), nb::arg("lse_acc").noconvert(),
        nb::arg("part").noconvert(), nb::arg("lse_part").noconvert(), nb::arg("uint16_is_bf16") = false,
        nb::arg("stream") = 0,
        "Merges (part, lse_part) into the float32 accumulator (out_acc, lse_acc) in place: the union of "
        "two partial attention results over disjoint keys. Arrays (B, S, H, D); LSEs (B, H, S) float32.");
  m.def("cuda_available", &fa::cuda_available,
        "True when this build holds the CUDA backend and a CUDA device is present.");
  m.def("build_info", &fa::build_info, "What this build holds (backends, architectures).");
  m.def("last_kernel_path", [] { return std::string(fa::last_kernel_path()); },
        "The kernel path of this thread's last call that returned normally: 'cpu.flash', 'cpu.standard', "
        "'cuda.sm90', 'cuda.sm80' or 'cuda.standard' ('' before the first).");
}
