// The compiled time loop of rnnkit (rnnkit/native.py builds and loads it): the forward and
// the explicit backward through time of the simple cell, the LSTM and the GRU (and of the
// layer-normalised LSTM and GRU, layer_norm.h), one LSTM step for loops that stay in
// Python, and the fused scores of additive attention (attention.h), registered as the
// torch operators rnnkit_native::*.
//
// Each fused pass over one row is its own function with __restrict parameters: that is
// what lets GCC vectorise it (inside the lambdas, with derived pointers, it gives up).
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <torch/library.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "attention.h"
#include "buffers.h"
#include "gemm.h"
#include "gru.h"
#include "layer_norm.h"
#include "lstm.h"
#include "rnn.h"
#include "steps.h"

namespace {

template <typename T>
T* opt_out_ptr(std::optional<Tensor>& t) {
  return t.has_value() ? t->data_ptr<T>() : nullptr;
}

std::vector<Tensor> rnn_forward(Tensor xp, Tensor w_hh, Tensor bias, Tensor h0,
                                std::optional<Tensor> mask, int64_t act,
                                std::optional<Tensor> offsets, std::optional<Tensor> rec_mask,
                                std::optional<Tensor> keep_h) {
  TORCH_CHECK(act >= 0 && act <= 2, "act must be 0 (tanh), 1 (relu) or 2 (sigmoid)");
  check(w_hh, "w_hh", 2);
  const int64_t Tn = steps_of(xp, offsets), B = h0.size(0), H = h0.size(1);
  const bool* M = mask_of(mask, Tn, B);
  const Steps S = make_steps(mask, offsets, Tn, B);
  check_buf(xp, "xp", S, H);
  check(bias, "bias", 1);
  Tensor hs = at::empty({Tn + 1, B, H}, xp.options());
  Tensor sc = at::empty({B, H}, xp.options());
  // zoneout: the cell's own h̃_t, zero where a step did not run (holes, finished rows)
  Tensor cand =
      keep_h.has_value() ? at::zeros({Tn, B, H}, xp.options()) : at::empty({0}, xp.options());
  hs[0].copy_(h0);
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "rnn_forward", [&] {
    auto f = act == 1   ? rnn_forward_impl<scalar_t, 1>
             : act == 2 ? rnn_forward_impl<scalar_t, 2>
                        : rnn_forward_impl<scalar_t, 0>;
    const StepMatrix<scalar_t> W(w_hh, 0, H, true, S.rows());
    const auto rg = regularizers_of<scalar_t>(rec_mask, keep_h, std::nullopt, S, Tn, B, H, hs);
    over_blocks(B, S, [&](int64_t r0, int64_t r1) {
      f(xp.data_ptr<scalar_t>(), W, bias.data_ptr<scalar_t>(), sc.data_ptr<scalar_t>(),
        hs.data_ptr<scalar_t>(), M, S, Tn, B, H, r0, r1, rg,
        keep_h.has_value() ? cand.data_ptr<scalar_t>() : nullptr);
    });
  });
  return {hs, cand};
}

std::vector<Tensor> rnn_backward(Tensor hs, Tensor w_hh, std::optional<Tensor> mask,
                                 std::optional<Tensor> d_out, Tensor d_h, int64_t act,
                                 std::optional<Tensor> offsets, std::optional<Tensor> rec_mask,
                                 std::optional<Tensor> keep_h, std::optional<Tensor> cand) {
  TORCH_CHECK(act >= 0 && act <= 2, "act must be 0 (tanh), 1 (relu) or 2 (sigmoid)");
  check(hs, "hs", 3);
  check(w_hh, "w_hh", 2);
  check(d_h, "d_h", 2);
  const int64_t Tn = hs.size(0) - 1, B = hs.size(1), H = hs.size(2);
  check_d_out(d_out, Tn, B, H);
  const bool* M = mask_of(mask, Tn, B);
  const Steps S = make_steps(mask, offsets, Tn, B);
  Tensor dxp = step_buffer(S, H, hs);
  AT_DISPATCH_FLOATING_TYPES(hs.scalar_type(), "rnn_backward", [&] {
    auto f = act == 1   ? rnn_backward_impl<scalar_t, 1>
             : act == 2 ? rnn_backward_impl<scalar_t, 2>
                        : rnn_backward_impl<scalar_t, 0>;
    const StepMatrix<scalar_t> W(w_hh, 0, H, false, S.rows());
    const auto rg = regularizers_of<scalar_t>(rec_mask, keep_h, std::nullopt, S, Tn, B, H, hs);
    TORCH_CHECK(!rg.kh || (cand.has_value() && cand->is_contiguous() &&
                           cand->sizes() == at::IntArrayRef({Tn, B, H})),
                "zoneout needs the forward's candidates, contiguous (T, B, H)");
    over_blocks(B, S, [&](int64_t r0, int64_t r1) {
      f(hs.data_ptr<scalar_t>(), W, M, S, opt_ptr<scalar_t>(d_out), dxp.data_ptr<scalar_t>(),
        d_h.data_ptr<scalar_t>(), Tn, B, H, r0, r1, rg, opt_ptr<scalar_t>(cand));
    });
  });
  return {dxp, d_h};
}

