// The LSTM: the forward and backward loops over time of one thread's row block.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "activations.h"
#include "gemm.h"
#include "steps.h"

namespace {

#ifdef RNNKIT_ACT_AVX2
// float32 on AVX2: the row's first 8·⌊H/8⌋ units, in two loops — (i, f, g, o, c) and then
// (tanh c, h) — with the scalar loop's operations (results equal to the bit). Why two:
// in one loop a unit's chain, gates → c → tanh c → h, is ~150 cycles long and longer
// than the core's reorder window lets iterations overlap; split, each loop's iterations
// overlap (benchmarks/HISTORY.md, "the gate loops written out for AVX2"). o waits for the second
// loop in go, or, without SAVE (go is then not written), in tc, which is scratch then.
// Returns the number of units done.
template <bool SAVE, bool XP>
int64_t lstm_fwd_row8(float* __restrict gi, float* __restrict gf, float* __restrict gg,
                      float* __restrict go, const float* __restrict si, const float* __restrict sf,
                      const float* __restrict sg, const float* __restrict so,
                      const float* __restrict bi, const float* __restrict bf,
                      const float* __restrict bg, const float* __restrict bo,
                      const float* __restrict cp, float* __restrict cn, float* __restrict hn,
                      float* __restrict tc, int64_t H) {
  const int64_t n = H / 8 * 8;
  float* ob = SAVE ? go : tc;
  // XP: (x_t W_ih^T + b) + h W_hh^T, the scalar loop's order
  const auto pre = [](const float* g, const float* s, const float* b, int64_t j) {
    return XP ? sum8(g, b, s, j) : _mm256_add_ps(ld8(s, j), ld8(b, j));
  };
  for (int64_t j = 0; j < n; j += 8) {
    const __m256 ai = pre(gi, si, bi, j), af = pre(gf, sf, bf, j);
    const __m256 ag = pre(gg, sg, bg, j), ao = pre(go, so, bo, j);
    const __m256 i = sigm8(ai), f = sigm8(af), g = tanh8(ag), o = sigm8(ao);
    _mm256_storeu_ps(cn + j, _mm256_fmadd_ps(f, ld8(cp, j), _mm256_mul_ps(i, g)));
    if constexpr (SAVE) {
      _mm256_storeu_ps(gi + j, i);
      _mm256_storeu_ps(gf + j, f);
      _mm256_storeu_ps(gg + j, g);
    }
    _mm256_storeu_ps(ob + j, o);
  }
  for (int64_t j = 0; j < n; j += 8) {
    const __m256 t = tanh8(ld8(cn, j));
    _mm256_storeu_ps(hn + j, _mm256_mul_ps(ld8(ob, j), t));
    if constexpr (SAVE) _mm256_storeu_ps(tc + j, t);
  }
  return n;
}
#endif

// gi..go: the input projections x_t W_ih^T on entry (XP; without XP they are not read:
// si..so then hold the whole product), the activated gates on exit (when SAVE); si..so:
// the recurrent part h_{t-1} W_hh^T of this step; bi..bo: the bias; tc: tanh c on exit
// when SAVE, scratch for H values otherwise.
template <typename T, bool SAVE, bool XP>
void lstm_fwd_row(T* __restrict gi, T* __restrict gf, T* __restrict gg, T* __restrict go,
                  const T* __restrict si, const T* __restrict sf, const T* __restrict sg,
                  const T* __restrict so, const T* __restrict bi, const T* __restrict bf,
                  const T* __restrict bg, const T* __restrict bo, const T* __restrict cp,
                  T* __restrict cn, T* __restrict hn, T* __restrict tc, int64_t H) {
  int64_t j0 = 0;
#ifdef RNNKIT_ACT_AVX2
  if constexpr (std::is_same_v<T, float>)
    j0 = lstm_fwd_row8<SAVE, XP>(gi, gf, gg, go, si, sf, sg, so, bi, bf, bg, bo, cp, cn, hn, tc, H);
#endif
  for (int64_t j = j0; j < H; ++j) {
    const T ai = XP ? gi[j] + bi[j] + si[j] : si[j] + bi[j];
    const T af = XP ? gf[j] + bf[j] + sf[j] : sf[j] + bf[j];
    const T ag = XP ? gg[j] + bg[j] + sg[j] : sg[j] + bg[j];
    const T ao = XP ? go[j] + bo[j] + so[j] : so[j] + bo[j];
    const T i = sigm(ai), f = sigm(af), g = tanh_(ag), o = sigm(ao);
    const T c = f * cp[j] + i * g;
    const T tcj = tanh_(c);
    cn[j] = c;
    hn[j] = o * tcj;
    if constexpr (SAVE) {
      gi[j] = i;
      gf[j] = f;
      gg[j] = g;
      go[j] = o;
      tc[j] = tcj;
    }
  }
}

template <typename T>
void lstm_bwd_row(const T* __restrict gi, const T* __restrict gf, const T* __restrict gg,
                  const T* __restrict go, const T* __restrict tc, const T* __restrict cp,
                  T* __restrict dh, T* __restrict dc, T* __restrict di, T* __restrict df,
                  T* __restrict dg, T* __restrict dout, int64_t H) {
  for (int64_t j = 0; j < H; ++j) {
    const T i = gi[j], f = gf[j], g = gg[j], o = go[j], tcj = tc[j], dhj = dh[j];
    const T dct = dc[j] + dhj * o * (T(1) - tcj * tcj);
    di[j] = dct * g * (i * (T(1) - i));
    df[j] = dct * cp[j] * (f * (T(1) - f));
    dg[j] = dct * i * (T(1) - g * g);
    dout[j] = dhj * tcj * (o * (T(1) - o));
    dc[j] = dct * f;
    dh[j] = T(0);  // replaced by d_gates W_hh below
  }
}

// xp: the input projections (T·B or N rows of 4H), the activated gates on exit when
// saving. With Wx (the input product in the loop), x holds the inputs (rows of I) instead,
// each step's product is x_t W_ih^T + h_{t-1} W_hh^T, and xp only receives the gates
// (null when not saving). With x but no Wx, x holds the projections (rows of 4H), read
// and not written: each step copies its rows into the hot buffer before h_{t-1} W_hh^T
// is added, and xp again only receives the gates.
// The inputs with Wx may lie with any row strides when the buffers are padded: row b of
// step t at x + t·xs_t + b·xs_b (a batch-first (B, T, I) tensor read in place, no
// transposing copy); packed, they are rows of I from the step's offset. out, when given,
// receives each h_t in the batch-first layout as well: row (b, t) at out + (b·T + t)·H.
template <typename T>
void lstm_forward_impl(T* xp, const StepMatrix<T>& W, const T* bias, T* rec, T* hs, T* cs, T* tc,
                       bool save, const bool* M, const Steps& S, int64_t Tn, int64_t B, int64_t H,
                       int64_t r0, int64_t r1, const T* x = nullptr,
                       const StepMatrix<T>* Wx = nullptr, int64_t I = 0, int64_t xs_t = 0,
                       int64_t xs_b = 0, T* out = nullptr, const Regularizers<T>& rg = {}) {
  const int64_t G = 4 * H;
  rec += r0 * G;
  std::vector<T> hm(rg.m ? (r1 - r0) * H : 0);  // h_{t-1} ⊙ m, the product's operand
  using Row = void (*)(T*, T*, T*, T*, const T*, const T*, const T*, const T*, const T*, const T*,
                       const T*, const T*, const T*, T*, T*, T*, int64_t);
  const Row row = x ? (save ? lstm_fwd_row<T, true, false> : lstm_fwd_row<T, false, false>)
                    : (save ? lstm_fwd_row<T, true, true> : lstm_fwd_row<T, false, true>);
  for (int64_t t = 0; t < Tn; ++t) {
    const int64_t bt = block_active(S.act[t], r0, r1);
    T* g = xp ? xp + (S.row(t) + r0) * G : nullptr;
    const T* hp = hs + (t * B + r0) * H;
    const T* hs0 = hp;  // h_{t-1} itself (hp may become h_{t-1} ⊙ m)
    // without save, c ping-pongs between two rows (only the final one is returned)
    const T* cp = cs + ((save ? t : t % 2) * B + r0) * H;
    T* cn = cs + ((save ? t + 1 : (t + 1) % 2) * B + r0) * H;
    T* hn = hs + ((t + 1) * B + r0) * H;
    T* tct = tc + ((save ? S.row(t) : 0) + r0) * H;
    const bool* m = M ? M + t * B + r0 : nullptr;
    if (rg.m) {
      for (int64_t k = 0; k < bt * H; ++k) hm[k] = hp[k] * rg.m[r0 * H + k];
      hp = hm.data();
    }
    // The recurrent part into a small hot buffer: the projections are read once, below.
    if (Wx) {
      const T* xt = S.packed() ? x + (S.row(t) + r0) * I : x + t * xs_t + r0 * xs_b;
      Wx->mm(bt, xt, S.packed() ? I : xs_b, T(0), rec, G);  // x_t W_ih^T
      W.mm(bt, hp, H, T(1), rec, G);                        // + h_{t-1} W_hh^T
    } else if (x) {
      std::memcpy(rec, x + (S.row(t) + r0) * G, bt * G * sizeof(T));  // the projections
      W.mm(bt, hp, H, T(1), rec, G);                                  // + h_{t-1} W_hh^T
    } else {
      W.mm(bt, hp, H, T(0), rec, G);  // h_{t-1} W_hh^T
    }
    for (int64_t b = 0; b < bt; ++b) {
      const T* sb = rec + b * G;
      // without g (no save, input product in the loop) the row is neither read nor written
      T* gb = g ? g + b * G : const_cast<T*>(sb);
      row(gb, gb + H, gb + 2 * H, gb + 3 * H, sb, sb + H, sb + 2 * H, sb + 3 * H, bias, bias + H,
          bias + 2 * H, bias + 3 * H, cp + b * H, cn + b * H, hn + b * H, tct + b * H, H);
      const int64_t kb = (t * B + r0 + b) * H;  // this row's keep factors
      if (rg.kh) zone_row(hn + b * H, hs0 + b * H, rg.kh + kb, H);
      if (rg.kc) zone_row(cn + b * H, cp + b * H, rg.kc + kb, H);
      if (m && !m[b]) {  // a hole: hold the state
        std::memcpy(hn + b * H, hs0 + b * H, H * sizeof(T));
        std::memcpy(cn + b * H, cp + b * H, H * sizeof(T));
      }
    }
    copy_rows(hn, hs0, bt, r1 - r0, H);
    copy_rows(cn, cp, bt, r1 - r0, H);
    if (out)
      for (int64_t b = 0; b < r1 - r0; ++b)
        std::memcpy(out + ((r0 + b) * Tn + t) * H, hn + b * H, H * sizeof(T));
    if (save && !S.packed()) {
      zero_rows(tct, bt, r1 - r0, H);
      if (x) zero_rows(g, bt, r1 - r0, G);  // finished rows' gates: defined, like their inputs
    }
  }
}

// With Wx (W_ih), each step also writes its rows of d_x = d_gates W_ih (rows of I).
// d_bias (4H): this block's rows of d_gates summed over all steps, while each row is in
// cache (a sum over the (T·B, 4H) buffer afterwards would read it all once more).
// d_out: row b of step t at dout + t·ds_t + b·ds_b (the gradient of batch-first outputs
// is read in place).
template <typename T>
void lstm_backward_impl(const T* gates, const T* tc, const T* cs, const StepMatrix<T>& W,
                        const bool* M, const Steps& S, const T* dout, int64_t ds_t, int64_t ds_b,
                        T* dxp, T* dh, T* dc, T* d_bias, int64_t Tn, int64_t B, int64_t H,
                        int64_t r0, int64_t r1, const StepMatrix<T>* Wx = nullptr, T* dx = nullptr,
                        int64_t I = 0, const Regularizers<T>& rg = {}) {
  const int64_t G = 4 * H;
  dh += r0 * H;
  dc += r0 * H;
  // zoneout: the part of ∂L/∂h_t that reaches h_{t-1} directly, d_h ⊙ d (added after the
  // product); which rows ran the cell's step (not holes, not finished)
  std::vector<T> direct(rg.kh ? (r1 - r0) * H : 0), dcd(rg.kc ? H : 0);
  std::vector<char> ran(rg.any() ? r1 - r0 : 0);
  for (int64_t t = Tn - 1; t >= 0; --t) {
    const int64_t bt = block_active(S.act[t], r0, r1);
    const T* g = gates + (S.row(t) + r0) * G;
    const T* tct = tc + (S.row(t) + r0) * H;
    const T* cp = cs + (t * B + r0) * H;
    T* dg = dxp + (S.row(t) + r0) * G;
    const bool* m = M ? M + t * B + r0 : nullptr;
    if (dout && ds_b == H) {  // the rows of a step lie together
      add_into(dh, dout + t * ds_t + r0 * H, (r1 - r0) * H);
    } else if (dout) {
      for (int64_t b = 0; b < r1 - r0; ++b)
        add_into(dh + b * H, dout + t * ds_t + (r0 + b) * ds_b, H);
    }
    for (int64_t b = 0; b < bt; ++b) {
      T* d = dg + b * G;
      if (rg.any()) ran[b] = 0;
      if (m && !m[b]) {  // a hole: no gate gradient, d_h and d_c pass through
        std::memset(d, 0, G * sizeof(T));
        continue;
      }
      const int64_t kb = (t * B + r0 + b) * H;
      T* dhb = dh + b * H;
      T* dcb = dc + b * H;
      // d_h̃ = d_h (1 − d); d_h d reaches h_{t-1} directly (c the same)
      if (rg.kh) zone_split(dhb, rg.kh + kb, direct.data() + b * H, H);
      if (rg.kc) zone_split(dcb, rg.kc + kb, dcd.data(), H);
      const T* gb = g + b * G;
      lstm_bwd_row<T>(gb, gb + H, gb + 2 * H, gb + 3 * H, tct + b * H, cp + b * H, dhb, dcb, d,
                      d + H, d + 2 * H, d + 3 * H, H);
      if (rg.kc) add_into(dcb, dcd.data(), H);
      if (rg.any()) ran[b] = 1;
      add_into(d_bias, d, G);
    }
    if (!S.packed()) zero_rows(dg, bt, r1 - r0, G);
    if (Wx) {
      T* dxt = dx + (S.row(t) + r0) * I;
      Wx->mm(bt, dg, G, T(0), dxt, I);  // d_x_t = d_gates W_ih
      if (!S.packed()) zero_rows(dxt, bt, r1 - r0, I);
    }
    W.mm(bt, dg, G, T(1), dh, H);  // d_h_prev += d_gates W_hh
    if (rg.m || rg.kh)
      for (int64_t b = 0; b < bt; ++b) {
        if (!ran[b]) continue;
        T* dhb = dh + b * H;
        if (rg.m)  // the product read h_{t-1} ⊙ m
          for (int64_t j = 0; j < H; ++j) dhb[j] *= rg.m[(r0 + b) * H + j];
        if (rg.kh) add_into(dhb, direct.data() + b * H, H);
      }
  }
}

}  // namespace
