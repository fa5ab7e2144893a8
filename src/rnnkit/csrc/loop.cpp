// The compiled time loop of rnnkit (rnnkit/native.py builds and loads it): the forward and
// the explicit backward through time of the simple cell, the LSTM and the GRU, registered
// as the torch operators rnnkit_native::*.
//
// Each fused pass over one row is its own function with __restrict parameters: that is
// what lets GCC vectorise it (inside the lambdas, with derived pointers, it gives up).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "gemm.h"
#include "gru.h"
#include "lstm.h"
#include "rnn.h"
#include "steps.h"

namespace {

// Step buffers (xp, caches) are (T, B, width), or (N, width) packed when offsets are given;
// states are always (T + 1, B, H) and d_out (T, B, H).
int64_t steps_of(const Tensor& buf, const std::optional<Tensor>& offsets) {
  return offsets.has_value() ? offsets->size(0) - 1 : buf.size(0);
}

void check_buf(const Tensor& t, const char* name, const Steps& S, int64_t width) {
  TORCH_CHECK(t.device().is_cpu() && t.is_contiguous(), name, " must be contiguous on the CPU");
  TORCH_CHECK(t.numel() == S.rows() * width, name, " has ", t.numel(), " elements, expected ",
              S.rows() * width);
}

Tensor step_buffer(const Steps& S, int64_t width, const Tensor& like) {
  if (S.packed()) return at::empty({S.rows(), width}, like.options());
  return at::empty({(int64_t)S.act.size(), S.B, width}, like.options());
}

Tensor scratch(const Steps& S, int64_t width, const Tensor& like) {
  return at::empty({1, S.B, width}, like.options());  // one step, reused (no save)
}

const bool* mask_of(const std::optional<Tensor>& mask, int64_t T, int64_t B) {
  if (!mask.has_value()) return nullptr;
  check(*mask, "mask", 2);
  TORCH_CHECK(mask->scalar_type() == at::kBool && mask->size(0) == T && mask->size(1) == B,
              "mask must be (T, B) bool");
  return mask->data_ptr<bool>();
}

template <typename T>
const T* opt_ptr(const std::optional<Tensor>& t) {
  return t.has_value() ? t->data_ptr<T>() : nullptr;
}

std::vector<Tensor> rnn_forward(Tensor xp, Tensor w_hh, Tensor bias, Tensor h0,
                                std::optional<Tensor> mask, int64_t act,
                                std::optional<Tensor> offsets) {
  TORCH_CHECK(act >= 0 && act <= 2, "act must be 0 (tanh), 1 (relu) or 2 (sigmoid)");
  check(w_hh, "w_hh", 2);
  const int64_t Tn = steps_of(xp, offsets), B = h0.size(0), H = h0.size(1);
  const bool* M = mask_of(mask, Tn, B);
  const Steps S = make_steps(mask, offsets, Tn, B);
  check_buf(xp, "xp", S, H);
  check(bias, "bias", 1);
  Tensor hs = at::empty({Tn + 1, B, H}, xp.options());
  Tensor sc = at::empty({B, H}, xp.options());
  hs[0].copy_(h0);
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "rnn_forward", [&] {
    auto f = act == 1   ? rnn_forward_impl<scalar_t, 1>
             : act == 2 ? rnn_forward_impl<scalar_t, 2>
                        : rnn_forward_impl<scalar_t, 0>;
    const StepMatrix<scalar_t> W(w_hh, 0, H, true, S.rows());
    over_blocks(B, S, [&](int64_t r0, int64_t r1) {
      f(xp.data_ptr<scalar_t>(), W, bias.data_ptr<scalar_t>(), sc.data_ptr<scalar_t>(),
        hs.data_ptr<scalar_t>(), M, S, Tn, B, H, r0, r1);
    });
  });
  return {hs};
}

std::vector<Tensor> rnn_backward(Tensor hs, Tensor w_hh, std::optional<Tensor> mask,
                                 std::optional<Tensor> d_out, Tensor d_h, int64_t act,
                                 std::optional<Tensor> offsets) {
  TORCH_CHECK(act >= 0 && act <= 2, "act must be 0 (tanh), 1 (relu) or 2 (sigmoid)");
  check(hs, "hs", 3);
  check(w_hh, "w_hh", 2);
  check(d_h, "d_h", 2);
  const int64_t Tn = hs.size(0) - 1, B = hs.size(1), H = hs.size(2);
  const bool* M = mask_of(mask, Tn, B);
  const Steps S = make_steps(mask, offsets, Tn, B);
  Tensor dxp = step_buffer(S, H, hs);
  AT_DISPATCH_FLOATING_TYPES(hs.scalar_type(), "rnn_backward", [&] {
    auto f = act == 1   ? rnn_backward_impl<scalar_t, 1>
             : act == 2 ? rnn_backward_impl<scalar_t, 2>
                        : rnn_backward_impl<scalar_t, 0>;
    const StepMatrix<scalar_t> W(w_hh, 0, H, false, S.rows());
    over_blocks(B, S, [&](int64_t r0, int64_t r1) {
      f(hs.data_ptr<scalar_t>(), W, M, S, opt_ptr<scalar_t>(d_out), dxp.data_ptr<scalar_t>(),
        d_h.data_ptr<scalar_t>(), Tn, B, H, r0, r1);
    });
  });
  return {dxp, d_h};
}

