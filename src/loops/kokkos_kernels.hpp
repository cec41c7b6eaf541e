#pragma once
// KokkosODE (Kokkos Kernels) on paraseq problems, for comparisons: each trajectory of a batch is
// one KokkosODE::Experimental::RungeKutta<Type>::Solve call in a parallel_for, with the field
// seen through KokkosODE's interface (neqs, evaluate_function(t, dt, y, f)). Available when
// paraseq is built with Kokkos Kernels (PARASEQ_HAVE_KOKKOSKERNELS).

#include <paraseq/loops/field.hpp>
#include <paraseq/loops/integrate.hpp>
#include <paraseq/loops/options.hpp>

#include <KokkosODE_RungeKutta.hpp>
#include <Kokkos_Core.hpp>

#include <string>

namespace paraseq::ode {

namespace detail {

// One trajectory's field, as KokkosODE calls it.
template <class Field, class T, int Capacity>
struct KokkosOdeField {
  Field field;
  int neqs;
  ParameterAccess<T> p;

  template <class YView, class FView>
  KOKKOS_FUNCTION void evaluate_function(T t, T, const YView& y, const FView& f) const {
    T ys[Capacity], fs[Capacity];
    for (int k = 0; k < neqs; ++k) ys[k] = y(k);
    field(t, ys, p, fs);
    for (int k = 0; k < neqs; ++k) f(k) = fs[k];
  }
};

// One KokkosODE Solve per trajectory i, with its work arrays in rows of the batch's Views.
template <class Solver, class Field, class T, int Capacity, class Mem, class YEnd>
struct KokkosOdeSolve {
  Field field;
  ForwardData<T> data;
  KokkosODE::Experimental::ODE_params params;
  double t0, t_end;
  Kokkos::View<T**, Kokkos::LayoutRight, Mem> y_old, y_new, temp;
  Kokkos::View<T***, Kokkos::LayoutRight, Mem> stages;
  Kokkos::View<int*, Mem> status, steps;
  YEnd y_end;

  KOKKOS_FUNCTION void operator()(int i) const {
    const KokkosOdeField<Field, T, Capacity> ode{field, Capacity, data.parameters(i)};
    auto y0_i = Kokkos::subview(y_old, i, Kokkos::ALL);
    for (int k = 0; k < Capacity; ++k) y0_i(k) = data.y0(i, k);
    auto y_i = Kokkos::subview(y_new, i, Kokkos::ALL);
    status(i) = int(Solver::Solve(ode, params, T(t0), T(t_end), y0_i, y_i, Kokkos::subview(temp, i, Kokkos::ALL),
                                  Kokkos::subview(stages, i, Kokkos::ALL, Kokkos::ALL), &steps(i)));
    for (int k = 0; k < Capacity; ++k) y_end(i, k) = y_i(k);
  }
};

} // namespace detail

// Integrates every trajectory from t0 to t_end with KokkosODE's method `Type` and `params`
// (ODE_params(num_steps) for fixed steps), writing y_end [N, n]. Returns each trajectory's
// KokkosODE status (0: success) and, in `steps`, its step count.
template <KokkosODE::Experimental::RK_type Type, class Space, class Field, class Y0, class Params, class YEnd>
Kokkos::View<int*, typename Space::memory_space>
kokkos_ode_solve(const Space& space, const Problem<Field, Y0, Params, NoView>& problem, double t0, double t_end,
                 const KokkosODE::Experimental::ODE_params& params, const YEnd& y_end,
                 const Kokkos::View<int*, typename Space::memory_space>& steps) {
  using T = typename Y0::non_const_value_type;
  using Mem = typename Space::memory_space;
  using Solver = KokkosODE::Experimental::RungeKutta<Type>;
  static_assert(Field::state_size != runtime_size, "paraseq::ode::kokkos_ode_solve: the field's n must be fixed at compile time");
  constexpr int n = Field::state_size;
  const std::string fn = "paraseq::ode::kokkos_ode_solve";
  const int N = int(problem.y0.extent(0));
  detail::require_extents(fn, "y_end", y_end, {N, n}, "[N, n], the shape of y0");
  detail::require_extents(fn, "steps", steps, {N}, "[N]");

  Kokkos::View<T**, Kokkos::LayoutRight, Mem> y_old("paraseq::ode::kokkos_ode_y_old", N, n),
      y_new("paraseq::ode::kokkos_ode_y_new", N, n), temp("paraseq::ode::kokkos_ode_temp", N, n);
  Kokkos::View<T***, Kokkos::LayoutRight, Mem> stages("paraseq::ode::kokkos_ode_stages", N, Solver::num_stages(), n);
  Kokkos::View<int*, Mem> status("paraseq::ode::kokkos_ode_status", N);
  const auto data = detail::ForwardData<T>{detail::strided2<const T>(problem.y0), detail::strided2<const T>(problem.params)};
  using solve_t = detail::KokkosOdeSolve<Solver, Field, T, n, Mem, YEnd>;
  Kokkos::parallel_for("paraseq::ode::kokkos_ode_solve", Kokkos::RangePolicy<Space>(space, 0, N),
                       solve_t{problem.field, data, params, t0, t_end, y_old, y_new, temp, stages, status, steps, y_end});
  return status;
}

} // namespace paraseq::ode
