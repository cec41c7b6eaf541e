// NewtonConfig behaviour (early stop, divergence, Picard restarts, damping, the compile-safe preset,
// the automatic mode) and the errors bad input raises, on every enabled execution space.

#include <paraseq/solvers/cells.hpp>
#include <paraseq/solvers/input_projection.hpp>
#include <paraseq/solvers/newton.hpp>
#include <paraseq/solvers/newton_backward.hpp>

#include "test_support.hpp"

#include <gmock/gmock.h>

#include <cmath>
#include <functional>

namespace {

using namespace paraseq;
using namespace paraseq::test;
using ::testing::AllOf;
using ::testing::HasSubstr;

template <class Space>
struct Gru {
  using cell_type = ParaGRU<double, typename Space::memory_space>;
  View2<double, Space> a;
  View3<double, Space> u, h;
  Gru(int B, int T_steps, int H, double a_bound, unsigned seed)
      : a("a", 3, H), u("u", B, T_steps, 3 * H), h("h", B, T_steps, H) {
    fill_uniform(a, -a_bound, a_bound, seed);
    fill_uniform(u, -0.5, 0.5, seed + 1);
  }
  cell_type cell() const { return {a}; }
  // The sequential loop of this library, itself checked against a float64 loop in test_newton.cpp.
  View3<double, Space> sequential() const {
    View3<double, Space> reference("reference", h.extent(0), h.extent(1), h.extent(2));
    NewtonConfig config;
    config.mode = NewtonMode::sequential;
    newton_solve(Space{}, cell(), u, reference, config);
    return reference;
  }
};

template <class Space>
class NewtonConfiguration : public ::testing::Test {};
TYPED_TEST_SUITE(NewtonConfiguration, ExecutionSpaces, SpaceName);

TYPED_TEST(NewtonConfiguration, ResidualAtolStopsEarly) {
  using Space = TypeParam;
  Gru<Space> problem(2, 1000, 4, 0.5, 1);
  NewtonConfig config;
  config.mode = NewtonMode::newton;
  config.max_iters = 20;
  config.residual_atol = 1e-12;
  NewtonStats<typename Space::memory_space> stats;
  newton_solve(Space{}, problem.cell(), problem.u, problem.h, config, ZeroInitialState{}, &stats);
  EXPECT_GE(stats.iterations, 2);
  EXPECT_LE(stats.iterations, 5); // quadratic convergence from f(0, u)
  auto residual = to_host(stats.residual);
  auto converged = to_host(stats.converged);
  for (int b = 0; b < 2; ++b) {
    EXPECT_LE(residual(b), 1e-12);
    EXPECT_EQ(converged(b), 1);
  }
  EXPECT_LE(max_relative_error(problem.h, to_host(problem.sequential())), 1e-11);
}

TYPED_TEST(NewtonConfiguration, ResidualFailRaisesOnNonFiniteInput) {
  using Space = TypeParam;
  Gru<Space> problem(2, 300, 3, 0.5, 11);
  Kokkos::deep_copy(Kokkos::subview(problem.u, 1, 50, 4), NAN);
  NewtonConfig config;
  config.residual_fail = 1e-6;
  for (NewtonMode mode : {NewtonMode::newton, NewtonMode::fused, NewtonMode::sequential}) {
    SCOPED_TRACE("mode=" + std::to_string(int(mode)));
    config.mode = mode;
    try {
      newton_solve(Space{}, problem.cell(), problem.u, problem.h, config);
      ADD_FAILURE() << "no NewtonDivergenceError";
    } catch (const NewtonDivergenceError& e) {
      EXPECT_TRUE(std::isinf(e.residual()));
      EXPECT_EQ(e.iteration(), mode == NewtonMode::sequential ? 0 : 3);
    }
  }
}

// Without residual_fail a NaN in u gives NaN in h, from its step on, in its batch element only.
TYPED_TEST(NewtonConfiguration, NonFiniteInputGivesNaNWithoutResidualFail) {
  using Space = TypeParam;
  Gru<Space> problem(2, 300, 3, 0.5, 21);
  Kokkos::deep_copy(Kokkos::subview(problem.u, 1, 50, 4), NAN); // batch 1, step 50, gate r of channel 1
  for (NewtonMode mode : {NewtonMode::newton, NewtonMode::fused, NewtonMode::sequential}) {
    SCOPED_TRACE("mode=" + std::to_string(int(mode)));
    NewtonConfig config;
    config.mode = mode;
    newton_solve(Space{}, problem.cell(), problem.u, problem.h, config);
    auto h = to_host(problem.h);
    EXPECT_TRUE(std::isnan(h(1, 50, 1)));
    EXPECT_TRUE(std::isnan(h(1, 299, 1)));
    for (int t = 0; t < 300; ++t)
      for (int n = 0; n < 3; ++n) ASSERT_TRUE(std::isfinite(h(0, t, n))) << "batch 0 is independent";
  }
}

// Picard sweeps make one more step exact each; a short, strongly nonlinear sequence that one
// Newton iteration cannot solve is solved after the restarts add enough of them.
TYPED_TEST(NewtonConfiguration, PicardAdaptRetries) {
  using Space = TypeParam;
  Gru<Space> problem(2, 8, 3, 4.0, 31);
  fill_uniform(problem.u, -2, 2, 32);
  NewtonConfig config;
  config.mode = NewtonMode::newton;
  config.max_iters = 1;
  config.residual_fail = 1e-12;
  EXPECT_THROW(newton_solve(Space{}, problem.cell(), problem.u, problem.h, config), NewtonDivergenceError);
  config.picard_adapt = true;
  NewtonStats<typename Space::memory_space> stats;
  newton_solve(Space{}, problem.cell(), problem.u, problem.h, config, ZeroInitialState{}, &stats);
  EXPECT_GE(stats.picard_sweeps, 1);
  EXPECT_LE(stats.picard_sweeps, 8);
  EXPECT_LE(max_relative_error(problem.h, to_host(problem.sequential())), 1e-12);
}

TYPED_TEST(NewtonConfiguration, PicardSweepsBeforeNewton) {
  using Space = TypeParam;
  Gru<Space> problem(2, 500, 3, 0.5, 41);
  NewtonConfig config;
  config.mode = NewtonMode::newton;
  config.picard_iters = 3;
  config.max_iters = 4;
  newton_solve(Space{}, problem.cell(), problem.u, problem.h, config);
  EXPECT_LE(max_relative_error(problem.h, to_host(problem.sequential())), 1e-12);
}

TYPED_TEST(NewtonConfiguration, CompileSafePresetNeverSyncs) {
  using Space = TypeParam;
  Gru<Space> problem(2, 700, 5, 0.5, 51);
  View3<double, Space> g("g", 2, 700, 5), du("du", 2, 700, 15);
  View1<double, Space> da("da", 15);
  NewtonConfig config = compile_safe_config();
  ASSERT_TRUE(is_compile_safe(config));
  NewtonStats<typename Space::memory_space> stats;
  const long before = newton_host_syncs();
  for (NewtonMode mode : {NewtonMode::automatic, NewtonMode::newton, NewtonMode::fused, NewtonMode::sequential}) {
    config.mode = mode;
    newton_solve(Space{}, problem.cell(), problem.u, problem.h, config, ZeroInitialState{}, &stats);
  }
  newton_backward(Space{}, problem.cell(), problem.u, problem.h, g, du, da);
  EXPECT_EQ(newton_host_syncs(), before);

  // The hook sees the reads a residual-driven config makes.
  config.mode = NewtonMode::newton;
  config.residual_atol = 1e-300;
  newton_solve(Space{}, problem.cell(), problem.u, problem.h, config);
  EXPECT_EQ(newton_host_syncs(), before + config.max_iters);

  // The fused mode stops its windows on the device: no read, but the iteration count for stats.
  config.mode = NewtonMode::fused;
  const long before_fused = newton_host_syncs();
  newton_solve(Space{}, problem.cell(), problem.u, problem.h, config);
  EXPECT_EQ(newton_host_syncs(), before_fused);
  newton_solve(Space{}, problem.cell(), problem.u, problem.h, config, ZeroInitialState{}, &stats);
  EXPECT_EQ(newton_host_syncs(), before_fused + 1);
  EXPECT_EQ(stats.iterations, config.max_iters);
}

// The compiled instances of a built-in cell hold every mode; a call that names the modes it compiles
// runs the one it would compile, with the result of that mode named in the config.
TYPED_TEST(NewtonConfiguration, ACallThatNamesItsModesRunsOneOfThem) {
  using Space = TypeParam;
  Gru<Space> problem(2, 300, 4, 0.5, 71);
  View3<double, Space> named("named", 2, 300, 4), g("g", 2, 300, 4), du("du", 2, 300, 12), du_named("du_named", 2, 300, 12);
  View1<double, Space> da("da", 12), da_named("da_named", 12);
  fill_uniform(g, -1, 1, 72);
  NewtonStats<typename Space::memory_space> stats;
  newton_solve<CompiledNewtonModes::fused>(Space{}, problem.cell(), problem.u, problem.h, NewtonConfig{}, ZeroInitialState{},
                                           &stats);
  EXPECT_EQ(stats.mode, NewtonMode::fused);
  NewtonConfig fused;
  fused.mode = NewtonMode::fused;
  newton_solve(Space{}, problem.cell(), problem.u, named, fused);
  EXPECT_TRUE(bitwise_equal(problem.h, named));
  newton_backward<CompiledNewtonModes::fused>(Space{}, problem.cell(), problem.u, problem.h, g, du, da);
  newton_backward(Space{}, problem.cell(), problem.u, problem.h, g, du_named, da_named, ZeroInitialState{}, NoGradient{},
                  fused);
  EXPECT_TRUE(bitwise_equal(du, du_named));
  EXPECT_TRUE(bitwise_equal(da, da_named));

  NewtonConfig newton;
  newton.mode = NewtonMode::newton;
  EXPECT_THROW(newton_solve<CompiledNewtonModes::fused>(Space{}, problem.cell(), problem.u, problem.h, newton),
               std::invalid_argument);
  EXPECT_THROW(newton_backward<CompiledNewtonModes::sequential>(Space{}, problem.cell(), problem.u, problem.h, g, du, da,
                                                                ZeroInitialState{}, NoGradient{}, newton),
               std::invalid_argument);
}

TYPED_TEST(NewtonConfiguration, DampedNewtonStillConverges) {
  using Space = TypeParam;
  Gru<Space> problem(2, 1000, 4, 0.5, 61);
  NewtonConfig config;
  config.mode = NewtonMode::newton;
  config.omega = 0.6;
  config.max_iters = 60;
  const auto reference = to_host(problem.sequential());
  newton_solve(Space{}, problem.cell(), problem.u, problem.h, config);
  EXPECT_LE(max_relative_error(problem.h, reference), 1e-12);
  config.mode = NewtonMode::fused;
  newton_solve(Space{}, problem.cell(), problem.u, problem.h, config);
  EXPECT_LE(max_relative_error(problem.h, reference), 1e-12);
  config.max_iters = 3; // damping slows convergence: three damped steps are not enough
  newton_solve(Space{}, problem.cell(), problem.u, problem.h, config);
  EXPECT_GT(max_relative_error(problem.h, reference), 1e-6);
}

TYPED_TEST(NewtonConfiguration, AutomaticModeFollowsTheDocumentedRule) {
  using Space = TypeParam;
  constexpr bool on_host = Kokkos::SpaceAccessibility<Space, Kokkos::HostSpace>::accessible;
  const int concurrency = Space().concurrency();
  NewtonStats<typename Space::memory_space> stats;
  auto mode_for = [&](int B, int T_steps, int H, NewtonConfig config) {
    Gru<Space> problem(B, T_steps, H, 0.5, 71);
    newton_solve(Space{}, problem.cell(), problem.u, problem.h, config, ZeroInitialState{}, &stats);
    return stats.mode;
  };
  // Below the sequential threshold: on a host fused when the sequence fits one window; on a device
  // (measured) fused when B x groups x 215 reaches the resident threads, else the one-pass mode from
  // 16 groups on without residual_atol, else fused when B x groups x 1536 reaches them, else newton.
  auto parallel_mode = [&](int B, int groups, bool fits_window, bool atol = false) {
    if (on_host) return fits_window ? NewtonMode::fused : NewtonMode::newton;
    const double all_groups = double(B) * groups;
    if (all_groups * 215 >= concurrency) return NewtonMode::fused;
    if (all_groups >= 16 && !atol) return NewtonMode::one_pass;
    return all_groups * 1536 >= concurrency ? NewtonMode::fused : NewtonMode::newton;
  };
  // The measured default: on a host Newton must beat 2.5 K times the loop's work per step.
  EXPECT_EQ(mode_for(concurrency, 50, 1, NewtonConfig{}), NewtonMode::sequential);
  EXPECT_EQ(mode_for(1, 50, 1, NewtonConfig{}),
            (on_host ? 7.5 : 1.0) >= concurrency ? NewtonMode::sequential : parallel_mode(1, 1, true));
  if (!on_host) { // enough groups for the fused kernel, too few to fill the device one per thread
    const int fused_from = (concurrency + 214) / 215, fused_with_atol_from = (concurrency + 1535) / 1536;
    NewtonConfig atol;
    atol.residual_atol = 1e-30; // never reached in 3 iterations: only the choice of mode matters here
    EXPECT_EQ(mode_for(fused_from, 50, 1, NewtonConfig{}), NewtonMode::fused);
    EXPECT_EQ(mode_for(fused_from - 1, 50, 1, NewtonConfig{}), NewtonMode::one_pass);
    EXPECT_EQ(mode_for(16, 50, 1, NewtonConfig{}), parallel_mode(16, 1, false));
    EXPECT_EQ(mode_for(15, 50, 1, NewtonConfig{}), parallel_mode(15, 1, false));
    EXPECT_EQ(mode_for(fused_with_atol_from, 50, 1, atol), NewtonMode::fused);
    EXPECT_EQ(mode_for(fused_with_atol_from / 2, 50, 1, atol), NewtonMode::newton);
  }

  // With a ratio below one even a single (batch, group) leaves Newton the better choice.
  NewtonConfig cheap;
  cheap.auto_work_ratio = 0.5;
  EXPECT_EQ(mode_for(2, 50, concurrency, cheap), NewtonMode::sequential); // 2 x concurrency x 0.5 fills it
  EXPECT_EQ(mode_for(1, 100, 1, cheap), parallel_mode(1, 1, true));      // fits one window on a host
  EXPECT_EQ(mode_for(1, 5000, 1, cheap), parallel_mode(1, 1, false));
  cheap.residual_atol = 1e-9; // the fused mode stops each window on its own
  EXPECT_EQ(mode_for(1, 100, 1, cheap), parallel_mode(1, 1, true, true));
  cheap.jacobian = NewtonJacobian::quasi; // which the fused kernel does not run
  EXPECT_EQ(mode_for(1, 100, 1, cheap), NewtonMode::newton);
}

// ParaSLSTM declares newton_may_diverge (its exact Newton iterations diverge over long sequences:
// docs/solvers.md): the automatic mode takes the loop on every shape and config where ParaGRU's
// would take a parallel-in-time mode.
TYPED_TEST(NewtonConfiguration, AutomaticModeRunsTheLoopForACellWhoseNewtonMayDiverge) {
  using Space = TypeParam;
  using Gru = ParaGRU<double, typename Space::memory_space>;
  using Slstm = ParaSLSTM<double, typename Space::memory_space>;
  using paraseq::detail::choose_newton_mode;
  static_assert(paraseq::detail::newton_may_diverge<Slstm> && !paraseq::detail::newton_may_diverge<Gru>);
  NewtonConfig cheap, quasi;
  cheap.auto_work_ratio = quasi.auto_work_ratio = 0.5; // as above: Newton the better choice for ParaGRU
  quasi.jacobian = NewtonJacobian::quasi;
  for (const NewtonConfig& config : {cheap, quasi})
    for (const int T_steps : {100, 5000, 65536}) {
      EXPECT_NE((choose_newton_mode<Gru, double>(Space{}, config, ScanShape{1, T_steps, 1, 1})), NewtonMode::sequential);
      // one channel: a group of its (c, n, m, h)
      EXPECT_EQ((choose_newton_mode<Slstm, double>(Space{}, config, ScanShape{1, T_steps, 1, 4})), NewtonMode::sequential);
    }
  NewtonConfig named = cheap; // a mode the config names is run as named
  named.mode = NewtonMode::newton;
  EXPECT_EQ((choose_newton_mode<Slstm, double>(Space{}, named, ScanShape{1, 100, 1, 4})), NewtonMode::newton);
}

template <class Call>
void expect_invalid(Call&& call, const std::string& argument, const std::string& expected) {
  try {
    call();
    ADD_FAILURE() << "no exception for " << argument;
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("'" + argument + "'"), HasSubstr(expected)));
  }
}