std::vector<Tensor> lstm_forward(Tensor xp, Tensor w_hh, Tensor bias, Tensor h0, Tensor c0,
                                 std::optional<Tensor> mask, bool save,
                                 std::optional<Tensor> offsets) {
  check(w_hh, "w_hh", 2);
  const int64_t Tn = steps_of(xp, offsets), B = h0.size(0), H = h0.size(1);
  TORCH_CHECK(w_hh.size(0) == 4 * H && w_hh.size(1) == H, "w_hh must be (4H, H)");
  const bool* M = mask_of(mask, Tn, B);
  const Steps S = make_steps(mask, offsets, Tn, B);
  check_buf(xp, "xp", S, 4 * H);
  check(bias, "bias", 1);
  Tensor hs = at::empty({Tn + 1, B, H}, xp.options());
  Tensor cs = at::empty({save ? Tn + 1 : 2, B, H}, xp.options());
  Tensor tc = save ? step_buffer(S, H, xp) : scratch(S, H, xp);
  Tensor rec = at::empty({B, 4 * H}, xp.options());
  hs[0].copy_(h0);
  cs[0].copy_(c0);
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "lstm_forward", [&] {
    const StepMatrix<scalar_t> W(w_hh, 0, 4 * H, true, S.rows());
    over_blocks(B, S, [&](int64_t r0, int64_t r1) {
      lstm_forward_impl<scalar_t>(xp.data_ptr<scalar_t>(), W, bias.data_ptr<scalar_t>(),
                                  rec.data_ptr<scalar_t>(), hs.data_ptr<scalar_t>(),
                                  cs.data_ptr<scalar_t>(), tc.data_ptr<scalar_t>(), save, M, S, Tn,
                                  B, H, r0, r1);
    });
  });
  if (!save) {  // nothing is kept for backward: only the final c is meaningful
    cs = cs[Tn % 2].expand({Tn + 1, B, H});
    if (!S.packed()) tc = tc.expand({Tn, B, H});
  }
  return {hs, cs, tc};
}

std::vector<Tensor> lstm_backward(Tensor gates, Tensor tc, Tensor cs, Tensor w_hh,
                                  std::optional<Tensor> mask, std::optional<Tensor> d_out,
                                  Tensor d_h, Tensor d_c, std::optional<Tensor> offsets) {
  check(cs, "cs", 3);
  check(w_hh, "w_hh", 2);
  check(d_h, "d_h", 2);
  check(d_c, "d_c", 2);
  const int64_t Tn = cs.size(0) - 1, B = cs.size(1), H = cs.size(2);
  const bool* M = mask_of(mask, Tn, B);
  const Steps S = make_steps(mask, offsets, Tn, B);
  check_buf(gates, "gates", S, 4 * H);
  check_buf(tc, "tanh_c", S, H);
  Tensor dxp = step_buffer(S, 4 * H, gates);
  AT_DISPATCH_FLOATING_TYPES(gates.scalar_type(), "lstm_backward", [&] {
    const StepMatrix<scalar_t> W(w_hh, 0, 4 * H, false, S.rows());
    over_blocks(B, S, [&](int64_t r0, int64_t r1) {
      lstm_backward_impl<scalar_t>(gates.data_ptr<scalar_t>(), tc.data_ptr<scalar_t>(),
                                   cs.data_ptr<scalar_t>(), W, M, S, opt_ptr<scalar_t>(d_out),
                                   dxp.data_ptr<scalar_t>(), d_h.data_ptr<scalar_t>(),
                                   d_c.data_ptr<scalar_t>(), Tn, B, H, r0, r1);
    });
  });
  return {dxp, d_h, d_c};
}

std::vector<Tensor> gru_forward(Tensor rz, Tensor xn, Tensor w_hh, Tensor bias,
                                std::optional<Tensor> b_hn, Tensor h0, std::optional<Tensor> mask,
                                bool save, bool keep, bool after, std::optional<Tensor> offsets) {
  check(w_hh, "w_hh", 2);
  const int64_t Tn = steps_of(xn, offsets), B = h0.size(0), H = h0.size(1);
  TORCH_CHECK(!after || b_hn.has_value(), "reset='after' needs bias_hn");
  const bool* M = mask_of(mask, Tn, B);
  const Steps S = make_steps(mask, offsets, Tn, B);
  check_buf(rz, "xp_rz", S, 2 * H);
  check_buf(xn, "xp_n", S, H);
  Tensor hs = at::empty({Tn + 1, B, H}, xn.options());
  const int64_t RW = H;  // W_nh h + b_hn (after) or r ⊙ h (before)
  Tensor rec = save ? step_buffer(S, RW, xn) : scratch(S, RW, xn);
  Tensor sc = at::empty({B * 3 * H}, xn.options());
  check(bias, "bias", 1);
  hs[0].copy_(h0);
  AT_DISPATCH_FLOATING_TYPES(xn.scalar_type(), "gru_forward", [&] {
    auto f = keep ? gru_forward_impl<scalar_t, true> : gru_forward_impl<scalar_t, false>;
    // after: W_hh h in one product; before: W_rz h, then W_nh (r ⊙ h)
    const StepMatrix<scalar_t> W1(w_hh, 0, after ? 3 * H : 2 * H, true, S.rows());
    const StepMatrix<scalar_t> W2(w_hh, 2 * H, after ? 0 : H, true, S.rows());
    over_blocks(B, S, [&](int64_t r0, int64_t r1) {
      f(rz.data_ptr<scalar_t>(), xn.data_ptr<scalar_t>(), rec.data_ptr<scalar_t>(), W1, W2,
        bias.data_ptr<scalar_t>(), after ? b_hn->data_ptr<scalar_t>() : nullptr,
        sc.data_ptr<scalar_t>(), hs.data_ptr<scalar_t>(), save, M, S, Tn, B, H, after, r0, r1);
    });
  });
  if (!save && !S.packed()) rec = rec.expand({Tn, B, RW});
  return {hs, rec};
}