// xp: the input projections, overwritten by the activated gates when saving; or, with
// w_ih, the inputs themselves (rows of I), whose product the loop computes step by step
// (the gates then go to a new buffer, returned fourth; empty without w_ih or save). With
// keep_input, projections are only read (they are the caller's) and the gates go to a
// new buffer too: cheaper than copying them first. Inputs with w_ih and no offsets may
// be any (T, B, I) view with contiguous rows (a batch-first input, transposed): the loop
// reads them in place. batch_first: the outputs h_1..h_T are also written (B, T, H),
// returned fifth (empty otherwise), so that a batch-first layer needs no transposing copy.
std::vector<Tensor> lstm_forward(Tensor xp, Tensor w_hh, Tensor bias, Tensor h0, Tensor c0,
                                 std::optional<Tensor> mask, bool save,
                                 std::optional<Tensor> offsets, std::optional<Tensor> w_ih,
                                 bool keep_input, bool batch_first, std::optional<Tensor> rec_mask,
                                 std::optional<Tensor> keep_h, std::optional<Tensor> keep_c) {
  check(w_hh, "w_hh", 2);
  const int64_t Tn = steps_of(xp, offsets), B = h0.size(0), H = h0.size(1);
  TORCH_CHECK(w_hh.size(0) == 4 * H && w_hh.size(1) == H, "w_hh must be (4H, H)");
  const bool* M = mask_of(mask, Tn, B);
  const Steps S = make_steps(mask, offsets, Tn, B);
  const bool fused = w_ih.has_value();
  int64_t I = 0;
  if (fused) {
    check(*w_ih, "w_ih", 2);
    TORCH_CHECK(w_ih->size(0) == 4 * H && w_ih->scalar_type() == xp.scalar_type(),
                "w_ih must be (4H, I) of the input's dtype");
    I = w_ih->size(1);
    if (S.packed())
      check_buf(xp, "x", S, I);
    else
      check_rows(xp, "x", Tn, B, I);
  } else {
    check_buf(xp, "xp", S, 4 * H);
  }
  check(bias, "bias", 1);
  Tensor hs = at::empty({Tn + 1, B, H}, xp.options());
  Tensor cs = at::empty({save ? Tn + 1 : 2, B, H}, xp.options());
  Tensor tc = save ? step_buffer(S, H, xp) : scratch(S, H, xp);
  Tensor rec = at::empty({B, 4 * H}, xp.options());
  const bool apart = fused || keep_input;  // the gates in a buffer of their own
  Tensor gates = apart && save ? step_buffer(S, 4 * H, xp) : at::empty({0}, xp.options());
  Tensor out = at::empty({batch_first ? B : 0, Tn, H}, xp.options());
  hs[0].copy_(h0);
  cs[0].copy_(c0);
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "lstm_forward", [&] {
    const StepMatrix<scalar_t> W(w_hh, 0, 4 * H, true, S.rows());
    std::optional<StepMatrix<scalar_t>> Wx;
    if (fused) Wx.emplace(*w_ih, 0, 4 * H, true, S.rows());
    scalar_t* g = apart ? (save ? gates.data_ptr<scalar_t>() : nullptr) : xp.data_ptr<scalar_t>();
    const scalar_t* x = apart ? xp.data_ptr<scalar_t>() : nullptr;
    const auto rg = regularizers_of<scalar_t>(rec_mask, keep_h, keep_c, S, Tn, B, H, hs);
    over_blocks(B, S, [&](int64_t r0, int64_t r1) {
      lstm_forward_impl<scalar_t>(g, W, bias.data_ptr<scalar_t>(), rec.data_ptr<scalar_t>(),
                                  hs.data_ptr<scalar_t>(), cs.data_ptr<scalar_t>(),
                                  tc.data_ptr<scalar_t>(), save, M, S, Tn, B, H, r0, r1, x,
                                  Wx ? &*Wx : nullptr, I, xp.stride(0), xp.stride(1),
                                  batch_first ? out.data_ptr<scalar_t>() : nullptr, rg);
    });
  });
  if (!save) {  // nothing is kept for backward: only the final c is meaningful
    cs = cs[Tn % 2].expand({Tn + 1, B, H});
    if (!S.packed()) tc = tc.expand({Tn, B, H});
  }
  return {hs, cs, tc, gates, out};
}

