#pragma once
// The arithmetic of one Runge–Kutta step of one trajectory, on the device: the stages, the error
// norm, the dense output and the reverse (adjoint) sweep through the stages. The state lives in
// arrays of Capacity >= n values; with n and the tableau known at compile time every loop below
// unrolls and the stages stay in registers. Tableau coefficients enter as compile-time constants,
// so zero coefficients cost nothing.

#include <paraseq/loops/field.hpp>
#include <paraseq/loops/tableaus.hpp>

#include <Kokkos_Core.hpp>

#include <type_traits>

namespace paraseq::ode::detail {

template <int Begin, int End, class F>
KOKKOS_FORCEINLINE_FUNCTION constexpr void static_for(const F& f) {
  if constexpr (Begin < End) {
    f(std::integral_constant<int, Begin>{});
    static_for<Begin + 1, End>(f);
  }
}

// End-1 down to Begin.
template <int Begin, int End, class F>
KOKKOS_FORCEINLINE_FUNCTION constexpr void static_for_reverse(const F& f) {
  if constexpr (Begin < End) {
    f(std::integral_constant<int, End - 1>{});
    static_for_reverse<Begin, End - 1>(f);
  }
}

// Tableau entries through constexpr functions: device code may read a constexpr array's elements
// only in constant expressions of such functions (CUDA's rule for host constexpr variables).
template <class Method>
struct Coefficients {
  KOKKOS_INLINE_FUNCTION static constexpr double a(int i, int j) { return Method::a[i][j]; }
  KOKKOS_INLINE_FUNCTION static constexpr double b(int i) { return Method::b[i]; }
  KOKKOS_INLINE_FUNCTION static constexpr double c(int i) { return Method::c[i]; }
};

// Coefficient rows as types, so that every coefficient is a constant expression.
template <class Method, int I>
struct RowOfA {
  KOKKOS_INLINE_FUNCTION static constexpr double at(int j) { return Method::a[I][j]; }
};
template <class Method>
struct Weights {
  KOKKOS_INLINE_FUNCTION static constexpr double at(int j) { return Method::b[j]; }
};
template <class Method>
struct ErrorWeights {
  KOKKOS_INLINE_FUNCTION static constexpr double at(int j) { return Method::b[j] - Method::b_hat[j]; }
};

template <class Row, int Count>
KOKKOS_INLINE_FUNCTION constexpr int first_nonzero() {
  for (int j = 0; j < Count; ++j)
    if (Row::at(j) != 0) return j;
  return Count;
}

// sum_{j < Count} Row_j K_j[c], in stage order over the nonzero coefficients (0 if none).
template <class Row, int Count, class T, class Stages>
KOKKOS_FORCEINLINE_FUNCTION T weighted_stages(const Stages& K, int c) {
  constexpr int first = first_nonzero<Row, Count>();
  if constexpr (first == Count) return T(0);
  else {
    constexpr double w_first = Row::at(first);
    T sum = T(w_first) * K[first][c];
    static_for<first + 1, Count>([&](auto J) {
      constexpr double w = Row::at(decltype(J)::value);
      if constexpr (w != 0) sum += T(w) * K[decltype(J)::value][c];
    });
    return sum;
  }
}

// Per-component tolerances (scalars are stored as n equal values).
template <class T>
struct Tolerances {
  const T* rtol = nullptr;
  const T* atol = nullptr;
};

// A field of run-time size is a loop nest of its own (Linear, Mlp): called from every stage rather
// than inlined into each of them and into their reverse sweep, it is compiled once per kernel instead
// of up to twice per stage, which was most of the device compiler's time for such a field. The call
// costs little next to the loops; a field of compile-time size stays inlined, in registers.
template <class Field, class T, class P>
KOKKOS_FUNCTION __attribute__((noinline)) void evaluate_called(const Field& field, T t, const T* y, const P& p, T* dy) {
  field(t, y, p, dy);
}

template <int Capacity, bool WithParameters, class Field, class T, class P>
KOKKOS_FUNCTION __attribute__((noinline)) void vjp_called(const Field& field, int n, int parameters, T t, const T* y,
                                                         const P& p, const T* dy_bar, T* y_bar,
                                                         const ParameterGradients<T>& p_bar) {
  field_vjp<Capacity, WithParameters>(field, n, parameters, t, y, p, dy_bar, y_bar, p_bar);
}

template <class Method, class Field, class T, int Capacity, class Params = ParameterAccess<T>>
struct RkStep {
  static constexpr bool called_field = Field::state_size == runtime_size;
  static constexpr int S = Method::stages;
  using Stages = T[S][Capacity];

