// Fields that each miss one piece of the field concept (src/loops/field.hpp). Compiled by the
// paraseq_field_concept_* tests with one PARASEQ_BAD_FIELD_* macro defined; each must fail with
// the static_assert that names the missing piece (unit_tests/CMakeLists.txt).
#include <paraseq/loops/integrate.hpp>

#include <Kokkos_Core.hpp>

namespace ode = paraseq::ode;

#if defined(PARASEQ_BAD_FIELD_NO_STATE_SIZE)
struct BadField { // no state_size
  template <class S, class P>
  KOKKOS_FUNCTION void operator()(S, const S* y, const P&, S* dy) const { dy[0] = -y[0]; }
};
#elif defined(PARASEQ_BAD_FIELD_NO_SIZE)
struct BadField { // runtime_size without size()
  static constexpr int state_size = ode::runtime_size;
  template <class S, class P>
  KOKKOS_FUNCTION void operator()(S, const S* y, const P&, S* dy) const { dy[0] = -y[0]; }
};
#elif defined(PARASEQ_BAD_FIELD_NO_CALL)
struct BadField { // no operator()
  static constexpr int state_size = 1;
};
#elif defined(PARASEQ_BAD_FIELD_NOT_A_TEMPLATE)
struct BadField { // operator() for double only: not differentiable with dual numbers
  static constexpr int state_size = 1;
  KOKKOS_FUNCTION void operator()(double, const double* y, const ode::ParameterAccess<double>&, double* dy) const {
    dy[0] = -y[0];
  }
};
#endif

void integrate_bad_field() {
  Kokkos::View<double**> y0("y0", 1, 1), y1("y1", 1, 1), w("w", 1, 1), y0_bar("y0_bar", 1, 1);
  const auto problem = ode::problem(BadField{}, y0);
  const auto steps = ode::FixedSteps::count(0, 0.1, 10);
#if defined(PARASEQ_BAD_FIELD_NOT_A_TEMPLATE)
  ode::solve_with_gradient(Kokkos::DefaultExecutionSpace{}, ode::RK4{}, problem, steps, ode::final_state(y1),
                           ode::final_state(w), ode::Gradients<decltype(y0_bar)>{y0_bar});
#else
  ode::solve(Kokkos::DefaultExecutionSpace{}, ode::RK4{}, problem, steps, ode::final_state(y1));
#endif
}
