#pragma once
// Vector fields: what the Runge–Kutta loops ask of the user's f(t, y, p) -> dy.
//
// A field is a copyable struct (a functor, no virtual functions) callable on the device:
//
//   struct MyField {
//     static constexpr int state_size = 2;      // n, or paraseq::ode::runtime_size and then:
//     KOKKOS_FUNCTION int size() const;         //   n at run time, 1 <= n <= max_state_size
//     template <class S, class P>
//     KOKKOS_FUNCTION void operator()(S t, const S* y, const P& p, S* dy) const;   // dy = f(t, y, p)
//
//     // Optional: the parameter counts, checked against the parameter Views.
//     KOKKOS_FUNCTION int parameter_count() const;         // per trajectory: params is [N, P]
//     KOKKOS_FUNCTION int shared_parameter_count() const;  // shared by all: shared is [Q]
//     // Optional: the vector-Jacobian product, for gradients. It ADDS to y_bar and p_bar:
//     //   y_bar += (df/dy)^T dy_bar,  p_bar.own(k) += (df/dp_k) . dy_bar,  p_bar.shared(k) += ...
//     template <class T, class P, class G>
//     KOKKOS_FUNCTION void vjp(T t, const T* y, const P& p, const T* dy_bar, T* y_bar, const G& p_bar) const;
//     // Needed only to differentiate per-trajectory parameters without a vjp(); a bound of at most 16
//     // also keeps each trajectory's parameters (and their gradients) in registers:
//     static constexpr int max_parameter_count = 2;
//     // Optional, at most 16: the backward loop then sums each trajectory's part of the shared
//     // parameters' gradients in thread-local storage instead of in device memory at every stage:
//     static constexpr int max_shared_parameter_count = 2;
//     // Optional, on the host: throws std::invalid_argument (naming fn) for a bad configuration.
//     void validate(const std::string& fn) const;
//   };
//
// p.own(k) reads the trajectory's parameter k and p.shared(k) the shared parameter k.
// S is the state's value type, or a Dual (dual.hpp) when paraseq differentiates a field that has
// no vjp(): then n + max_parameter_count must not exceed max_dual_directions, and gradients with
// respect to shared parameters need a vjp(). Fields that should work with duals are templates
// over S and call math functions unqualified (`using Kokkos::tanh; tanh(x)`).

#include <paraseq/core/errors.hpp>
#include <paraseq/loops/dual.hpp>

#include <Kokkos_Core.hpp>

#include <string>
#include <type_traits>

namespace paraseq::ode {

// state_size of a field whose n is known only at run time.
inline constexpr int runtime_size = 0;
// The largest n: a trajectory's stages stay in registers or thread-local memory.
inline constexpr int max_state_size = 64;
// The most directions the dual-number fallback differentiates at once (n + parameters).
inline constexpr int max_dual_directions = 16;

// Stands for an absent View: no parameters, no output, no cotangent, no gradient.
struct NoView {};

template <class V>
inline constexpr bool is_given_v = !std::is_same_v<V, NoView>;

// One trajectory's parameters: own(k) from the [N, P] View's row, shared(k) from the [Q] View.
template <class T>
struct ParameterAccess {
  const T* own_data = nullptr;
  long own_stride = 0;
  const T* shared_data = nullptr;
  long shared_stride = 0;

  KOKKOS_INLINE_FUNCTION T own(int k) const { return own_data[k * own_stride]; }
  KOKKOS_INLINE_FUNCTION T shared(int k) const { return shared_data[k * shared_stride]; }
};

// Where a vjp() adds parameter gradients. A gradient that is not wanted goes to a sink: a single
// element with stride 0, so fields never test what was requested.
template <class T>
struct ParameterGradients {
  T* own_data = nullptr;
  long own_stride = 0;
  T* shared_data = nullptr;
  long shared_stride = 0;