// With w_ih, also d_x = d_gates W_ih step by step (returned fourth; empty without it);
// fifth, the bias gradient (the sum of d_gates over every row). d_out may be any (T, B, H)
// view with contiguous rows (the gradient of batch-first outputs): read in place.
std::vector<Tensor> lstm_backward(Tensor gates, Tensor tc, Tensor cs, Tensor w_hh,
                                  std::optional<Tensor> mask, std::optional<Tensor> d_out,
                                  Tensor d_h, Tensor d_c, std::optional<Tensor> offsets,
                                  std::optional<Tensor> w_ih, std::optional<Tensor> rec_mask,
                                  std::optional<Tensor> keep_h, std::optional<Tensor> keep_c) {
  check(cs, "cs", 3);
  check(w_hh, "w_hh", 2);
  check(d_h, "d_h", 2);
  check(d_c, "d_c", 2);
  const int64_t Tn = cs.size(0) - 1, B = cs.size(1), H = cs.size(2);
  const bool* M = mask_of(mask, Tn, B);
  const Steps S = make_steps(mask, offsets, Tn, B);
  check_buf(gates, "gates", S, 4 * H);
  check_buf(tc, "tanh_c", S, H);
  if (d_out.has_value()) check_rows(*d_out, "d_out", Tn, B, H);
  Tensor dxp = step_buffer(S, 4 * H, gates);
  int64_t I = 0;
  if (w_ih.has_value()) {
    check(*w_ih, "w_ih", 2);
    TORCH_CHECK(w_ih->size(0) == 4 * H && w_ih->scalar_type() == gates.scalar_type(),
                "w_ih must be (4H, I) of the gates' dtype");
    I = w_ih->size(1);
  }
  Tensor dx = w_ih.has_value() ? step_buffer(S, I, gates) : at::empty({0}, gates.options());
  // each thread block sums its rows' bias gradient into the row of its first batch row
  Tensor d_bias = at::zeros({B, 4 * H}, gates.options());
  AT_DISPATCH_FLOATING_TYPES(gates.scalar_type(), "lstm_backward", [&] {
    const StepMatrix<scalar_t> W(w_hh, 0, 4 * H, false, S.rows());
    std::optional<StepMatrix<scalar_t>> Wx;
    if (w_ih.has_value()) Wx.emplace(*w_ih, 0, 4 * H, false, S.rows());
    const auto rg = regularizers_of<scalar_t>(rec_mask, keep_h, keep_c, S, Tn, B, H, cs);
    over_blocks(B, S, [&](int64_t r0, int64_t r1) {
      lstm_backward_impl<scalar_t>(
          gates.data_ptr<scalar_t>(), tc.data_ptr<scalar_t>(), cs.data_ptr<scalar_t>(), W, M, S,
          opt_ptr<scalar_t>(d_out), d_out ? d_out->stride(0) : 0, d_out ? d_out->stride(1) : 0,
          dxp.data_ptr<scalar_t>(), d_h.data_ptr<scalar_t>(), d_c.data_ptr<scalar_t>(),
          d_bias.data_ptr<scalar_t>() + r0 * 4 * H, Tn, B, H, r0, r1, Wx ? &*Wx : nullptr,
          w_ih.has_value() ? dx.data_ptr<scalar_t>() : nullptr, I, rg);
    });
  });
  return {dxp, d_h, d_c, dx, d_bias.sum(0)};
}