TYPED_TEST(NewtonConfiguration, BadInputRaisesClearErrors) {
  using Space = TypeParam;
  using memory = typename Space::memory_space;
  const int B = 2, T_steps = 10, H = 4;
  View2<double, Space> a("a", 3, H), a_bad("a_bad", 2, H), p("p", 2, H), p_bad("p_bad", 2, H + 1), h0_bad("h0", B, H + 1);
  View3<double, Space> u("u", B, T_steps, 3 * H), u_bad("u_bad", B, T_steps, 3 * H + 1), h("h", B, T_steps, H),
      h_bad("h_bad", B, T_steps + 1, H), g("g", B, T_steps, H), du("du", B, T_steps, 3 * H),
      du_bad("du_bad", B, T_steps, H);
  View1<double, Space> da("da", 3 * H), da_bad("da_bad", 3 * H - 1);
  const ParaGRU<double, memory> gru{a};
  expect_invalid([&] { newton_solve(Space{}, gru, u_bad, h); }, "u", "[2, 10, 12]");
  expect_invalid([&] { newton_solve(Space{}, gru, u, h_bad); }, "h", "[2, 10, 4]");
  expect_invalid([&] { newton_solve(Space{}, ParaGRU<double, memory>{a_bad}, u, h); }, "cell.a", "[3, H]");
  expect_invalid([&] { newton_solve(Space{}, gru, u, h, NewtonConfig{}, h0_bad); }, "h0", "[2, 4]");
  View3<double, Space> lstm_h("lstm_h", B, T_steps, 2 * H);
  expect_invalid([&] { newton_solve(Space{}, ParaLSTM<double, memory>{a, p_bad}, u, lstm_h); }, "cell.p", "[2, 4]");
  expect_invalid([&] { newton_backward(Space{}, gru, u, h, g, du_bad, da); }, "du", "[2, 10, 12]");
  expect_invalid([&] { newton_backward(Space{}, gru, u, h, g, du, da_bad); }, "dparams", "[12]");

  NewtonConfig config;
  config.omega = 0;
  expect_invalid([&] { newton_solve(Space{}, gru, u, h, config); }, "config.omega", "0 < omega <= 1");
  config = NewtonConfig{};
  config.mode = NewtonMode::fused;
  config.picard_iters = 2;
  expect_invalid([&] { newton_solve(Space{}, gru, u, h, config); }, "config.mode", "no Picard sweeps");
  config = NewtonConfig{};
  config.picard_adapt = true;
  expect_invalid([&] { newton_solve(Space{}, gru, u, h, config); }, "config.picard_adapt", "residual_fail");
  config = NewtonConfig{};
  config.fused_team_threads = -2;
  expect_invalid([&] { newton_solve(Space{}, gru, u, h, config); }, "config.fused_team_threads", "a value >= 0");
  config = NewtonConfig{};
  config.mode = NewtonMode::fused;
  config.fused_team_threads = 1024; // more threads per team than any backend allows with this scratch
  expect_invalid([&] { newton_solve(Space{}, gru, u, h, config); }, "config.fused_team_threads", "threads per team");
  config = NewtonConfig{};
  config.fused_team_groups = 1025;
  expect_invalid([&] { newton_solve(Space{}, gru, u, h, config); }, "config.fused_team_groups", "<= 1024");
  config = NewtonConfig{};
  config.mode = NewtonMode::one_pass;
  config.fused_team_groups = 1024; // more groups per team than any backend allows with this scratch
  expect_invalid([&] { newton_solve(Space{}, gru, u, h, config); }, "config.fused_team_groups", "threads per team");

  View3<double, Space> x("x", B, T_steps, 5);
  View2<double, Space> W_bad("W", 3 * H, 6);
  View1<double, Space> bias("b", 3 * H);
  expect_invalid([&] { project_inputs(Space{}, x, W_bad, bias, u); }, "W", "[U, D] with D from x");
}

