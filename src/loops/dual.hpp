#pragma once
// Forward-mode dual numbers: a value and its derivatives along D directions, usable on the device.
// paraseq uses them to differentiate a vector field that has no vjp() of its own (see field.hpp);
// a field written as a template over its scalar type works with them unchanged, provided it calls
// math functions unqualified after `using Kokkos::exp;` (and so on), so that these overloads are
// found by argument-dependent lookup.

#include <Kokkos_Core.hpp>

namespace paraseq::ode {

template <class T, int D>
struct Dual {
  static_assert(D >= 1, "paraseq::ode::Dual: the number of directions D must be at least 1");
  T value;
  T grad[D];

  KOKKOS_INLINE_FUNCTION constexpr Dual() : value(0), grad{} {}
  // Constants (and parameters that are not differentiated) have zero derivatives.
  KOKKOS_INLINE_FUNCTION constexpr Dual(T v) : value(v), grad{} {}

  // x seeded along `direction`: dx/d(direction) = 1.
  KOKKOS_INLINE_FUNCTION static constexpr Dual variable(T v, int direction) {
    Dual x(v);
    x.grad[direction] = T(1);
    return x;
  }

  // The chain rule for y = g(x) with g'(x) = slope.
  KOKKOS_INLINE_FUNCTION constexpr Dual chain(T result, T slope) const {
    Dual y(result);
    for (int d = 0; d < D; ++d) y.grad[d] = slope * grad[d];
    return y;
  }

  KOKKOS_INLINE_FUNCTION friend constexpr Dual operator+(const Dual& x) { return x; }
  KOKKOS_INLINE_FUNCTION friend constexpr Dual operator-(const Dual& x) { return x.chain(-x.value, T(-1)); }

  KOKKOS_INLINE_FUNCTION friend constexpr Dual operator+(const Dual& x, const Dual& y) {
    Dual z(x.value + y.value);
    for (int d = 0; d < D; ++d) z.grad[d] = x.grad[d] + y.grad[d];
    return z;
  }
  KOKKOS_INLINE_FUNCTION friend constexpr Dual operator-(const Dual& x, const Dual& y) {
    Dual z(x.value - y.value);
    for (int d = 0; d < D; ++d) z.grad[d] = x.grad[d] - y.grad[d];
    return z;
  }
  KOKKOS_INLINE_FUNCTION friend constexpr Dual operator*(const Dual& x, const Dual& y) {
    Dual z(x.value * y.value);
    for (int d = 0; d < D; ++d) z.grad[d] = x.grad[d] * y.value + x.value * y.grad[d];
    return z;
  }
  KOKKOS_INLINE_FUNCTION friend constexpr Dual operator/(const Dual& x, const Dual& y) {
    const T inverse = T(1) / y.value;
    Dual z(x.value * inverse);
    for (int d = 0; d < D; ++d) z.grad[d] = (x.grad[d] - z.value * y.grad[d]) * inverse;
    return z;
  }
  KOKKOS_INLINE_FUNCTION constexpr Dual& operator+=(const Dual& y) { return *this = *this + y; }
  KOKKOS_INLINE_FUNCTION constexpr Dual& operator-=(const Dual& y) { return *this = *this - y; }
  KOKKOS_INLINE_FUNCTION constexpr Dual& operator*=(const Dual& y) { return *this = *this * y; }
  KOKKOS_INLINE_FUNCTION constexpr Dual& operator/=(const Dual& y) { return *this = *this / y; }

  // Comparisons look at values only, so fields may branch on the state.
  KOKKOS_INLINE_FUNCTION friend constexpr bool operator<(const Dual& x, const Dual& y) { return x.value < y.value; }
  KOKKOS_INLINE_FUNCTION friend constexpr bool operator>(const Dual& x, const Dual& y) { return x.value > y.value; }
  KOKKOS_INLINE_FUNCTION friend constexpr bool operator<=(const Dual& x, const Dual& y) { return x.value <= y.value; }
  KOKKOS_INLINE_FUNCTION friend constexpr bool operator>=(const Dual& x, const Dual& y) { return x.value >= y.value; }

  KOKKOS_INLINE_FUNCTION friend Dual exp(const Dual& x) {
    const T e = Kokkos::exp(x.value);
    return x.chain(e, e);
  }
  KOKKOS_INLINE_FUNCTION friend Dual log(const Dual& x) { return x.chain(Kokkos::log(x.value), T(1) / x.value); }
  KOKKOS_INLINE_FUNCTION friend Dual sqrt(const Dual& x) {
    const T r = Kokkos::sqrt(x.value);
    return x.chain(r, T(0.5) / r);
  }
  KOKKOS_INLINE_FUNCTION friend Dual sin(const Dual& x) { return x.chain(Kokkos::sin(x.value), Kokkos::cos(x.value)); }
  KOKKOS_INLINE_FUNCTION friend Dual cos(const Dual& x) { return x.chain(Kokkos::cos(x.value), -Kokkos::sin(x.value)); }
  KOKKOS_INLINE_FUNCTION friend Dual tanh(const Dual& x) {
    const T th = Kokkos::tanh(x.value);
    return x.chain(th, T(1) - th * th);
  }
  // torch's derivative of |x|, sign(x): 0 at x = 0 (and for a NaN), as the generated vjp() has it.
  KOKKOS_INLINE_FUNCTION friend Dual abs(const Dual& x) {
    return x.chain(Kokkos::abs(x.value), x.value > 0 ? T(1) : x.value < 0 ? T(-1) : T(0));
  }
  KOKKOS_INLINE_FUNCTION friend Dual pow(const Dual& x, T p) {
    return x.chain(Kokkos::pow(x.value, p), p * Kokkos::pow(x.value, p - T(1)));
  }
};

} // namespace paraseq::ode