  const Field& field;
  int n;
  Params p;

  KOKKOS_FORCEINLINE_FUNCTION constexpr int size() const { return known_size<Field>(n); }

  KOKKOS_FORCEINLINE_FUNCTION void evaluate(T t, const T* y, T* dy) const {
    if constexpr (called_field) evaluate_called(field, t, y, p, dy);
    else field(t, y, p, dy);
  }

  // out = y + h sum_j Row_j K_j.
  template <class Row, int Count>
  KOKKOS_FORCEINLINE_FUNCTION void combine(T h, const T* y, const Stages& K, T* out) const {
    for (int c = 0; c < size(); ++c) {
      if constexpr (first_nonzero<Row, Count>() == Count) out[c] = y[c];
      else out[c] = y[c] + h * weighted_stages<Row, Count, T>(K, c);
    }
  }

  // The time of stage i: stages with c_i = 1 use t_next, the step's end as the caller defines it.
  template <int I>
  KOKKOS_FORCEINLINE_FUNCTION static T stage_time(T t, T h, T t_next) {
    constexpr double c_i = Coefficients<Method>::c(I);
    if constexpr (c_i == 1) return t_next;
    else return t + T(c_i) * h;
  }

  // Given K[0] = f(t, y), fills K[1..S-1], stage i's input Y_i = y + h sum_{j<i} a_ij K_j going to
  // input_of(i) (an array of Capacity values, which later stages may reuse).
  template <class InputOf>
  KOKKOS_FORCEINLINE_FUNCTION void stage_loop(T t, T h, T t_next, const T* y, Stages& K, const InputOf& input_of) const {
    static_for<1, S>([&](auto I) {
      constexpr int i = decltype(I)::value;
      T* Y = input_of(I);
      combine<RowOfA<Method, i>, i>(h, y, K, Y);
      evaluate(stage_time<i>(t, h, t_next), Y, K[i]);
    });
  }

  // Given K[0] = f(t, y), fills K[1..S-1] and y_next (which must not alias y). FSAL methods take
  // y_next as their last stage's input, so K[S-1] = f(t_next, y_next) is the next step's K[0],
  // bit for bit.
  KOKKOS_FUNCTION void stages(T t, T h, T t_next, const T* y, Stages& K, T* y_next) const {
    T input[Capacity];
    stage_loop(t, h, t_next, y, K, [&](auto I) { return (Method::fsal && decltype(I)::value == S - 1) ? y_next : input; });
    if constexpr (!Method::fsal) combine<Weights<Method>, S>(h, y, K, y_next);
  }

  // RMS over components of the local error estimate divided by atol + rtol max(|y|, |y_next|).
  KOKKOS_FUNCTION T error_norm(T h, const T* y, const T* y_next, const Stages& K, const Tolerances<T>& tol) const {
    T sum = 0;
    for (int c = 0; c < size(); ++c) {
      const T error = h * weighted_stages<ErrorWeights<Method>, S, T>(K, c);
      const T scale = tol.atol[c] + tol.rtol[c] * Kokkos::max(Kokkos::abs(y[c]), Kokkos::abs(y_next[c]));
      sum += (error / scale) * (error / scale);
    }
    return Kokkos::sqrt(sum / T(size()));
  }

