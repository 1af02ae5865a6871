#pragma once
// Float32 views of float32 / bfloat16 / float16 memory for the CPU kernels: every kernel loads its
// inputs as two Vectorized<float> (one "block" of 2 * fVec::size() elements), computes in float32 and
// stores with a single rounding to the output dtype. Include only from *_kernel.cpp files (compiled per
// CPU capability); everything here lives in the per-capability inline namespace.
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <type_traits>

namespace fusegraph::cpu {
inline namespace CPU_CAPABILITY {

using fVec = at::vec::Vectorized<float>;

template <typename T>
struct VecIO {
  static constexpr int64_t kBlock = 2 * fVec::size();

  static inline void load(const T* p, fVec& a, fVec& b) {
    if constexpr (std::is_same_v<T, float>) {
      a = fVec::loadu(p);
      b = fVec::loadu(p + fVec::size());
    } else {
      std::tie(a, b) = at::vec::convert_to_float<T>(at::vec::Vectorized<T>::loadu(p));
    }
  }
  // Partial block: n < kBlock elements; lanes past n are zero.
  static inline void load(const T* p, fVec& a, fVec& b, int64_t n) {
    if constexpr (std::is_same_v<T, float>) {
      const int64_t na = n < fVec::size() ? n : fVec::size();
      a = fVec::loadu(p, na);
      b = n > fVec::size() ? fVec::loadu(p + fVec::size(), n - fVec::size()) : fVec(0.0f);
    } else {
      std::tie(a, b) = at::vec::convert_to_float<T>(at::vec::Vectorized<T>::loadu(p, n));
    }
  }
  static inline void store(T* p, const fVec& a, const fVec& b) {
    if constexpr (std::is_same_v<T, float>) {
      a.store(p);
      b.store(p + fVec::size());
    } else {
      at::vec::convert_from_float<T>(a, b).store(p);
    }
  }
  static inline void store(T* p, const fVec& a, const fVec& b, int64_t n) {
    if constexpr (std::is_same_v<T, float>) {
      const int64_t na = n < fVec::size() ? n : fVec::size();
      a.store(p, na);
      if (n > fVec::size()) b.store(p + fVec::size(), n - fVec::size());
    } else {
      at::vec::convert_from_float<T>(a, b).store(p, n);
    }
  }
};

inline float sum_lanes(const fVec& v) {
  return at::vec::vec_reduce_all<float>([](const fVec& a, const fVec& b) { return a + b; }, v);
}

// A block of n <= kBlock elements: the full-width path when n == kBlock, the partial one otherwise.
template <typename T>
inline void load_block(const T* p, fVec& a, fVec& b, int64_t n) {
  if (n == VecIO<T>::kBlock) {
    VecIO<T>::load(p, a, b);
  } else {
    VecIO<T>::load(p, a, b, n);
  }
}
template <typename T>
inline void store_block(T* p, const fVec& a, const fVec& b, int64_t n) {
  if (n == VecIO<T>::kBlock) {
    VecIO<T>::store(p, a, b);
  } else {
    VecIO<T>::store(p, a, b, n);
  }
}

}  // namespace CPU_CAPABILITY
}  // namespace fusegraph::cpu
