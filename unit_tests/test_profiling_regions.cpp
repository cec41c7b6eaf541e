// Every public call opens a Kokkos profiling region named after it (what a Kokkos Tools profiler or
// Nsight Systems through the NVTX connector shows), and closes it also when the call throws; on
// every enabled execution space. The regions are seen through the Tools callbacks that such a
// profiler registers.

#include <paraseq/loops/fields.hpp>
#include <paraseq/loops/integrate.hpp>
#include <paraseq/solvers/cell_step.hpp>
#include <paraseq/solvers/cells.hpp>
#include <paraseq/solvers/newton.hpp>
#include <paraseq/solvers/newton_backward.hpp>

#include "test_support.hpp"

#include <gmock/gmock.h>

#include <string>
#include <vector>

namespace {

using namespace paraseq;
using namespace paraseq::test;
using ::testing::ElementsAre;

// The regions opened while a Recorder lives (outermost first) and how many are still open.
struct Recorder {
  static inline std::vector<std::string> opened;
  static inline int open = 0;
  Recorder() {
    opened.clear();
    open = 0;
    Kokkos::Tools::Experimental::set_push_region_callback([](const char* name) {
      opened.emplace_back(name);
      ++open;
    });
    Kokkos::Tools::Experimental::set_pop_region_callback([] { --open; });
  }
  ~Recorder() {
    Kokkos::Tools::Experimental::set_push_region_callback(nullptr);
    Kokkos::Tools::Experimental::set_pop_region_callback(nullptr);
  }
};

template <class Space>
class ProfilingRegions : public ::testing::Test {};
TYPED_TEST_SUITE(ProfilingRegions, ExecutionSpaces, SpaceName);

TYPED_TEST(ProfilingRegions, ScansAndNewtonCallsOpenTheirRegions) {
  using Space = TypeParam;
  using Mem = typename Space::memory_space;
  const int B = 2, T = 16, H = 3;
  View3<double, Space> A("A", B, T, H), b("b", B, T, H), h("h", B, T, H), lambda("lambda", B, T, H);
  fill_uniform(A, -0.9, 0.9, 1);
  fill_uniform(b, -1, 1, 2);
  View2<double, Space> a("a", 3, H), u_t("u_t", B, 3 * H), h_t("h_t", B, H);
  fill_uniform(a, -0.9, 0.9, 3);
  View3<double, Space> u("u", B, T, 3 * H), du("du", B, T, 3 * H);
  fill_uniform(u, -1, 1, 4);
  View1<double, Space> dparams("dparams", 3 * H);
  const ParaGRU<double, Mem> cell{a};
  {
    Recorder recorder;
    linear_scan(Space{}, Diagonal{}, A, b, h);
    linear_scan_reverse(Space{}, Diagonal{}, A, b, lambda);
    newton_solve(Space{}, cell, u, h);
    newton_backward(Space{}, cell, u, h, b, du, dparams);
    cell_step(Space{}, cell, u_t, ZeroInitialState{}, h_t);
    EXPECT_THAT(Recorder::opened, ElementsAre("paraseq::linear_scan", "paraseq::linear_scan_reverse", "paraseq::newton_solve",
                                              "paraseq::newton_backward", "paraseq::cell_step", "paraseq::newton_solve"));
    EXPECT_EQ(Recorder::open, 0);
  }
  Recorder recorder;
  View3<double, Space> b_short("b", B, T - 1, H);
  EXPECT_THROW(linear_scan(Space{}, Diagonal{}, A, b_short, h), std::invalid_argument);
  EXPECT_THAT(Recorder::opened, ElementsAre("paraseq::linear_scan"));
  EXPECT_EQ(Recorder::open, 0) << "a call that throws closes its region";
}

TYPED_TEST(ProfilingRegions, RungeKuttaCallsOpenTheirRegions) {
  using Space = TypeParam;
  const int N = 3;
  View2<double, Space> y0("y0", N, 2), params("params", N, 2), y1("y1", N, 2), w("w", N, 2), y0_bar("y0_bar", N, 2),
      params_bar("params_bar", N, 2);
  fill_uniform(y0, -1, 1, 5);
  fill_uniform(params, 0.5, 1.5, 6);
  fill_uniform(w, -1, 1, 7);
  const auto problem = ode::problem(ode::DampedOscillator{}, y0, params);
  const auto steps = ode::FixedSteps::count(0, 0.1, 10);
  Recorder recorder;
  ode::solve(Space{}, ode::RK4{}, problem, steps, ode::final_state(y1));
  ode::solve_with_gradient(Space{}, ode::RK4{}, problem, steps, ode::final_state(y1), ode::final_state(w),
                           ode::Gradients<decltype(y0_bar), decltype(params_bar)>{y0_bar, params_bar});
  EXPECT_THAT(Recorder::opened, ElementsAre("paraseq::ode::solve", "paraseq::ode::solve_with_gradient"));
  EXPECT_EQ(Recorder::open, 0);
}

} // namespace