  // The dense output at t + theta h: y + h sum_j w_j(theta) K_j.
  KOKKOS_FUNCTION void dense(T theta, T h, const T* y, const Stages& K, T* out) const {
    T w[S];
    Method::dense_weights(theta, w);
    for (int c = 0; c < size(); ++c) {
      T sum = 0;
      static_for<0, S>([&](auto J) { sum += w[decltype(J)::value] * K[decltype(J)::value][c]; });
      out[c] = y[c] + h * sum;
    }
  }

  // --- Reverse mode. With y_next = y + h sum_i b_i K_i, K_i = f(t + c_i h, Y_i) and
  // Y_i = y + h sum_{j<i} a_ij K_j, the cotangents flow back as
  //   K_bar_i = h b_i lambda_next (+ dense-output seeds),  Y_bar_i = J_f(Y_i)^T K_bar_i,
  //   K_bar_j += h a_ij Y_bar_i (j < i),                    y_bar = lambda_next + sum_i Y_bar_i.

  // The stages' inputs again from y, the same values as the step computed (Y[0] is not written:
  // stage 0's input is y itself). The reverse sweep differentiates the field at them; the step's
  // end, which it does not need, is not formed.
  KOKKOS_FUNCTION void recompute(T t, T h, T t_next, const T* y, Stages& Y) const {
    Stages K;
    evaluate(t, y, K[0]);
    stage_loop(t, h, t_next, y, K, [&](auto I) { return Y[decltype(I)::value]; });
  }

  // K_bar_i = h b_i lambda_next.
  KOKKOS_FUNCTION void seed(T h, const T* lambda_next, Stages& K_bar) const {
    static_for<0, S>([&](auto I) {
      constexpr double b_i = Coefficients<Method>::b(decltype(I)::value);
      for (int c = 0; c < size(); ++c) K_bar[decltype(I)::value][c] = h * T(b_i) * lambda_next[c];
    });
  }

  // A dense output at theta with cotangent g: K_bar_i += h w_i(theta) g (y_bar += g is the caller's).
  KOKKOS_FUNCTION void seed_dense(T theta, T h, const T* g, Stages& K_bar) const {
    T w[S];
    Method::dense_weights(theta, w);
    static_for<0, S>([&](auto I) {
      for (int c = 0; c < size(); ++c) K_bar[decltype(I)::value][c] += h * w[decltype(I)::value] * g[c];
    });
  }

  // Consumes K_bar and adds the stages' contributions to y_bar and the parameter gradients; Y holds
  // the stages' inputs (recompute) and y the step's start. An FSAL method's last stage has b = 0:
  // it is skipped unless a dense output seeded it.
  template <bool WithParameters>
  KOKKOS_FUNCTION void sweep(T t, T h, T t_next, const T* y, const Stages& Y, Stages& K_bar, T* y_bar,
                             const ParameterGradients<T>& p_bar, int parameters, bool last_stage_seeded) const {
    T Y_bar[Capacity];
    static_for_reverse<0, S>([&](auto I) {
      constexpr int i = decltype(I)::value;
      if constexpr (i == S - 1 && Coefficients<Method>::b(S - 1) == 0) {
        if (!last_stage_seeded) return;
      }
      const T* input = i == 0 ? y : Y[i];
      for (int c = 0; c < size(); ++c) Y_bar[c] = 0;
      if constexpr (called_field)
        vjp_called<Capacity, WithParameters>(field, size(), parameters, stage_time<i>(t, h, t_next), input, p,
                                             K_bar[i], Y_bar, p_bar);
      else
        field_vjp<Capacity, WithParameters>(field, size(), parameters, stage_time<i>(t, h, t_next), input, p,
                                            K_bar[i], Y_bar, p_bar);
      for (int c = 0; c < size(); ++c) y_bar[c] += Y_bar[c];
      static_for<0, i>([&](auto J) {
        constexpr double a_ij = Coefficients<Method>::a(i, decltype(J)::value);
        if constexpr (a_ij != 0)
          for (int c = 0; c < size(); ++c) K_bar[decltype(J)::value][c] += h * T(a_ij) * Y_bar[c];
      });
    });
  }
};

} // namespace paraseq::ode::detail