std::vector<Tensor> gru_forward(Tensor rz, Tensor xn, Tensor w_hh, Tensor bias,
                                std::optional<Tensor> b_hn, Tensor h0, std::optional<Tensor> mask,
                                bool save, bool keep, bool after, std::optional<Tensor> offsets,
                                std::optional<Tensor> rec_mask, std::optional<Tensor> keep_h) {
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
    const auto rg = regularizers_of<scalar_t>(rec_mask, keep_h, std::nullopt, S, Tn, B, H, hs);
    over_blocks(B, S, [&](int64_t r0, int64_t r1) {
      f(rz.data_ptr<scalar_t>(), xn.data_ptr<scalar_t>(), rec.data_ptr<scalar_t>(), W1, W2,
        bias.data_ptr<scalar_t>(), after ? b_hn->data_ptr<scalar_t>() : nullptr,
        sc.data_ptr<scalar_t>(), hs.data_ptr<scalar_t>(), save, M, S, Tn, B, H, after, r0, r1, rg);
    });
  });
  if (!save && !S.packed()) rec = rec.expand({Tn, B, RW});
  return {hs, rec};
}

std::vector<Tensor> gru_backward(Tensor rz, Tensor xn, Tensor rec, Tensor hs, Tensor w_hh,
                                 std::optional<Tensor> mask, std::optional<Tensor> d_out,
                                 Tensor d_h, bool keep, bool after, std::optional<Tensor> offsets,
                                 std::optional<Tensor> rec_mask, std::optional<Tensor> keep_h) {
  check(hs, "hs", 3);
  check(w_hh, "w_hh", 2);
  check(d_h, "d_h", 2);
  const int64_t Tn = hs.size(0) - 1, B = hs.size(1), H = hs.size(2);
  check_d_out(d_out, Tn, B, H);
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
    const auto rg = regularizers_of<scalar_t>(rec_mask, keep_h, std::nullopt, S, Tn, B, H, hs);
    over_blocks(B, S, [&](int64_t r0, int64_t r1) {
      f(rz.data_ptr<scalar_t>(), xn.data_ptr<scalar_t>(), rec.data_ptr<scalar_t>(),
        hs.data_ptr<scalar_t>(), W1, W2, M, S, opt_ptr<scalar_t>(d_out), dxp.data_ptr<scalar_t>(),
        dhp.data_ptr<scalar_t>(), drh.data_ptr<scalar_t>(), d_h.data_ptr<scalar_t>(), Tn, B, H,
        after, r0, r1, rg);
    });
  });
  return {dxp, dhp, d_h};
}

// One LSTM step over a batch, for loops that run in Python because something between the
// steps depends on the state (attention before the step, a decoder generating): the gate
// math of lstm_forward / lstm_backward on products computed outside.
//   forward: xp (B, 4H) the input part of the pre-activation (no bias), rec (B, 4H) the
//   recurrent part h_{t-1} W_hh^T, c_prev (B, H) → h, c, tanh_c (B, H); xp becomes the
//   activated gates i, f, g, o.
void lstm_step(Tensor xp, Tensor rec, Tensor bias, Tensor c_prev, Tensor h, Tensor c,
               Tensor tanh_c) {
  check(xp, "xp", 2);
  check(rec, "rec", 2);
  check(bias, "bias", 1);
  const int64_t B = xp.size(0), H = xp.size(1) / 4;
  TORCH_CHECK(xp.size(1) == 4 * H && rec.sizes() == xp.sizes() && bias.size(0) == 4 * H,
              "xp and rec must be (B, 4H), bias (4H)");
  for (const Tensor* t : {&c_prev, &h, &c, &tanh_c}) {
    check(*t, "every state", 2);
    TORCH_CHECK(t->size(0) == B && t->size(1) == H, "every state must be (B, H)");
  }
  AT_DISPATCH_FLOATING_TYPES(xp.scalar_type(), "lstm_step", [&] {
    scalar_t* g = xp.data_ptr<scalar_t>();
    const scalar_t *r = rec.data_ptr<scalar_t>(), *b = bias.data_ptr<scalar_t>();
    const scalar_t* cp = c_prev.data_ptr<scalar_t>();
    scalar_t *hn = h.data_ptr<scalar_t>(), *cn = c.data_ptr<scalar_t>();
    scalar_t* tc = tanh_c.data_ptr<scalar_t>();
    const int64_t G = 4 * H;
    at::parallel_for(0, B, std::max<int64_t>(1, 4096 / G), [&](int64_t b0, int64_t b1) {
      for (int64_t i = b0; i < b1; ++i) {
        scalar_t* gb = g + i * G;
        const scalar_t* sb = r + i * G;
        lstm_fwd_row<scalar_t, true, true>(gb, gb + H, gb + 2 * H, gb + 3 * H, sb, sb + H,
                                           sb + 2 * H, sb + 3 * H, b, b + H, b + 2 * H, b + 3 * H,
                                           cp + i * H, cn + i * H, hn + i * H, tc + i * H, H);
      }
    });
  });
}