  KOKKOS_INLINE_FUNCTION T& own(int k) const { return own_data[k * own_stride]; }
  KOKKOS_INLINE_FUNCTION T& shared(int k) const { return shared_data[k * shared_stride]; }
};

template <class Field, class T>
concept FieldWithVjp = requires(const Field& field, T t, const T* y, const ParameterAccess<T>& p, const T* dy_bar,
                                T* y_bar, const ParameterGradients<T>& p_bar) {
  field.vjp(t, y, p, dy_bar, y_bar, p_bar);
};

namespace detail {

using paraseq::detail::require_extents;
using paraseq::detail::shape_of;
using paraseq::detail::throw_invalid;

template <class Field>
concept HasParameterCount = requires(const Field& field) {
  { field.parameter_count() } -> std::convertible_to<int>;
};
template <class Field>
concept HasSharedParameterCount = requires(const Field& field) {
  { field.shared_parameter_count() } -> std::convertible_to<int>;
};
template <class Field>
concept HasMaxParameterCount = requires { Field::max_parameter_count; };

template <class Field>
concept HasValidate = requires(const Field& field, const std::string& fn) { field.validate(fn); };

// The pieces every field needs (the top of this file), each checked on its own so that a field
// that misses one gets one message saying what to write.
template <class Field>
concept HasStateSize = requires {
  { Field::state_size } -> std::convertible_to<int>;
};
template <class Field>
concept HasRuntimeSize = requires(const Field& field) {
  { field.size() } -> std::convertible_to<int>;
};
template <class Field, class S, class P>
concept FieldCallable = requires(const Field& field, S t, const S* y, const P& p, S* dy) { field(t, y, p, dy); };

template <class Field>
KOKKOS_INLINE_FUNCTION int field_size(const Field& field) {
  if constexpr (Field::state_size == runtime_size) return field.size();
  else return Field::state_size;
}

// n as a compile-time constant when the field fixes it, so that loops over the components unroll
// and the stages stay in registers instead of thread-local memory.
template <class Field>
KOKKOS_FORCEINLINE_FUNCTION constexpr int known_size(int n) {
  if constexpr (Field::state_size == runtime_size) return n;
  else return Field::state_size;
}

// One trajectory's own parameters copied into registers, for a field that bounds their number
// with max_parameter_count <= 16; shared ones are read where they are.
template <class T, int P>
struct RegisterParameters {
  T own_values[P];
  const T* shared_data = nullptr;
  long shared_stride = 0;

  KOKKOS_INLINE_FUNCTION T own(int k) const { return own_values[k]; }
  KOKKOS_INLINE_FUNCTION T shared(int k) const { return shared_data[k * shared_stride]; }
};

template <class Field>
constexpr int count_register_parameters() {
  if constexpr (HasMaxParameterCount<Field>) return Field::max_parameter_count <= 16 ? Field::max_parameter_count : 0;
  else return 0;
}
template <class Field>
inline constexpr int register_parameters = count_register_parameters<Field>();

template <class Field>
concept HasMaxSharedParameterCount = requires { Field::max_shared_parameter_count; };

// The shared parameters' gradient sums kept in thread-local storage by the backward loop (a local
// array: registers or the L1-cached local memory, as the compiler places it): a field that bounds
// their number with max_shared_parameter_count <= 16.
template <class Field>
constexpr int count_register_shared_parameters() {
  if constexpr (HasMaxSharedParameterCount<Field>)
    return Field::max_shared_parameter_count <= 16 ? Field::max_shared_parameter_count : 0;
  else return 0;
}
template <class Field>
inline constexpr int register_shared_parameters = count_register_shared_parameters<Field>();

// What kernels hand to a field as p: registers when it bounds its own parameters, else memory.
template <class Field, class T>
using ParametersFor = std::conditional_t<(register_parameters<Field> > 0),
                                         RegisterParameters<T, register_parameters<Field>>, ParameterAccess<T>>;

// `count` own parameters from memory, in the form ParametersFor<Field, T>.
template <class Field, class T>
KOKKOS_INLINE_FUNCTION ParametersFor<Field, T> parameters_for(const ParameterAccess<T>& memory, int count) {
  if constexpr (register_parameters<Field> > 0) {
    ParametersFor<Field, T> registers{{}, memory.shared_data, memory.shared_stride};
    for (int k = 0; k < register_parameters<Field>; ++k) registers.own_values[k] = k < count ? memory.own(k) : T(0);
    return registers;
  } else {
    return memory;
  }
}

// Parameters seen by a field evaluated on duals: own(k) is a dual seeded along its direction when
// the P own parameters are differentiated, a constant otherwise.
template <class S, int P, class Base>
struct DualParameters {
  Base values;
  S seeded[P > 0 ? P : 1];

