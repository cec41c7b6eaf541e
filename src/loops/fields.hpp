#pragma once
// Built-in vector fields (see field.hpp for the interface), each with an explicit vjp():
//
//   DampedOscillator        y0' = y1, y1' = -k y0 - c y1              own: [k, c]
//   LotkaVolterra           x' = a x - b x y, y' = d x y - g y         own: [a, b, d, g]
//   SIR                     s' = -beta s i, i' = beta s i - gamma i,   own: [beta, gamma]
//                           r' = gamma i   (fractions of a population)
//   Linear<SA, SB>(n)       y' = A y + b, A [n, n] row-major          A and b shared or own (per
//                                                                      trajectory), b possibly absent
//   Mlp(n, hidden)          y' = W2 tanh(W1 y + b1) + b2              shared: [W1 (hidden x n, row-
//                                                                      major) | b1 | W2 (n x hidden) | b2]
//
// Own parameters are one row of the [N, P] parameter View, shared ones the [Q] View, in the order
// listed. Every operator() is a template over the scalar, so the fields also run on dual numbers.

#include <paraseq/core/errors.hpp>
#include <paraseq/loops/field.hpp>

#include <Kokkos_Core.hpp>

#include <string>

namespace paraseq::ode {

struct DampedOscillator {
  static constexpr int state_size = 2;
  static constexpr int max_parameter_count = 2;
  KOKKOS_INLINE_FUNCTION int parameter_count() const { return 2; }
  KOKKOS_INLINE_FUNCTION int shared_parameter_count() const { return 0; }

  template <class S, class P>
  KOKKOS_INLINE_FUNCTION void operator()(S, const S* y, const P& p, S* dy) const {
    const auto k = p.own(0), c = p.own(1);
    dy[0] = y[1];
    dy[1] = -k * y[0] - c * y[1];
  }

  template <class T, class P, class G>
  KOKKOS_INLINE_FUNCTION void vjp(T, const T* y, const P& p, const T* g, T* y_bar, const G& p_bar) const {
    const T k = p.own(0), c = p.own(1);
    y_bar[0] -= k * g[1];
    y_bar[1] += g[0] - c * g[1];
    p_bar.own(0) -= y[0] * g[1];
    p_bar.own(1) -= y[1] * g[1];
  }
};

struct LotkaVolterra {
  static constexpr int state_size = 2;
  static constexpr int max_parameter_count = 4;
  KOKKOS_INLINE_FUNCTION int parameter_count() const { return 4; }
  KOKKOS_INLINE_FUNCTION int shared_parameter_count() const { return 0; }

  template <class S, class P>
  KOKKOS_INLINE_FUNCTION void operator()(S, const S* y, const P& p, S* dy) const {
    const auto alpha = p.own(0), beta = p.own(1), delta = p.own(2), gamma = p.own(3);
    dy[0] = alpha * y[0] - beta * y[0] * y[1];
    dy[1] = delta * y[0] * y[1] - gamma * y[1];
  }

  template <class T, class P, class G>
  KOKKOS_INLINE_FUNCTION void vjp(T, const T* y, const P& p, const T* g, T* y_bar, const G& p_bar) const {
    const T alpha = p.own(0), beta = p.own(1), delta = p.own(2), gamma = p.own(3);
    y_bar[0] += g[0] * (alpha - beta * y[1]) + g[1] * delta * y[1];
    y_bar[1] += -g[0] * beta * y[0] + g[1] * (delta * y[0] - gamma);
    p_bar.own(0) += g[0] * y[0];
    p_bar.own(1) -= g[0] * y[0] * y[1];
    p_bar.own(2) += g[1] * y[0] * y[1];
    p_bar.own(3) -= g[1] * y[1];
  }
};

struct SIR {
  static constexpr int state_size = 3;
  static constexpr int max_parameter_count = 2;
  KOKKOS_INLINE_FUNCTION int parameter_count() const { return 2; }
  KOKKOS_INLINE_FUNCTION int shared_parameter_count() const { return 0; }

  template <class S, class P>
  KOKKOS_INLINE_FUNCTION void operator()(S, const S* y, const P& p, S* dy) const {
    const auto beta = p.own(0), gamma = p.own(1);
    const S infection = beta * y[0] * y[1], recovery = gamma * y[1];
    dy[0] = -infection;
    dy[1] = infection - recovery;
    dy[2] = recovery;
  }

  template <class T, class P, class G>
  KOKKOS_INLINE_FUNCTION void vjp(T, const T* y, const P& p, const T* g, T* y_bar, const G& p_bar) const {
    const T beta = p.own(0), gamma = p.own(1);
    const T infection_bar = g[1] - g[0], recovery_bar = g[2] - g[1];
    y_bar[0] += infection_bar * beta * y[1];
    y_bar[1] += infection_bar * beta * y[0] + recovery_bar * gamma;
    p_bar.own(0) += infection_bar * y[0] * y[1];
    p_bar.own(1) += recovery_bar * y[1];
  }
};

// Where a Linear field's A or b comes from.
enum class Sharing { absent, shared, own };

template <Sharing SA = Sharing::shared, Sharing SB = Sharing::absent>
struct Linear {
  static_assert(SA != Sharing::absent, "paraseq::ode::Linear: A cannot be absent");
  static constexpr int state_size = runtime_size;
  int n = 0;