//   backward: gates, tanh_c from lstm_step, c_prev; d_h (B, H) the gradient of h_t (plus
//   d_out if given), d_c (B, H) that of c_t → d_gates (B, 4H) the pre-activation's; d_c
//   becomes that of c_{t-1}, d_h is zeroed (its recurrent part is d_gates W_hh, outside).
void lstm_step_backward(Tensor gates, Tensor tanh_c, Tensor c_prev, Tensor d_h, Tensor d_c,
                        Tensor d_gates, std::optional<Tensor> d_out) {
  check(gates, "gates", 2);
  check(d_gates, "d_gates", 2);
  const int64_t B = gates.size(0), H = gates.size(1) / 4;
  TORCH_CHECK(d_gates.sizes() == gates.sizes(), "d_gates must have the gates' shape");
  for (const Tensor* t : {&tanh_c, &c_prev, &d_h, &d_c}) {
    check(*t, "every state", 2);
    TORCH_CHECK(t->size(0) == B && t->size(1) == H, "every state must be (B, H)");
  }
  if (d_out.has_value()) {
    check(*d_out, "d_out", 2);
    TORCH_CHECK(d_out->sizes() == d_h.sizes(), "d_out must be (B, H)");
  }
  AT_DISPATCH_FLOATING_TYPES(gates.scalar_type(), "lstm_step_backward", [&] {
    const scalar_t *g = gates.data_ptr<scalar_t>(), *tc = tanh_c.data_ptr<scalar_t>();
    const scalar_t* cp = c_prev.data_ptr<scalar_t>();
    const scalar_t* dout = opt_ptr<scalar_t>(d_out);
    scalar_t *dh = d_h.data_ptr<scalar_t>(), *dc = d_c.data_ptr<scalar_t>();
    scalar_t* dg = d_gates.data_ptr<scalar_t>();
    const int64_t G = 4 * H;
    at::parallel_for(0, B, std::max<int64_t>(1, 4096 / G), [&](int64_t b0, int64_t b1) {
      if (dout) add_into(dh + b0 * H, dout + b0 * H, (b1 - b0) * H);
      for (int64_t i = b0; i < b1; ++i) {
        const scalar_t* gb = g + i * G;
        scalar_t* d = dg + i * G;
        lstm_bwd_row<scalar_t>(gb, gb + H, gb + 2 * H, gb + 3 * H, tc + i * H, cp + i * H,
                               dh + i * H, dc + i * H, d, d + H, d + 2 * H, d + 3 * H, H);
      }
    });
  });
}

void check_same(const Tensor& t, const Tensor& like, const char* name) {
  TORCH_CHECK(t.scalar_type() == like.scalar_type(), name, " must have the keys' dtype");
}

