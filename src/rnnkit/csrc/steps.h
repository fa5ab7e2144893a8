// Which rows each step computes, and the split of the batch into thread blocks.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <vector>

namespace {

using at::Tensor;

// The steps of one call: how many leading rows each step computes and where its rows
// start in the step buffers (xp, gates, caches, d_xp). Padded buffers are (T, B, width):
// step t starts at row t·B. Packed buffers (like PackedSequence) hold only the rows each
// step computes: step t starts at off[t], so products over all steps skip finished rows.
struct Steps {
  std::vector<int64_t> act;  // rows 0 .. act[t] − 1 are computed at step t
  std::vector<int64_t> off;  // packed row offsets (T + 1), empty when padded
  int64_t B = 0;
  int64_t row(int64_t t) const { return off.empty() ? t * B : off[t]; }
  bool packed() const { return !off.empty(); }
  int64_t rows() const { return off.empty() ? (int64_t)act.size() * B : off.back(); }
};

// Padded: step t computes rows up to the last one with a real step at or after t.
// Packed: the offsets say how many (the caller derived them from the same rule).
Steps make_steps(const std::optional<Tensor>& mask, const std::optional<Tensor>& offsets, int64_t T,
                 int64_t B) {
  Steps S;
  S.B = B;
  S.act.assign(T, B);
  if (offsets.has_value()) {
    TORCH_CHECK(offsets->scalar_type() == at::kLong && offsets->dim() == 1 &&
                    offsets->size(0) == T + 1 && offsets->is_contiguous(),
                "offsets must be (T + 1,) int64");
    const int64_t* o = offsets->data_ptr<int64_t>();
    S.off.assign(o, o + T + 1);
    for (int64_t t = 0; t < T; ++t) {
      S.act[t] = o[t + 1] - o[t];
      TORCH_CHECK(S.act[t] >= 0 && S.act[t] <= B, "offsets must grow by 0 .. B per step");
    }
    return S;
  }
  if (!mask.has_value()) return S;
  const bool* M = mask->data_ptr<bool>();
  std::vector<int64_t> last(B, -1);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t b = 0; b < B; ++b)
      if (M[t * B + b]) last[b] = t;
  int64_t top = B;
  for (int64_t t = 0; t < T; ++t) {
    while (top > 0 && last[top - 1] < t) --top;
    S.act[t] = top;
  }
  return S;
}

void check(const Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be on the CPU");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
  TORCH_CHECK(t.dim() == dim, name, " must have ", dim, " dimensions");
}

// Rows of the block [r0, r1) that step t computes (the rest are finished: held).
inline int64_t block_active(int64_t active, int64_t r0, int64_t r1) {
  return std::clamp<int64_t>(active - r0, 0, r1 - r0);
}

template <typename T>
void copy_rows(T* dst, const T* src, int64_t from, int64_t to, int64_t width) {
  if (from < to)
    std::memcpy(dst + from * width, src + from * width, (to - from) * width * sizeof(T));
}

template <typename T>
void zero_rows(T* dst, int64_t from, int64_t to, int64_t width) {
  if (from < to) std::memset(dst + from * width, 0, (to - from) * width * sizeof(T));
}

// Sequences are independent: split the batch into contiguous row blocks, one per thread,
// each running the WHOLE time loop — no synchronisation per step. Blocks are balanced by
// the number of steps their rows are active (rows come sorted by last real step).
int64_t g_min_block_rows = 4;  // below this a thread's products get too thin

void set_min_block_rows(int64_t rows) { g_min_block_rows = std::max<int64_t>(rows, 1); }

template <typename F>
void over_blocks(int64_t B, const Steps& S, const F& run) {
  const int64_t kMinRows = g_min_block_rows;
  const int64_t P = std::min<int64_t>(at::get_num_threads(), B / kMinRows);
  if (P <= 1 || at::in_parallel_region()) {
    run(0, B);
    return;
  }
  std::vector<int64_t> work(B + 1, 0);  // work[b] = steps at which row b is computed
  for (int64_t a : S.act) work[0] += 1, work[a] -= 1;
  int64_t total = 0;
  for (int64_t b = 0; b < B; ++b) {
    if (b > 0) work[b] += work[b - 1];
    total += work[b];
  }
  std::vector<int64_t> bounds{0};
  int64_t cum = 0;
  for (int64_t b = 0; b < B && (int64_t)bounds.size() < P; ++b) {
    cum += work[b];
    const int64_t rows_left = B - (b + 1), blocks_left = P - (int64_t)bounds.size();
    if (b + 1 - bounds.back() >= kMinRows && rows_left >= blocks_left * kMinRows &&
        cum * P >= total * (int64_t)bounds.size())
      bounds.push_back(b + 1);
  }
  bounds.push_back(B);
  const int64_t nblocks = (int64_t)bounds.size() - 1;
  at::parallel_for(0, nblocks, 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) run(bounds[p], bounds[p + 1]);
  });
}

template <typename T>
void add_into(T* __restrict a, const T* __restrict b, int64_t n) {
  for (int64_t j = 0; j < n; ++j) a[j] += b[j];
}

// Recurrent dropout and zoneout (rnnkit/bptt/regularized.py): m (B, H), the mask on h_{t-1}
// where the recurrent product reads it; kh, kc (T, B, H), zoneout's keep factors of h and c
// (h_t = d h_{t-1} + (1 − d) h̃_t). Rows are batch rows, unsorted and unpacked. Null: none.
template <typename T>
struct Regularizers {
  const T* m = nullptr;
  const T* kh = nullptr;
  const T* kc = nullptr;
  bool any() const { return m || kh || kc; }
};

// zoneout of one row: s_new ← s_new + d (s_prev − s_new)
template <typename T>
void zone_row(T* __restrict sn, const T* __restrict sp, const T* __restrict d, int64_t H) {
  for (int64_t j = 0; j < H; ++j) sn[j] += d[j] * (sp[j] - sn[j]);
}

// zoneout's backward of one row: d ← d (1 − k), the part d k kept aside in direct
template <typename T>
void zone_split(T* __restrict d, const T* __restrict k, T* __restrict direct, int64_t H) {
  for (int64_t j = 0; j < H; ++j) {
    direct[j] = d[j] * k[j];
    d[j] -= direct[j];
  }
}

// the recurrent product's gradient of one row, read through the mask: d += dp ⊙ m
template <typename T>
void add_masked(T* __restrict d, const T* __restrict dp, const T* __restrict m, int64_t H) {
  for (int64_t j = 0; j < H; ++j) d[j] += dp[j] * m[j];
}

}  // namespace
