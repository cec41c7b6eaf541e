// The Newton solver with ParaGRU and ParaLSTM against float64 sequential loops written here, its
// backward pass against central finite differences and against reverse mode through the loop, and
// the input projection against a float64 matrix product; on every enabled execution space.

#include <paraseq/solvers/cells.hpp>
#include <paraseq/solvers/input_projection.hpp>
#include <paraseq/solvers/newton.hpp>
#include <paraseq/solvers/newton_backward.hpp>

#include "fused_early_exit_checks.hpp"
#include "newton_test_problems.hpp"
#include "test_support.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

namespace {

using namespace paraseq;
using namespace paraseq::test;

using Host1 = Kokkos::View<double*, Kokkos::LayoutRight, Kokkos::HostSpace>;

// Every mode and several decompositions, K iterations (default 3). The fused window of 40 steps
// shared by several threads leaves a shorter last chunk whenever T is not a multiple of it; teams
// of 2 groups (the space's window) leave a lane idle where the groups are odd.
template <class Space>
std::vector<NewtonConfig> forward_configs(int iterations = 3) {
  std::vector<NewtonConfig> configs{with_mode(NewtonMode::newton),
                                    with_mode(NewtonMode::newton, ScanConfig{1, 5, 7, TimeSplit::two_pass}),
                                    with_mode(NewtonMode::newton, ScanConfig{1, 5, 7, TimeSplit::single_pass}),
                                    with_mode(NewtonMode::newton, sequential_scan_config), with_mode(NewtonMode::fused),
                                    with_mode(NewtonMode::fused, {}, 16), with_mode(NewtonMode::sequential),
                                    with_mode(NewtonMode::automatic)};
  if (const int threads = shared_window_threads<Space>(); threads > 1) {
    configs.push_back(with_mode(NewtonMode::fused, {}, 40));
    configs.back().fused_team_threads = threads;
    configs.push_back(with_mode(NewtonMode::fused));
    configs.back().fused_team_groups = 2;
  }
  for (NewtonConfig& config : configs) config.max_iters = iterations;
  return configs;
}

std::string describe(const NewtonConfig& c) {
  return "mode=" + std::to_string(int(c.mode)) + " scan=" + std::to_string(c.scan.team_chunks) + "," +
         std::to_string(c.scan.chunk_length) + "," + std::to_string(c.scan.time_chunks) + "," +
         std::to_string(int(c.scan.time_split)) +
         " window=" + std::to_string(c.fused_window) + " window threads=" + std::to_string(c.fused_team_threads) +
         " groups=" + std::to_string(c.fused_team_groups);
}

// Every way the backward runs: the reverse ordered scan in several decompositions, the fused
// adjoint with the space's plan, with a 40-step window shared by several threads and with teams of
// 2 groups, and the sequential adjoint (one thread per group and window).
template <class Space>
std::vector<NewtonConfig> backward_configs() {
  std::vector<NewtonConfig> configs{with_mode(NewtonMode::newton), with_mode(NewtonMode::newton, sequential_scan_config),
                                    with_mode(NewtonMode::newton, ScanConfig{1, 7, 5, TimeSplit::two_pass}),
                                    with_mode(NewtonMode::newton, ScanConfig{1, 7, 5, TimeSplit::single_pass}),
                                    with_mode(NewtonMode::fused),
                                    with_mode(NewtonMode::fused, {}, 16), with_mode(NewtonMode::sequential)};
  // The one-pass adjoint: windows of 3 steps (several in every problem, the last one short).
  configs.push_back(with_mode(NewtonMode::one_pass, {}, 3));
  if (const int threads = shared_window_threads<Space>(); threads > 1) {
    configs.push_back(with_mode(NewtonMode::fused, {}, 40));
    configs.back().fused_team_threads = threads;
    configs.push_back(with_mode(NewtonMode::one_pass, {}, 40));
    configs.back().fused_team_threads = threads;
    configs.push_back(with_mode(NewtonMode::fused));
    configs.back().fused_team_groups = 2;
  }
  return configs;
}

template <class Space>
class Newton : public ::testing::Test {};
TYPED_TEST_SUITE(Newton, ExecutionSpaces, SpaceName);

TYPED_TEST(Newton, GruMatchesSequentialLoopInDouble) {
  using Space = TypeParam;
  for (int T_steps : {1, 37, 4096}) {
    SCOPED_TRACE("T=" + std::to_string(T_steps));
    GruProblem<double, Space> problem(2, T_steps, 5, 0.5, 1);
    const Host3 reference = problem.reference();
    View3<double, Space> h("h", 2, T_steps, 5);
    for (const NewtonConfig& config : forward_configs<Space>()) {
      SCOPED_TRACE(describe(config));
      Kokkos::deep_copy(h, NAN);
      newton_solve(Space{}, problem.cell(), problem.u, h, config);
      EXPECT_LE(max_abs_difference(as_double3(h), reference), 1e-10);
    }
  }
}

TYPED_TEST(Newton, GruLongSequence) {
  using Space = TypeParam;
  const int T_steps = 65536;
  GruProblem<double, Space> problem(1, T_steps, 3, 0.5, 3);
  View3<double, Space> h("h", 1, T_steps, 3);
  for (const NewtonConfig& config : {with_mode(NewtonMode::newton), with_mode(NewtonMode::fused)}) {
    SCOPED_TRACE(describe(config));
    newton_solve(Space{}, problem.cell(), problem.u, h, config);
    EXPECT_LE(max_abs_difference(as_double3(h), problem.reference()), 1e-10);
  }
}

// Inputs three times larger put the guess f(0, u) farther away: K = 3 leaves about 1e-7, and the
// quadratic step K = 4 reaches float64 rounding.
TYPED_TEST(Newton, LargerInputsTakeOneMoreIteration) {
  using Space = TypeParam;
  GruProblem<double, Space> gru(2, 4096, 5, 0.5, 15, 1.5);
  LstmProblem<double, Space> lstm(2, 4096, 3, 0.5, 16, 1.5);
  View3<double, Space> h_gru("h", 2, 4096, 5), h_lstm("h", 2, 4096, 6);
  for (const NewtonConfig& config : forward_configs<Space>(4)) {
    SCOPED_TRACE(describe(config));
    newton_solve(Space{}, gru.cell(), gru.u, h_gru, config);
    EXPECT_LE(max_abs_difference(as_double3(h_gru), gru.reference()), 1e-10);
    newton_solve(Space{}, lstm.cell(), lstm.u, h_lstm, config);
    EXPECT_LE(max_abs_difference(as_double3(h_lstm), lstm.reference()), 1e-10);
  }
}

// Every mode, the one-pass mode too (on GPUs the kernel of one_pass_launch_bounds, with the cells'
// approximate gates) with 16-step windows, shared by several threads where the space allows, and
// with the space's own plan.
TYPED_TEST(Newton, GruMatchesSequentialLoopInFloat) {
  using Space = TypeParam;
  const int T_steps = 4096;
  GruProblem<float, Space> problem(2, T_steps, 8, 0.5, 5, 1.5);
  const Host3 reference = problem.reference();
  View3<float, Space> h("h", 2, T_steps, 8);
  std::vector<NewtonConfig> configs = forward_configs<Space>(3);
  for (const NewtonConfig& config : one_pass_configs<Space>(3)) configs.push_back(config);
  configs.push_back(with_mode(NewtonMode::one_pass));
  configs.back().max_iters = 3;
  for (const NewtonConfig& config : configs) {
    SCOPED_TRACE(describe(config));
    Kokkos::deep_copy(h, NAN); // a mode that wrote nothing fails
    newton_solve(Space{}, problem.cell(), problem.u, h, config);
    EXPECT_LE(max_abs_difference(as_double3(h), reference), 1e-5);
  }
}

// The coupled (c, h) state converges a little more slowly than the GRU: K = 3 leaves 3e-10 at
// T = 4096 in double, so the float64 check takes K = 4; float reaches its precision with K = 3.
TYPED_TEST(Newton, LstmMatchesSequentialLoop) {
  using Space = TypeParam;
  for (int T_steps : {1, 200, 4096}) {
    SCOPED_TRACE("T=" + std::to_string(T_steps));
    LstmProblem<double, Space> problem(2, T_steps, 3, 0.5, 7);
    const Host3 reference = problem.reference();
    View3<double, Space> h("h", 2, T_steps, 6);
    for (const NewtonConfig& config : forward_configs<Space>(4)) {
      SCOPED_TRACE(describe(config));
      Kokkos::deep_copy(h, NAN);
      newton_solve(Space{}, problem.cell(), problem.u, h, config);
      EXPECT_LE(max_abs_difference(as_double3(h), reference), 1e-10);
    }
  }
  LstmProblem<float, Space> single(1, 4096, 4, 0.5, 9, 1.5);
  View3<float, Space> h("h", 1, 4096, 8);
  for (const NewtonConfig& config : forward_configs<Space>()) {
    SCOPED_TRACE(describe(config));
    newton_solve(Space{}, single.cell(), single.u, h, config);
    EXPECT_LE(max_abs_difference(as_double3(h), single.reference()), 1e-5);
  }
}

TYPED_TEST(Newton, InitialStateAndGuesses) {
  using Space = TypeParam;
  const int B = 2, T_steps = 300, H = 4;
  GruProblem<double, Space> problem(B, T_steps, H, 0.5, 11);
  View2<double, Space> h0("h0", B, H);
  fill_uniform(h0, -1, 1, 12);
  const Host3 reference = gru_sequential(as_double2(problem.a), as_double3(problem.u), as_double2(h0));
  View3<double, Space> h("h", B, T_steps, H);
  for (InitialGuess guess : {InitialGuess::cell_at_zero, InitialGuess::zeros, InitialGuess::given}) {
    for (NewtonMode mode : {NewtonMode::newton, NewtonMode::fused, NewtonMode::sequential}) {
      SCOPED_TRACE("guess=" + std::to_string(int(guess)) + " mode=" + std::to_string(int(mode)));
      NewtonConfig config = with_mode(mode, {}, 64);
      config.initial_guess = guess;
      config.max_iters = 6; // a zero guess starts farther away
      fill_uniform(h, -0.3, 0.3, 13);
      newton_solve(Space{}, problem.cell(), problem.u, h, config, h0);
      EXPECT_LE(max_abs_difference(as_double3(h), reference), 1e-10);
    }
  }
}

// Near the solution each iteration squares the residual: log r_{k+1} / log r_k approaches 2.
TYPED_TEST(Newton, ResidualFallsQuadratically) {
  using Space = TypeParam;
  GruProblem<double, Space> problem(2, 3000, 4, 0.5, 21, 1.5);
  View3<double, Space> h("h", 2, 3000, 4);
  std::vector<double> residuals;
  for (int k = 0; k <= 5; ++k) {
    NewtonConfig config = with_mode(NewtonMode::newton);
    config.max_iters = k;
    NewtonStats<typename Space::memory_space> stats;
    newton_solve(Space{}, problem.cell(), problem.u, h, config, ZeroInitialState{}, &stats);
    auto r = to_host(stats.residual);
    residuals.push_back(std::max(r(0), r(1)));
  }
  int quadratic_steps = 0;
  for (int k = 0; k + 1 < int(residuals.size()); ++k) {
    SCOPED_TRACE("r_" + std::to_string(k) + " = " + std::to_string(residuals[k]) + ", next " +
                 std::to_string(residuals[k + 1]));
    if (residuals[k] > 1e-13) EXPECT_LT(residuals[k + 1], residuals[k]);
    if (residuals[k] < 1e-2 && residuals[k + 1] > 1e-13) {
      EXPECT_GE(std::log(residuals[k + 1]) / std::log(residuals[k]), 1.8);
      ++quadratic_steps;
    }
  }
  EXPECT_GE(quadratic_steps, 1);
}

// residual_atol's early exit with cached linearisations (a diagonal cell), in one window and in
// several, each starting from the state the previous one ended in.
TYPED_TEST(Newton, GruFusedResidualAtolStopsEachWindowEarly) {
  using Space = TypeParam;
  const int B = 3, T_steps = 96, H = 5;
  View2<double, Space> a("a", 3, H), h0("h0", B, H);
  View3<double, Space> u("u", B, T_steps, 3 * H);
  fill_uniform(a, -0.5, 0.5, 41);
  fill_uniform(u, -0.5, 0.5, 42);
  fill_uniform(h0, -0.5, 0.5, 43);
  const Host2 a_host = as_double2(a), h0_host = as_double2(h0);
  const Host3 u_host = as_double3(u);
  const ParaGRU<double, typename Space::memory_space> cell{a};
  // Three windows, then one: on a device a window of 96 steps is 12 threads per lane (8 steps each).
  for (const int window : {32, 96})
    expect_fused_early_exit<Space, CompiledNewtonModes::all>(
        cell, u, h0, gru_sequential(a_host, u_host, h0_host),
        [&](const Host3& h) { return gru_residual(a_host, u_host, h0_host, h); }, window);
}

TYPED_TEST(Newton, RepeatedSolvesAreBitwiseEqual) {
  using Space = TypeParam;
  GruProblem<float, Space> problem(3, 2000, 7, 0.5, 31);
  View3<float, Space> h1("h1", 3, 2000, 7), h2("h2", 3, 2000, 7), g("g", 3, 2000, 7), du1("du1", 3, 2000, 21),
      du2("du2", 3, 2000, 21);
  View1<float, Space> da1("da1", 21), da2("da2", 21);
  fill_uniform(g, -1, 1, 32);
  for (const NewtonConfig& config : forward_configs<Space>()) {
    newton_solve(Space{}, problem.cell(), problem.u, h1, config);
    newton_solve(Space{}, problem.cell(), problem.u, h2, config);
    EXPECT_TRUE(bitwise_equal(h1, h2)) << describe(config);
  }
  // The backward only reads h: a View of const values is accepted and gives the same bits.
  const View3<const float, Space> h1_read_only = h1;
  for (const NewtonConfig& config : backward_configs<Space>()) {
    newton_backward(Space{}, problem.cell(), problem.u, h1, g, du1, da1, ZeroInitialState{}, NoGradient{}, config);
    newton_backward(Space{}, problem.cell(), problem.u, h1_read_only, g, du2, da2, ZeroInitialState{}, NoGradient{}, config);
    EXPECT_TRUE(bitwise_equal(du1, du2)) << describe(config);
    EXPECT_TRUE(bitwise_equal(da1, da2)) << describe(config);
  }
}

// ---- backward --------------------------------------------------------------------------------

// L = sum of w * h over all entries.
double weighted_sum(const Host3& w, const Host3& h) {
  double sum = 0;
  for (std::size_t i = 0; i < h.span(); ++i) sum += w.data()[i] * h.data()[i];
  return sum;
}

// Central differences of loss() with respect to every entry of `values`.
std::vector<double> central_differences(double* values, std::size_t count, const std::function<double()>& loss) {
  std::vector<double> gradient(count);
  for (std::size_t i = 0; i < count; ++i) {
    const double saved = values[i], step = 1e-6 * std::fmax(1.0, std::fabs(saved));
    values[i] = saved + step;
    const double up = loss();
    values[i] = saved - step;
    const double down = loss();
    values[i] = saved;
    gradient[i] = (up - down) / (2 * step);
  }
  return gradient;
}

template <class View>
double gradient_error(const View& analytic, const std::vector<double>& numeric) {
  auto host = to_host(analytic);
  double error = 0, scale = 0;
  for (std::size_t i = 0; i < numeric.size(); ++i) {
    error = std::fmax(error, std::fabs(double(host.data()[i]) - numeric[i]));
    scale = std::fmax(scale, std::fabs(numeric[i]));
  }
  return error / scale;
}

TYPED_TEST(Newton, GruGradientsMatchFiniteDifferences) {
  using Space = TypeParam;
  const int B = 2, T_steps = 7, H = 3, D = 4;
  View3<double, Space> x("x", B, T_steps, D), u("u", B, T_steps, 3 * H), h("h", B, T_steps, H), g("g", B, T_steps, H);
  View3<double, Space> du("du", B, T_steps, 3 * H), dx("dx", B, T_steps, D);
  View2<double, Space> W("W", 3 * H, D), a("a", 3, H), h0("h0", B, H), dW("dW", 3 * H, D), dh0("dh0", B, H);
  View1<double, Space> bias("b", 3 * H), da("da", 3 * H), dbias("db", 3 * H);
  fill_uniform(x, -1, 1, 41);
  fill_uniform(W, -0.7, 0.7, 42);
  fill_uniform(bias, -0.5, 0.5, 43);
  fill_uniform(a, -0.5, 0.5, 44);
  fill_uniform(h0, -0.5, 0.5, 45);
  fill_uniform(g, -1, 1, 46);

  project_inputs(Space{}, x, W, bias, u);
  const ParaGRU<double, typename Space::memory_space> cell{a};
  NewtonConfig config = with_mode(NewtonMode::newton);
  config.max_iters = 10;
  newton_solve(Space{}, cell, u, h, config, h0);

  // The float64 reference pipeline on the host: u = x W^T + b, the loop, L = <g, h>.
  Host3 hx = as_double3(x), hg = as_double3(g);
  Host2 hW = as_double2(W), ha = as_double2(a), hh0 = as_double2(h0);
  auto hb = to_host(bias);
  Host1 hbias("b", 3 * H);
  for (int i = 0; i < 3 * H; ++i) hbias(i) = hb(i);
  auto loss = [&]() {
    Host3 hu("u", B, T_steps, 3 * H);
    for (int b = 0; b < B; ++b)
      for (int t = 0; t < T_steps; ++t)
        for (int j = 0; j < 3 * H; ++j) {
          double sum = hbias(j);
          for (int k = 0; k < D; ++k) sum += hW(j, k) * hx(b, t, k);
          hu(b, t, j) = sum;
        }
    return weighted_sum(hg, gru_sequential(ha, hu, hh0));
  };
  const std::vector<double> dx_numeric = central_differences(hx.data(), hx.span(), loss),
                            dW_numeric = central_differences(hW.data(), hW.span(), loss),
                            dbias_numeric = central_differences(hbias.data(), hbias.span(), loss),
                            da_numeric = central_differences(ha.data(), ha.span(), loss),
                            dh0_numeric = central_differences(hh0.data(), hh0.span(), loss);
  for (const NewtonConfig& backward : backward_configs<Space>()) {
    SCOPED_TRACE(describe(backward));
    newton_backward(Space{}, cell, u, h, g, du, da, h0, dh0, backward);
    project_inputs_backward(Space{}, x, W, du, dW, dbias, dx);
    EXPECT_LE(gradient_error(dx, dx_numeric), 1e-6);
    EXPECT_LE(gradient_error(dW, dW_numeric), 1e-6);
    EXPECT_LE(gradient_error(dbias, dbias_numeric), 1e-6);
    EXPECT_LE(gradient_error(da, da_numeric), 1e-6);
    EXPECT_LE(gradient_error(dh0, dh0_numeric), 1e-6);
  }
}

TYPED_TEST(Newton, LstmGradientsMatchFiniteDifferences) {
  using Space = TypeParam;
  const int B = 2, T_steps = 6, H = 2;
  LstmProblem<double, Space> problem(B, T_steps, H, 0.5, 51);
  View3<double, Space> h("h", B, T_steps, 2 * H), g("g", B, T_steps, 2 * H), du("du", B, T_steps, 3 * H);
  View2<double, Space> h0("h0", B, 2 * H), dh0("dh0", B, 2 * H);
  View1<double, Space> dparams("dparams", 5 * H);
  fill_uniform(h0, -0.5, 0.5, 52);
  fill_uniform(g, -1, 1, 53);
  NewtonConfig config = with_mode(NewtonMode::newton);
  config.max_iters = 10;
  newton_solve(Space{}, problem.cell(), problem.u, h, config, h0);

  Host3 hu = as_double3(problem.u), hg = as_double3(g);
  Host2 ha = as_double2(problem.a), hp = as_double2(problem.p), hh0 = as_double2(h0);
  auto loss = [&]() { return weighted_sum(hg, lstm_sequential(ha, hp, hu, hh0)); };
  std::vector<double> dparams_numeric = central_differences(ha.data(), ha.span(), loss);
  const std::vector<double> dp_numeric = central_differences(hp.data(), hp.span(), loss);
  dparams_numeric.insert(dparams_numeric.end(), dp_numeric.begin(), dp_numeric.end()); // slots: a rows, then p rows
  const std::vector<double> du_numeric = central_differences(hu.data(), hu.span(), loss),
                            dh0_numeric = central_differences(hh0.data(), hh0.span(), loss);
  for (const NewtonConfig& backward : backward_configs<Space>()) {
    SCOPED_TRACE(describe(backward));
    newton_backward(Space{}, problem.cell(), problem.u, h, g, du, dparams, h0, dh0, backward);
    EXPECT_LE(gradient_error(du, du_numeric), 1e-6);
    EXPECT_LE(gradient_error(dparams, dparams_numeric), 1e-6);
    EXPECT_LE(gradient_error(dh0, dh0_numeric), 1e-6);
  }
}

// Reverse mode through the float64 GRU loop, written out step by step.
struct GruReverse {
  Host3 du;
  Host2 da, dh0;
};
GruReverse gru_reverse_mode(const Host2& a, const Host3& u, const Host3& g) {
  const int B = int(u.extent(0)), T = int(u.extent(1)), H = int(a.extent(1));
  const Host3 h = gru_sequential(a, u);
  GruReverse out{Host3("du", B, T, 3 * H), Host2("da", 3, H), Host2("dh0", B, H)};
  for (int b = 0; b < B; ++b)
    for (int n = 0; n < H; ++n) {
      double from_future = 0; // dL/dh_t through h_{t+1}, h_{t+2}, ...
      for (int t = T - 1; t >= 0; --t) {
        const double h_bar = g(b, t, n) + from_future;
        const double hp = t > 0 ? h(b, t - 1, n) : 0;
        const double z = sigmoid(a(0, n) * hp + u(b, t, n));
        const double r = sigmoid(a(1, n) * hp + u(b, t, H + n));
        const double c = std::tanh(a(2, n) * hp * r + u(b, t, 2 * H + n));
        double hp_bar = h_bar * (1 - z);
        const double pre_z_bar = h_bar * (c - hp) * z * (1 - z);
        const double pre_c_bar = h_bar * z * (1 - c * c);
        const double r_bar = pre_c_bar * a(2, n) * hp;
        const double pre_r_bar = r_bar * r * (1 - r);
        hp_bar += pre_c_bar * a(2, n) * r + pre_r_bar * a(1, n) + pre_z_bar * a(0, n);
        out.du(b, t, n) = pre_z_bar;
        out.du(b, t, H + n) = pre_r_bar;
        out.du(b, t, 2 * H + n) = pre_c_bar;
        out.da(0, n) += pre_z_bar * hp;
        out.da(1, n) += pre_r_bar * hp;
        out.da(2, n) += pre_c_bar * hp * r;
        from_future = hp_bar;
      }
      out.dh0(b, n) = from_future;
    }
  return out;
}

// ParaGRU's gradients of <g, h> (g uniform in [-1, 1] from `g_seed`) under every config, at the
// newton mode's solve, against the float64 reverse-mode loop: at most `bound` of the largest
// gradient. The outputs are NaN-filled before each config, so a mode that writes nothing fails.
template <class T, class Space>
void expect_gru_gradients_match_reverse_mode(const GruProblem<T, Space>& problem, unsigned g_seed,
                                             const std::vector<NewtonConfig>& configs, double bound) {
  const int B = int(problem.u.extent(0)), T_steps = int(problem.u.extent(1)), H = int(problem.a.extent(1));
  View3<T, Space> h("h", B, T_steps, H), g("g", B, T_steps, H), du("du", B, T_steps, 3 * H);
  View2<T, Space> dh0("dh0", B, H);
  View1<T, Space> da("da", 3 * H);
  fill_uniform(g, -1, 1, g_seed);
  const GruReverse reference = gru_reverse_mode(as_double2(problem.a), as_double3(problem.u), as_double3(g));
  newton_solve(Space{}, problem.cell(), problem.u, h, with_mode(NewtonMode::newton));
  for (const NewtonConfig& backward : configs) {
    SCOPED_TRACE(describe(backward));
    Kokkos::deep_copy(du, NAN);
    Kokkos::deep_copy(da, NAN);
    Kokkos::deep_copy(dh0, NAN);
    newton_backward(Space{}, problem.cell(), problem.u, h, g, du, da, ZeroInitialState{}, dh0, backward);
    EXPECT_LE(max_relative_error(du, reference.du), bound);
    EXPECT_LE(max_relative_error(da, reference.da), bound);
    EXPECT_LE(max_relative_error(dh0, reference.dh0), bound);
  }
}

TYPED_TEST(Newton, GruGradientsMatchReverseModeOnLargerProblems) {
  using Space = TypeParam;
  expect_gru_gradients_match_reverse_mode(GruProblem<double, Space>(3, 5000, 6, 0.5, 61), 62,
                                          backward_configs<Space>(), 1e-10);
}

// In float, every way the backward runs and the one-pass adjoint with the space's own plan (its
// float kernel, whose other tests run in double; on GPUs with one_pass_team_groups), at the float
// solve's h: 1e-5 of the largest gradient (with OpenMP the modes reach 1e-7 .. 2e-7 for du and dh0
// and 1e-7 .. 1.2e-6 for the sums of da, 2026-12-07).
TYPED_TEST(Newton, GruGradientsInFloatMatchReverseMode) {
  using Space = TypeParam;
  std::vector<NewtonConfig> configs = backward_configs<Space>();
  configs.push_back(with_mode(NewtonMode::one_pass));
  expect_gru_gradients_match_reverse_mode(GruProblem<float, Space>(2, 4096, 8, 0.5, 63, 1.5), 64, configs, 1e-5);
}

// ---- input projection ---------------------------------------------------------------------------

TYPED_TEST(Newton, ProjectionMatchesFloat64Products) {
  using Space = TypeParam;
  const int B = 3, T_steps = 45, D = 37, U = 70; // no dimension a multiple of a tile
  View3<double, Space> x("x", B, T_steps, D), u("u", B, T_steps, U), du("du", B, T_steps, U), dx("dx", B, T_steps, D);
  View2<double, Space> W("W", U, D), dW("dW", U, D);
  View1<double, Space> bias("b", U), dbias("db", U);
  fill_uniform(x, -1, 1, 71);
  fill_uniform(W, -1, 1, 72);
  fill_uniform(bias, -1, 1, 73);
  fill_uniform(du, -1, 1, 74);
  project_inputs(Space{}, x, W, bias, u);
  project_inputs_backward(Space{}, x, W, du, dW, dbias, dx);
  // One declaration each: nvcc rejects one auto declaring Views of different ranks.
  const auto hx = to_host(x);
  const auto hW = to_host(W);
  const auto hb = to_host(bias);
  const auto hdu = to_host(du);
  Host3 u_ref("u", B, T_steps, U), dx_ref("dx", B, T_steps, D);
  Host2 dW_ref("dW", U, D);
  Host1 db_ref("db", U);
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T_steps; ++t) {
      for (int j = 0; j < U; ++j) {
        u_ref(b, t, j) = hb(j);
        db_ref(j) += hdu(b, t, j);
        for (int k = 0; k < D; ++k) {
          u_ref(b, t, j) += hW(j, k) * hx(b, t, k);
          dW_ref(j, k) += hdu(b, t, j) * hx(b, t, k);
          dx_ref(b, t, k) += hdu(b, t, j) * hW(j, k);
        }
      }
    }
  EXPECT_LE(max_relative_error(u, u_ref), 1e-13);
  EXPECT_LE(max_relative_error(dW, dW_ref), 1e-13);
  EXPECT_LE(max_relative_error(dbias, db_ref), 1e-13);
  EXPECT_LE(max_relative_error(dx, dx_ref), 1e-13);
}

} // namespace