// The query may be (B, A) or (B, Q, A), the other tensors following: scores (B, [Q,] S),
// sig (B, [Q,] S, A).
void sigmoid_scores(Tensor keys, Tensor query, Tensor v, Tensor scores, std::optional<Tensor> sig,
                    double key_scale, std::optional<Tensor> padding) {
  check(keys, "keys", 3);
  check(v, "v", 1);
  const int64_t B = keys.size(0), S = keys.size(1), A = keys.size(2);
  const bool many = query.dim() == 3;
  const int64_t Q = many ? query.size(1) : 1;
  check(query, "query", many ? 3 : 2);
  check(scores, "scores", many ? 3 : 2);
  TORCH_CHECK(query.size(0) == B && query.size(-1) == A, "query must be (B, A) or (B, Q, A)");
  TORCH_CHECK(v.size(0) == A, "v must be (A)");
  TORCH_CHECK(scores.numel() == B * Q * S && scores.size(-1) == S,
              "scores must be (B, S) or (B, Q, S)");
  for (const Tensor* t : {&query, &v, &scores}) check_same(*t, keys, "every tensor");
  if (sig.has_value()) {
    check(*sig, "sig", many ? 4 : 3);
    check_same(*sig, keys, "sig");
    TORCH_CHECK(sig->numel() == B * Q * S * A && sig->size(-1) == A,
                "sig must be (B, S, A) or (B, Q, S, A)");
  }
  if (padding.has_value()) {
    TORCH_CHECK(padding->scalar_type() == at::kBool && padding->is_contiguous() &&
                    padding->numel() == B * S && padding->size(0) == B && padding->size(-1) == S,
                "padding must be a contiguous bool (B, S) or (B, 1, S)");
  }
  const bool* pad = padding.has_value() ? padding->data_ptr<bool>() : nullptr;
  AT_DISPATCH_FLOATING_TYPES(keys.scalar_type(), "sigmoid_scores", [&] {
    sigmoid_scores_impl<scalar_t>(keys.data_ptr<scalar_t>(), static_cast<scalar_t>(key_scale),
                                  query.data_ptr<scalar_t>(), v.data_ptr<scalar_t>(),
                                  scores.data_ptr<scalar_t>(), opt_out_ptr<scalar_t>(sig), pad, B,
                                  Q, S, A);
  });
}

void sigmoid_scores_backward(Tensor d_s, Tensor sig, Tensor w, Tensor s_sig, Tensor d_q,
                             std::optional<Tensor> acc) {
  const bool many = sig.dim() == 4;
  check(sig, "sig", many ? 4 : 3);
  check(d_s, "d_s", many ? 3 : 2);
  check(w, "w", 1);
  check(s_sig, "s_sig", many ? 3 : 2);
  check(d_q, "d_q", many ? 3 : 2);
  const int64_t B = sig.size(0), Q = many ? sig.size(1) : 1, S = sig.size(-2), A = sig.size(-1);
  TORCH_CHECK(d_s.numel() == B * Q * S && d_s.size(-1) == S, "d_s must be (B, [Q,] S)");
  TORCH_CHECK(w.size(0) == A, "w must be (A)");
  TORCH_CHECK(s_sig.numel() == B * Q * A && s_sig.size(-1) == A, "s_sig must be (B, [Q,] A)");
  TORCH_CHECK(d_q.numel() == B * Q * A && d_q.size(-1) == A, "d_q must be (B, [Q,] A)");
  for (const Tensor* t : {&d_s, &w, &s_sig, &d_q}) check_same(*t, sig, "every tensor");
  if (acc.has_value()) {
    check(*acc, "acc", 3);
    check_same(*acc, sig, "acc");
    TORCH_CHECK(acc->size(0) == B && acc->size(1) == S && acc->size(2) == A,
                "acc must be (B, S, A)");
  }
  AT_DISPATCH_FLOATING_TYPES(sig.scalar_type(), "sigmoid_scores_backward", [&] {
    sigmoid_scores_backward_impl<scalar_t>(d_s.data_ptr<scalar_t>(), sig.data_ptr<scalar_t>(),
                                           w.data_ptr<scalar_t>(), s_sig.data_ptr<scalar_t>(),
                                           d_q.data_ptr<scalar_t>(), opt_out_ptr<scalar_t>(acc), B,
                                           Q, S, A);
  });
}

}  // namespace