// The newton mode's adjoint sums the parameter gradients of each (batch, group) over runs of t, a
// thread per run: the split must cover every step, fill the space where the steps allow it (runs
// of at least 64 steps) and bound the partial sums it stores. A rule of counts, so a stand-in space
// of a device's concurrency checks it on every build; the kernels run it in the Newton tests.
TEST(NewtonGradientRuns, FillTheSpaceWithinTheirBounds) {
  struct SpaceOf {
    int threads;
    int concurrency() const { return threads; }
  };
  const long partials_bound = paraseq::detail::gradient_partials_bound;
  for (const int concurrency : {1, 2, 16, 270336}) {
    for (const ScanShape& shape : {ScanShape{1, 262144, 1, 1}, ScanShape{1, 65536, 256, 1}, ScanShape{16, 4096, 1024, 1},
                                   ScanShape{4, 100, 3, 4}, ScanShape{2, 63, 1, 1}, ScanShape{1, 1, 1, 1}}) {
      for (const long param_count : {3L * shape.groups * shape.group_size, 3L * shape.groups * 16 * 16}) {
        const auto split = paraseq::detail::gradient_runs(SpaceOf{concurrency}, shape, param_count);
        const std::string what = "concurrency " + std::to_string(concurrency) + ", B " + std::to_string(shape.batch) +
                                 ", T " + std::to_string(shape.steps) + ", groups " + std::to_string(shape.groups) +
                                 ", " + std::to_string(param_count) + " parameters";
        const long runs = split.runs, threads = long(shape.batch) * shape.groups * runs;
        ASSERT_GE(runs, 1) << what;
        EXPECT_GE(runs * split.run_length, shape.steps) << what;
        if (shape.steps >= 64) EXPECT_GE(split.run_length, 64) << what;
        const bool bounded = runs == 1 || long(shape.batch) * runs * param_count <= partials_bound;
        EXPECT_TRUE(bounded) << what;
        // One run more would exceed the space, be shorter than 64 steps or pass the bound.
        const long more = runs + 1;
        const bool stops_for_a_reason = threads >= concurrency || shape.steps / more < 64 ||
                                        long(shape.batch) * more * param_count > partials_bound;
        EXPECT_TRUE(stops_for_a_reason) << what;
      }
    }
  }
  // Few channels of a long sequence on an H100's 132 x 2048 resident threads: 4096 runs of 64 steps,
  // where 64 runs of 4096 steps would leave all but 64 of those threads idle.
  const auto long_sequence = paraseq::detail::gradient_runs(SpaceOf{270336}, ScanShape{1, 262144, 1, 1}, 3);
  EXPECT_EQ(long_sequence.runs, 4096);
  EXPECT_EQ(long_sequence.run_length, 64);
}

} // namespace
