// The step buffers of the loops' entry points (loop.cpp, layer_norm.h) and the checks of
// their arguments.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <optional>

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

// A (T, B, width) tensor whose rows the loop reads in place: any strides but contiguous rows.
void check_rows(const Tensor& t, const char* name, int64_t T, int64_t B, int64_t width) {
  TORCH_CHECK(t.device().is_cpu() && t.dim() == 3 && t.size(0) == T && t.size(1) == B &&
                  t.size(2) == width && (t.stride(2) == 1 || width <= 1 || t.numel() == 0),
              name, " must be (T, B, ", width, ") = (", T, ", ", B, ", ", width,
              ") with contiguous rows on the CPU, got ", t.sizes(), " with strides ", t.strides());
}

// d_out, the outputs' gradient: (T, B, H), contiguous (the loops read its rows in place).
void check_d_out(const std::optional<Tensor>& d_out, int64_t T, int64_t B, int64_t H) {
  if (!d_out.has_value()) return;
  TORCH_CHECK(d_out->device().is_cpu() && d_out->is_contiguous() && d_out->dim() == 3 &&
                  d_out->size(0) == T && d_out->size(1) == B && d_out->size(2) == H,
              "d_out must be contiguous (T, B, H) = (", T, ", ", B, ", ", H, ") on the CPU, got ",
              d_out->sizes());
}

template <typename T>
const T* opt_ptr(const std::optional<Tensor>& t) {
  return t.has_value() ? t->data_ptr<T>() : nullptr;
}

// Recurrent dropout's mask (B, H) and zoneout's keep factors (T, B, H), each contiguous in
// the states' dtype, on unsorted and unpacked rows (steps.h, Regularizers).
template <typename T>
Regularizers<T> regularizers_of(const std::optional<Tensor>& m, const std::optional<Tensor>& kh,
                                const std::optional<Tensor>& kc, const Steps& S, int64_t Tn,
                                int64_t B, int64_t H, const Tensor& like) {
  const auto ok = [&](const std::optional<Tensor>& t, const char* name, at::IntArrayRef shape) {
    if (!t.has_value()) return;
    TORCH_CHECK(t->device().is_cpu() && t->is_contiguous() && t->sizes() == shape &&
                    t->scalar_type() == like.scalar_type(),
                name, " must be contiguous ", shape, " of the states' dtype on the CPU, got ",
                t->sizes());
  };
  ok(m, "rec_mask", {B, H});
  ok(kh, "keep_h", {Tn, B, H});
  ok(kc, "keep_c", {Tn, B, H});
  Regularizers<T> rg{opt_ptr<T>(m), opt_ptr<T>(kh), opt_ptr<T>(kc)};
  TORCH_CHECK(!rg.any() || !S.packed(), "recurrent dropout and zoneout need unpacked rows");
  return rg;
}

}  // namespace