// C = A · B over all steps' rows — the weight gradients d_gatesᵀ x and d_gatesᵀ h_{t−1},
// the input gradient d_gates W_ih. float32 with AVX-512: the packed kernel, split into
// blocks of 64 rows over the threads (where torch's BLAS takes its AVX2 path, MKL on AMD
// processors, this is twice its rate). Elsewhere torch's own product. A and B: each
// row-major or the transpose of a row-major matrix (a .T view; for A, also of a block of its
// columns); other strides are copied.
// B may also be (T, B, n), its rows t·B + b: a batch-first input (transposed) is then
// read in place for d_gatesᵀ x.
Tensor matmul(Tensor a, Tensor b) {
  const bool rows3 = b.dim() == 3;
  TORCH_CHECK(a.dim() == 2 && (b.dim() == 2 || rows3) &&
                  a.size(1) == (rows3 ? b.size(0) * b.size(1) : b.size(0)),
              "matmul needs (m, k) and (k, n) matrices (or (T, B, n) with T·B = k), got ",
              a.sizes(), " and ", b.sizes());
#ifdef RNNKIT_GEMM_AVX512
  const int64_t m = a.size(0), k = a.size(1), n = b.size(-1);
  if (a.scalar_type() == at::kFloat && b.scalar_type() == at::kFloat && a.device().is_cpu() &&
      b.device().is_cpu() && m >= PACK_MIN_ROWS && n > 0 && k > 0) {
    // a transposed row-major matrix, its rows possibly padded (the .T of a block of
    // columns, such as a layer-normalised cell's ∂L/∂q in its wider buffer): read in place
    const bool a_t = !a.is_contiguous() && a.stride(0) == 1 && a.stride(1) >= m;
    if (!a_t) a = a.contiguous();
    if (rows3 && b.stride(2) != 1) b = b.contiguous();
    const bool b_t = !rows3 && !b.is_contiguous() && b.t().is_contiguous();
    if (!rows3 && !b_t) b = b.contiguous();
    Tensor c = at::empty({m, n}, a.options());
    const StepMatrix<float> W =
        rows3 ? StepMatrix<float>(b.data_ptr<float>(), k, n, b.size(1), b.stride(0), b.stride(1))
              : StepMatrix<float>(b_t ? b.t() : b, 0, b_t ? n : k, b_t, m);
    const float* A = a.data_ptr<float>();
    float* C = c.data_ptr<float>();
    const int64_t lda = a_t ? a.stride(1) : k;
    constexpr int64_t kRows = 64;
    at::parallel_for(0, (m + kRows - 1) / kRows, 1, [&](int64_t q0, int64_t q1) {
      const int64_t r0 = q0 * kRows, r1 = std::min(m, q1 * kRows);
      if (a_t)
        W.mm_at(r1 - r0, A + r0, lda, C + r0 * n, n);
      else
        W.mm(r1 - r0, A + r0 * lda, lda, 0.f, C + r0 * n, n);
    });
    return c;
  }
#endif
  if (rows3) b = b.reshape({-1, b.size(2)});
  // A weight gradient d_gatesᵀ x (a the transpose of a row-major matrix, b row-major) on
  // one thread as (xᵀ d_gates)ᵀ: MKL's AVX2 path runs the product with the long dimension
  // on the left faster and to the same bits; the transposing copy of the small result
  // costs less. On two threads it was slower: torch's split of the product stays
  // (benchmarks/HISTORY.md, "the weight gradients turned round"). float64 keeps torch's
  // product as asked: it is the exact path the tests compare against.
  if (a.scalar_type() == at::kFloat && at::get_num_threads() == 1 && !a.is_contiguous() &&
      a.t().is_contiguous() && b.is_contiguous())
    return at::mm(b.t(), a.t()).t().contiguous();
  return at::mm(a, b);
}

// Whether matmul runs the library's own kernel for large float32 products (AVX-512
// builds) rather than torch's.
bool own_matmul() {
#ifdef RNNKIT_GEMM_AVX512
  return true;
#else
  return false;
#endif
}

