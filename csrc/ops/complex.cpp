// Complex-number views and the FFT. The views change how a buffer is read,
// as torch's do, so writes through them reach the base (their scatter rule)
// and their strides are torch's:
//   view_as_real(x)     complex [..] -> real [.., 2]   (strides doubled, last 1)
//   view_as_complex(x)  real [.., 2] -> complex [..]   (strides halved)
//   conj_view(x)        torch's conjugate bit: reads conj(x), writes conj(v)
//   neg_view(x)         torch's negative bit:  reads -x, writes -v
// fft(x; type, lengths) is stablehlo.fft over the trailing len(lengths) dims
// (type FFT, IFFT, RFFT, IRFFT; IFFT/IRFFT divide by the product of lengths,
// as XLA defines them).
#include "lower/emitter.h"
#include "ops/registry.h"

namespace txc {
std::string complex_conj(LowerCtx& cx, const std::string& v, DType t, const Dims& d);  // ops/elementwise.cpp

namespace {

NodePtr make(const char* op, std::vector<NodePtr> xs, Attrs a = {}) { return make_node(op_id(op), std::move(xs), std::move(a)); }

// real [.., 2] -> complex [..] (an IR value, not a view).
std::string pack_complex(LowerCtx& cx, const std::string& v, DType real, const Dims& in, DType out_t) {
  Dims part = in;
  part.back() = 1;
  Dims out(in.begin(), in.end() - 1);
  auto half = [&](int64_t i) {
    Dims start(in.size(), 0), limit = in, stride(in.size(), 1);
    start.back() = i;
    limit.back() = i + 1;
    auto s = cx.op("stablehlo.slice", {v}, {LowerCtx::type(real, in)}, LowerCtx::type(real, part),
                   "start_indices = " + LowerCtx::i64_array(start) + ", limit_indices = " + LowerCtx::i64_array(limit) +
                       ", strides = " + LowerCtx::i64_array(stride));
    return cx.reshape(s, real, part, out);
  };
  auto re = half(0), im = half(1);
  auto pty = LowerCtx::type(real, out);
  return cx.op("stablehlo.complex", {re, im}, {pty, pty}, LowerCtx::type(out_t, out));
}

// complex [..] -> real [.., 2].
std::string unpack_complex(LowerCtx& cx, const std::string& v, DType t, const Dims& in) {
  DType real = real_part_dtype(t);
  Dims part = in;
  part.push_back(1);
  Dims out = in;
  out.push_back(2);
  auto ty = LowerCtx::type(t, in), pty = LowerCtx::type(real, in);
  auto re = cx.reshape(cx.op("stablehlo.real", {v}, {ty}, pty), real, in, part);
  auto im = cx.reshape(cx.op("stablehlo.imag", {v}, {ty}, pty), real, in, part);
  auto partty = LowerCtx::type(real, part);
  return cx.op("stablehlo.concatenate", {re, im}, {partty, partty}, LowerCtx::type(real, out),
               "dimension = " + std::to_string(in.size()) + " : i64");
}

TXC_OP("view_as_real", 1,
       [](Node& n) {
         const Node& x = *n.operands[0];
         if (!is_complex(x.dtype))
           op_error(n, std::string("view_as_real is only supported for complex tensors, got ") + dtype_name(x.dtype));
         n.dtype = real_part_dtype(x.dtype);
         n.dims = x.dims;
         n.dims.push_back(2);
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         return unpack_complex(cx, cx.in(n, 0), x.dtype, x.dims);
       },
       [](const Node& view, NodePtr parent, NodePtr value) { return make("view_as_complex", {value}); },
       [](const Node& n, Dims& strides, int64_t& offset) {
         for (auto& s : strides) s *= 2;
         strides.push_back(1);
         offset *= 2;
         return true;
       });

TXC_OP("view_as_complex", 1,
       [](Node& n) {
         const Node& x = *n.operands[0];
         if (x.dtype != DType::F32 && x.dtype != DType::F64)
           op_error(n, std::string("view_as_complex is only supported for float and double tensors, got ") +
                           dtype_name(x.dtype));
         if (x.rank() == 0 || x.dims.back() != 2) op_error(n, "Tensor must have a last dimension of size 2");
         n.dtype = complex_dtype_of(x.dtype);
         n.dims.assign(x.dims.begin(), x.dims.end() - 1);
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         return pack_complex(cx, cx.in(n, 0), x.dtype, x.dims, n.dtype);
       },
       [](const Node& view, NodePtr parent, NodePtr value) { return make("view_as_real", {value}); },
       [](const Node& n, Dims& strides, int64_t& offset) {
         // torch requires the last stride 1 and the others (and the offset) even.
         if (strides.back() != 1 || offset % 2) return false;
         strides.pop_back();
         for (auto& s : strides) {
           if (s % 2) return false;
           s /= 2;
         }
         offset /= 2;
         return true;
       });

void same_infer(Node& n) {
  n.dtype = n.operands[0]->dtype;
  n.dims = n.operands[0]->dims;
}
bool same_strides(const Node&, Dims&, int64_t&) { return true; }

TXC_OP("conj_view", 1, same_infer,
       [](LowerCtx& cx, const Node& n) { return complex_conj(cx, cx.in(n, 0), n.dtype, n.dims); },
       [](const Node& view, NodePtr parent, NodePtr value) { return make("conj", {value}); }, same_strides);

TXC_OP("neg_view", 1,
       [](Node& n) {
         if (is_bool(n.operands[0]->dtype))
           op_error(n, "negation is not defined for bool tensors (as torch: \"neg\" not implemented for 'Bool')");
         same_infer(n);
       },
       [](LowerCtx& cx, const Node& n) { return cx.unary("stablehlo.negate", cx.in(n, 0), n.dtype, n.dims); },
       [](const Node& view, NodePtr parent, NodePtr value) { return make("neg", {value}); }, same_strides);

// fft(x; type, lengths): type is "FFT", "IFFT", "RFFT" or "IRFFT".
TXC_OP("fft", 1,
       [](Node& n) {
         const Node& x = *n.operands[0];
         const std::string& type = n.attr_str(0);
         const Dims& len = n.attr_dims(1);
         if (len.empty() || len.size() > 3 || int64_t(len.size()) > x.rank())
           op_error(n, "expects 1 to 3 transformed dims, at most the input's rank " + std::to_string(x.rank()));
         size_t lead = x.dims.size() - len.size();
         n.dims = x.dims;
         if (type == "FFT" || type == "IFFT") {
           if (!is_complex(x.dtype)) op_error(n, std::string(type) + " expects a complex input, got " + dtype_name(x.dtype));
           n.dtype = x.dtype;
           for (size_t i = 0; i < len.size(); ++i)
             if (x.dims[lead + i] != len[i]) op_error(n, "input dims " + dims_str(x.dims) + " differ from the lengths " + dims_str(len));
         } else if (type == "RFFT") {
           if (x.dtype != DType::F32 && x.dtype != DType::F64)
             op_error(n, std::string("RFFT expects a float32 or float64 input, got ") + dtype_name(x.dtype));
           n.dtype = complex_dtype_of(x.dtype);
           for (size_t i = 0; i < len.size(); ++i)
             if (x.dims[lead + i] != len[i]) op_error(n, "input dims " + dims_str(x.dims) + " differ from the lengths " + dims_str(len));
           n.dims.back() = len.back() / 2 + 1;
         } else if (type == "IRFFT") {
           if (!is_complex(x.dtype)) op_error(n, std::string("IRFFT expects a complex input, got ") + dtype_name(x.dtype));
           n.dtype = real_part_dtype(x.dtype);
           for (size_t i = 0; i + 1 < len.size(); ++i)
             if (x.dims[lead + i] != len[i]) op_error(n, "input dims " + dims_str(x.dims) + " differ from the lengths " + dims_str(len));
           if (x.dims.back() != len.back() / 2 + 1)
             op_error(n, "IRFFT of length " + std::to_string(len.back()) + " expects a last dim of " +
                             std::to_string(len.back() / 2 + 1) + ", got " + std::to_string(x.dims.back()));
           n.dims.back() = len.back();
         } else {
           op_error(n, "unknown fft type '" + type + "' (FFT, IFFT, RFFT or IRFFT)");
         }
       },
       [](LowerCtx& cx, const Node& n) {
         const Node& x = *n.operands[0];
         return cx.op("stablehlo.fft", {cx.in(n, 0)}, {LowerCtx::type(x)}, LowerCtx::type(n),
                      "fft_type = #stablehlo<fft_type " + n.attr_str(0) + ">, fft_length = " +
                          LowerCtx::i64_array(n.attr_dims(1)));
       });

}  // namespace
}  // namespace txc