  KOKKOS_INLINE_FUNCTION S own(int k) const {
    if constexpr (P > 0) return seeded[k];
    else return S(values.own(k));
  }
  KOKKOS_INLINE_FUNCTION auto shared(int k) const { return values.shared(k); }
};

// What solve() asks of a field whose state holds T (the loops call f with S = T and p as
// ParametersFor<Field, T>).
template <class Field, class T>
constexpr void check_field_type() {
  static_assert(std::is_copy_constructible_v<Field>, "paraseq::ode: the field must be a copyable functor");
  static_assert(HasStateSize<Field>,
                "paraseq::ode field: declare `static constexpr int state_size = n;` (1 <= n <= 64), or "
                "`static constexpr int state_size = paraseq::ode::runtime_size;` with `KOKKOS_FUNCTION int size() "
                "const` returning n");
  if constexpr (HasStateSize<Field>) {
    static_assert(Field::state_size == runtime_size || (Field::state_size >= 1 && Field::state_size <= max_state_size),
                  "paraseq::ode field: state_size must be runtime_size or within 1..max_state_size (64)");
    static_assert(Field::state_size != runtime_size || HasRuntimeSize<Field>,
                  "paraseq::ode field: state_size = runtime_size needs `KOKKOS_FUNCTION int size() const` returning "
                  "n (1 <= n <= 64) at run time");
  }
  static_assert(FieldCallable<Field, T, ParametersFor<Field, T>>,
                "paraseq::ode field: provide `template <class S, class P> KOKKOS_FUNCTION void operator()(S t, "
                "const S* y, const P& p, S* dy) const` computing dy = f(t, y, p) (p.own(k) and p.shared(k) read the "
                "parameters); it is called with S = the value type of y0 and P = a parameter accessor of paraseq's");
}

// What solve_with_gradient asks beyond solve(): a field without vjp() is evaluated on dual numbers.
template <class Field, class T>
constexpr void check_field_gradient() {
  using S = Dual<T, 1>;
  static_assert(FieldWithVjp<Field, T> || FieldCallable<Field, S, DualParameters<S, 0, ParametersFor<Field, T>>>,
                "paraseq::ode field: a field without vjp() is differentiated with dual numbers, so its operator() "
                "must be a template over S and P: `template <class S, class P> KOKKOS_FUNCTION void operator()(S t, "
                "const S* y, const P& p, S* dy) const` with math called unqualified (`using Kokkos::tanh; "
                "tanh(x)`); or give the field `template <class T, class P, class G> KOKKOS_FUNCTION void vjp(T t, "
                "const T* y, const P& p, const T* dy_bar, T* y_bar, const G& p_bar) const`");
}

// The vjp of a field without one, by forward mode: one evaluation on duals seeded along y's n
// directions and, when differentiated, the P_max parameter directions after them.
template <int Capacity, bool WithParameters, class Field, class T, class Params>
KOKKOS_INLINE_FUNCTION void dual_vjp(const Field& field, int n, int parameters, T t, const T* y, const Params& p,
                                     const T* dy_bar, T* y_bar, const ParameterGradients<T>& p_bar) {
  constexpr int P = WithParameters ? Field::max_parameter_count : 0;
  constexpr int D = Capacity + P;
  static_assert(D <= max_dual_directions,
                "paraseq::ode: a field without vjp() is differentiated with dual numbers, which needs n (its "
                "state capacity) + max_parameter_count <= max_dual_directions (16); give the field a vjp()");
  using S = Dual<T, D>;
  S ys[Capacity], dys[Capacity];
  for (int i = 0; i < n; ++i) ys[i] = S::variable(y[i], i);
  DualParameters<S, P, Params> dual_p{p, {}};
  for (int k = 0; k < P && k < parameters; ++k) dual_p.seeded[k] = S::variable(p.own(k), Capacity + k);
  field(S(t), ys, dual_p, dys);
  for (int j = 0; j < n; ++j) {
    T sum = 0;
    for (int i = 0; i < n; ++i) sum += dy_bar[i] * dys[i].grad[j];
    y_bar[j] += sum;
  }
  for (int k = 0; k < P && k < parameters; ++k) {
    T sum = 0;
    for (int i = 0; i < n; ++i) sum += dy_bar[i] * dys[i].grad[Capacity + k];
    p_bar.own(k) += sum;
  }
}

// y_bar += J_y^T dy_bar and the parameter gradients, through the field's vjp() or dual numbers.
template <int Capacity, bool WithParameters, class Field, class T, class Params>
KOKKOS_INLINE_FUNCTION void field_vjp(const Field& field, int n, int parameters, T t, const T* y, const Params& p,
                                      const T* dy_bar, T* y_bar, const ParameterGradients<T>& p_bar) {
  if constexpr (FieldWithVjp<Field, T>) field.vjp(t, y, p, dy_bar, y_bar, p_bar);
  else dual_vjp<Capacity, WithParameters>(field, n, parameters, t, y, p, dy_bar, y_bar, p_bar);
}

} // namespace detail

} // namespace paraseq::ode