TORCH_LIBRARY(rnnkit_native, m) {
  m.def("set_min_block_rows(int rows) -> ()", &set_min_block_rows);
  m.def("matmul(Tensor a, Tensor b) -> Tensor", &matmul);
  m.def("own_matmul() -> bool", &own_matmul);
  m.def(
      "rnn_forward(Tensor xp, Tensor w_hh, Tensor bias, Tensor h0, Tensor? mask, int act, "
      "Tensor? offsets=None, Tensor? rec_mask=None, Tensor? keep_h=None) -> Tensor[]",
      &rnn_forward);
  m.def(
      "rnn_backward(Tensor hs, Tensor w_hh, Tensor? mask, Tensor? d_out, Tensor(a!) d_h, "
      "int act, Tensor? offsets=None, Tensor? rec_mask=None, Tensor? keep_h=None, "
      "Tensor? cand=None) -> Tensor[]",
      &rnn_backward);
  m.def(
      "lstm_forward(Tensor(a!) xp, Tensor w_hh, Tensor bias, Tensor h0, Tensor c0, Tensor? mask, "
      "bool save, Tensor? offsets=None, Tensor? w_ih=None, bool keep_input=False, "
      "bool batch_first=False, Tensor? rec_mask=None, Tensor? keep_h=None, "
      "Tensor? keep_c=None) -> Tensor[]",
      &lstm_forward);
  m.def(
      "lstm_backward(Tensor gates, Tensor tanh_c, Tensor cs, Tensor w_hh, Tensor? mask, "
      "Tensor? d_out, Tensor(a!) d_h, Tensor(b!) d_c, Tensor? offsets=None, Tensor? w_ih=None, "
      "Tensor? rec_mask=None, Tensor? keep_h=None, Tensor? keep_c=None) -> Tensor[]",
      &lstm_backward);
  m.def(
      "gru_forward(Tensor(a!) xp_rz, Tensor(b!) xp_n, Tensor w_hh, Tensor bias, "
      "Tensor? bias_hn, "
      "Tensor h0, Tensor? mask, bool save, bool keep, bool after, Tensor? offsets=None, "
      "Tensor? rec_mask=None, Tensor? keep_h=None) -> Tensor[]",
      &gru_forward);
  m.def(
      "gru_backward(Tensor rz, Tensor n, Tensor rec, Tensor hs, Tensor w_hh, Tensor? mask, "
      "Tensor? d_out, Tensor(a!) d_h, bool keep, bool after, Tensor? offsets=None, "
      "Tensor? rec_mask=None, Tensor? keep_h=None) -> Tensor[]",
      &gru_backward);
  m.def(
      "ln_lstm_forward(Tensor xp, Tensor w_hh, Tensor bias, Tensor gains, Tensor h0, Tensor c0, "
      "Tensor? mask, bool save, Tensor? offsets=None, Tensor? rec_mask=None, "
      "Tensor? keep_h=None, Tensor? keep_c=None) -> Tensor[]",
      &ln_lstm_forward);
  m.def(
      "ln_gru_forward(Tensor xp, Tensor w_hh, Tensor bias, Tensor gains, Tensor h0, Tensor? mask, "
      "bool save, bool keep, Tensor? offsets=None, Tensor? keep_h=None) -> Tensor[]",
      &ln_gru_forward);
  m.def(
      "ln_lstm_backward(Tensor[] cache, Tensor cs, Tensor w_hh, Tensor gains, Tensor? mask, "
      "Tensor? d_out, Tensor(a!) d_h, Tensor(b!) d_c, Tensor? offsets=None, "
      "Tensor? rec_mask=None, Tensor? keep_h=None, Tensor? keep_c=None) -> Tensor[]",
      &ln_lstm_backward);
  m.def(
      "ln_gru_backward(Tensor[] cache, Tensor hs, Tensor w_hh, Tensor gains, Tensor? mask, "
      "Tensor? d_out, Tensor(a!) d_h, bool keep, Tensor? offsets=None, "
      "Tensor? keep_h=None) -> Tensor[]",
      &ln_gru_backward);
  m.def(
      "lstm_step(Tensor(a!) xp, Tensor rec, Tensor bias, Tensor c_prev, Tensor(b!) h, "
      "Tensor(c!) c, Tensor(d!) tanh_c) -> ()",
      &lstm_step);
  m.def(
      "lstm_step_backward(Tensor gates, Tensor tanh_c, Tensor c_prev, Tensor(a!) d_h, "
      "Tensor(b!) d_c, Tensor(c!) d_gates, Tensor? d_out=None) -> ()",
      &lstm_step_backward);
  m.def(
      "sigmoid_scores(Tensor keys, Tensor query, Tensor v, Tensor(a!) scores, "
      "Tensor(b!)? sig=None, float key_scale=1.0, Tensor? padding=None) -> ()",
      &sigmoid_scores);
  m.def(
      "sigmoid_scores_backward(Tensor d_s, Tensor sig, Tensor w, Tensor(a!) s_sig, "
      "Tensor(b!) d_q, Tensor(c!)? acc=None) -> ()",
      &sigmoid_scores_backward);
}