  KOKKOS_INLINE_FUNCTION int size() const { return n; }
  KOKKOS_INLINE_FUNCTION int parameter_count() const { return count(Sharing::own); }
  KOKKOS_INLINE_FUNCTION int shared_parameter_count() const { return count(Sharing::shared); }

  template <class S, class P>
  KOKKOS_INLINE_FUNCTION void operator()(S, const S* y, const P& p, S* dy) const {
    for (int i = 0; i < n; ++i) {
      S sum = 0;
      if constexpr (SB != Sharing::absent) sum = read<SB>(p, b_offset() + i);
      for (int j = 0; j < n; ++j) sum += read<SA>(p, i * n + j) * y[j];
      dy[i] = sum;
    }
  }

  template <class T, class P, class G>
  KOKKOS_INLINE_FUNCTION void vjp(T, const T* y, const P& p, const T* g, T* y_bar, const G& p_bar) const {
    for (int j = 0; j < n; ++j) {
      T sum = 0;
      for (int i = 0; i < n; ++i) sum += T(read<SA>(p, i * n + j)) * g[i];
      y_bar[j] += sum;
    }
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) gradient<SA>(p_bar, i * n + j) += g[i] * y[j];
      if constexpr (SB != Sharing::absent) gradient<SB>(p_bar, b_offset() + i) += g[i];
    }
  }

private:
  KOKKOS_INLINE_FUNCTION int count(Sharing where) const { return (SA == where) * n * n + (SB == where) * n; }
  // b follows A when both live in the same place.
  KOKKOS_INLINE_FUNCTION int b_offset() const { return SA == SB ? n * n : 0; }

  template <Sharing Where, class P>
  KOKKOS_INLINE_FUNCTION static auto read(const P& p, int k) {
    if constexpr (Where == Sharing::own) return p.own(k);
    else return p.shared(k);
  }
  template <Sharing Where, class G>
  KOKKOS_INLINE_FUNCTION static auto& gradient(const G& p_bar, int k) {
    if constexpr (Where == Sharing::own) return p_bar.own(k);
    else return p_bar.shared(k);
  }
};

struct Mlp {
  static constexpr int state_size = runtime_size;
  static constexpr int max_hidden = 128;
  int n = 0;
  int hidden = 0;

  KOKKOS_INLINE_FUNCTION int size() const { return n; }
  KOKKOS_INLINE_FUNCTION int parameter_count() const { return 0; }
  KOKKOS_INLINE_FUNCTION int shared_parameter_count() const { return 2 * n * hidden + hidden + n; }

  void validate(const std::string& fn) const {
    if (hidden < 1 || hidden > max_hidden)
      detail::throw_invalid(fn, "field", "Mlp::hidden = " + std::to_string(hidden),
                            "1 <= hidden <= " + std::to_string(max_hidden));
  }

  template <class S, class P>
  KOKKOS_INLINE_FUNCTION void operator()(S, const S* y, const P& p, S* dy) const {
    using Kokkos::tanh;
    S activation[max_hidden];
    for (int h = 0; h < hidden; ++h) {
      S z = p.shared(b1() + h);
      for (int j = 0; j < n; ++j) z += p.shared(w1() + h * n + j) * y[j];
      activation[h] = tanh(z);
    }
    for (int i = 0; i < n; ++i) {
      S sum = p.shared(b2() + i);
      for (int h = 0; h < hidden; ++h) sum += p.shared(w2() + i * hidden + h) * activation[h];
      dy[i] = sum;
    }
  }

  template <class T, class P, class G>
  KOKKOS_INLINE_FUNCTION void vjp(T, const T* y, const P& p, const T* g, T* y_bar, const G& p_bar) const {
    T activation[max_hidden];
    for (int h = 0; h < hidden; ++h) {
      T z = p.shared(b1() + h);
      for (int j = 0; j < n; ++j) z += p.shared(w1() + h * n + j) * y[j];
      activation[h] = Kokkos::tanh(z);
    }
    for (int i = 0; i < n; ++i) p_bar.shared(b2() + i) += g[i];
    for (int h = 0; h < hidden; ++h) {
      T activation_bar = 0;
      for (int i = 0; i < n; ++i) {
        activation_bar += p.shared(w2() + i * hidden + h) * g[i];
        p_bar.shared(w2() + i * hidden + h) += g[i] * activation[h];
      }
      const T z_bar = activation_bar * (T(1) - activation[h] * activation[h]);
      p_bar.shared(b1() + h) += z_bar;
      for (int j = 0; j < n; ++j) {
        p_bar.shared(w1() + h * n + j) += z_bar * y[j];
        y_bar[j] += p.shared(w1() + h * n + j) * z_bar;
      }
    }
  }

  // Offsets of the four blocks in the shared parameters.
  KOKKOS_INLINE_FUNCTION int w1() const { return 0; }
  KOKKOS_INLINE_FUNCTION int b1() const { return hidden * n; }
  KOKKOS_INLINE_FUNCTION int w2() const { return hidden * n + hidden; }
  KOKKOS_INLINE_FUNCTION int b2() const { return 2 * hidden * n + hidden; }
};

} // namespace paraseq::ode