std::vector<Tensor> gru_backward(Tensor rz, Tensor xn, Tensor rec, Tensor hs, Tensor w_hh,
                                 std::optional<Tensor> mask, std::optional<Tensor> d_out,
                                 Tensor d_h, bool keep, bool after, std::optional<Tensor> offsets) {
  check(hs, "hs", 3);
  check(w_hh, "w_hh", 2);
  check(d_h, "d_h", 2);
  const int64_t Tn = hs.size(0) - 1, B = hs.size(1), H = hs.size(2);
  const bool* M = mask_of(mask, Tn, B);
  const Steps S = make_steps(mask, offsets, Tn, B);
  check_buf(rz, "rz", S, 2 * H);
  check_buf(xn, "n", S, H);
  check_buf(rec, "rec", S, H);
  Tensor dxp = step_buffer(S, 3 * H, xn);
  Tensor dhp = after ? step_buffer(S, H, xn) : dxp;
  Tensor drh = at::empty({B, H}, xn.options());  // d(r ⊙ h) scratch (reset before)
  AT_DISPATCH_FLOATING_TYPES(xn.scalar_type(), "gru_backward", [&] {
    auto f = keep ? gru_backward_impl<scalar_t, true> : gru_backward_impl<scalar_t, false>;
    const StepMatrix<scalar_t> W1(w_hh, 0, 2 * H, false, S.rows());  // r, z rows
    const StepMatrix<scalar_t> W2(w_hh, 2 * H, H, false, S.rows());  // n rows
    over_blocks(B, S, [&](int64_t r0, int64_t r1) {
      f(rz.data_ptr<scalar_t>(), xn.data_ptr<scalar_t>(), rec.data_ptr<scalar_t>(),
        hs.data_ptr<scalar_t>(), W1, W2, M, S, opt_ptr<scalar_t>(d_out), dxp.data_ptr<scalar_t>(),
        dhp.data_ptr<scalar_t>(), drh.data_ptr<scalar_t>(), d_h.data_ptr<scalar_t>(), Tn, B, H,
        after, r0, r1);
    });
  });
  return {dxp, dhp, d_h};
}

}  // namespace

TORCH_LIBRARY(rnnkit_native, m) {
  m.def("set_min_block_rows(int rows) -> ()", &set_min_block_rows);
  m.def(
      "rnn_forward(Tensor xp, Tensor w_hh, Tensor bias, Tensor h0, Tensor? mask, int act, "
      "Tensor? offsets=None) -> Tensor[]",
      &rnn_forward);
  m.def(
      "rnn_backward(Tensor hs, Tensor w_hh, Tensor? mask, Tensor? d_out, Tensor(a!) d_h, "
      "int act, Tensor? offsets=None) -> Tensor[]",
      &rnn_backward);
  m.def(
      "lstm_forward(Tensor(a!) xp, Tensor w_hh, Tensor bias, Tensor h0, Tensor c0, Tensor? mask, "
      "bool save, Tensor? offsets=None) -> Tensor[]",
      &lstm_forward);
  m.def(
      "lstm_backward(Tensor gates, Tensor tanh_c, Tensor cs, Tensor w_hh, Tensor? mask, "
      "Tensor? d_out, Tensor(a!) d_h, Tensor(b!) d_c, Tensor? offsets=None) -> Tensor[]",
      &lstm_backward);
  m.def(
      "gru_forward(Tensor(a!) xp_rz, Tensor(b!) xp_n, Tensor w_hh, Tensor bias, "
      "Tensor? bias_hn, "
      "Tensor h0, Tensor? mask, bool save, bool keep, bool after, Tensor? offsets=None) "
      "-> Tensor[]",
      &gru_forward);
  m.def(
      "gru_backward(Tensor rz, Tensor n, Tensor rec, Tensor hs, Tensor w_hh, Tensor? mask, "
      "Tensor? d_out, Tensor(a!) d_h, bool keep, bool after, Tensor? offsets=None) "
      "-> Tensor[]",
      &gru_backward);
}
