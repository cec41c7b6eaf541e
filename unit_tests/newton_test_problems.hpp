#pragma once
// Float64 sequential references of ParaGRU and ParaLSTM (cells.md) and test problems built on them,
// shared by the Newton solver's test units, and the configs they run.

#include <paraseq/solvers/cells.hpp>
#include <paraseq/solvers/newton_config.hpp>

#include "test_support.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

namespace paraseq::test {

inline double sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

// The ParaGRU recurrence of cells.md, one step after another; h0 empty means zero.
inline Host3 gru_sequential(const Host2& a, const Host3& u, const Host2& h0 = {}) {
  const int B = int(u.extent(0)), T = int(u.extent(1)), H = int(a.extent(1));
  Host3 h("gru_reference", B, T, H);
  for (int b = 0; b < B; ++b)
    for (int n = 0; n < H; ++n) {
      double state = h0.data() ? h0(b, n) : 0;
      for (int t = 0; t < T; ++t) {
        const double z = sigmoid(a(0, n) * state + u(b, t, n));
        const double r = sigmoid(a(1, n) * state + u(b, t, H + n));
        const double c = std::tanh(a(2, n) * (state * r) + u(b, t, 2 * H + n));
        state = z * c + (1 - z) * state;
        h(b, t, n) = state;
      }
    }
  return h;
}

// max over b, t and n of |h_t - f(h_{t-1}, u_t)| for ParaGRU (h_{-1} = h0): the residual of any h.
inline double gru_residual(const Host2& a, const Host3& u, const Host2& h0, const Host3& h) {
  const int B = int(u.extent(0)), T = int(u.extent(1)), H = int(a.extent(1));
  double largest = 0;
  for (int b = 0; b < B; ++b)
    for (int n = 0; n < H; ++n)
      for (int t = 0; t < T; ++t) {
        const double state = t == 0 ? h0(b, n) : h(b, t - 1, n);
        const double z = sigmoid(a(0, n) * state + u(b, t, n));
        const double r = sigmoid(a(1, n) * state + u(b, t, H + n));
        const double c = std::tanh(a(2, n) * (state * r) + u(b, t, 2 * H + n));
        largest = std::fmax(largest, std::fabs(h(b, t, n) - (z * c + (1 - z) * state)));
      }
  return largest;
}

// The ParaLSTM recurrence of cells.md; the state interleaves (c_n, h_n).
inline Host3 lstm_sequential(const Host2& a, const Host2& p, const Host3& u, const Host2& h0 = {}) {
  const int B = int(u.extent(0)), T = int(u.extent(1)), H = int(a.extent(1));
  Host3 out("lstm_reference", B, T, 2 * H);
  for (int b = 0; b < B; ++b)
    for (int n = 0; n < H; ++n) {
      double c = h0.data() ? h0(b, 2 * n) : 0, h = h0.data() ? h0(b, 2 * n + 1) : 0;
      for (int t = 0; t < T; ++t) {
        const double f = sigmoid(a(0, n) * h + p(0, n) * c + u(b, t, n));
        const double c_tilde = std::tanh(a(1, n) * h + u(b, t, H + n));
        c = f * c + (1 - f) * c_tilde;
        const double o = sigmoid(a(2, n) * h + p(1, n) * c + u(b, t, 2 * H + n));
        h = o * std::tanh(c);
        out(b, t, 2 * n) = c;
        out(b, t, 2 * n + 1) = h;
      }
    }
  return out;
}

inline double max_abs_difference(const Host3& x, const Host3& y) {
  double m = 0;
  for (std::size_t i = 0; i < x.span(); ++i) {
    const double e = std::fabs(x.data()[i] - y.data()[i]);
    m = std::isfinite(e) ? std::fmax(m, e) : INFINITY;
  }
  return m;
}

template <class T, class Space>
struct GruProblem {
  View2<T, Space> a;
  View3<T, Space> u;
  GruProblem(int B, int T_steps, int H, double a_bound, unsigned seed, double u_bound = 0.5)
      : a("a", 3, H), u("u", B, T_steps, 3 * H) {
    fill_uniform(a, -a_bound, a_bound, seed);
    fill_uniform(u, -u_bound, u_bound, seed + 1);
  }
  ParaGRU<T, typename Space::memory_space> cell() const { return {a}; }
  Host3 reference() const { return gru_sequential(as_double2(a), as_double3(u)); }
};

template <class T, class Space>
struct LstmProblem {
  View2<T, Space> a, p;
  View3<T, Space> u;
  LstmProblem(int B, int T_steps, int H, double a_bound, unsigned seed, double u_bound = 0.5)
      : a("a", 3, H), p("p", 2, H), u("u", B, T_steps, 3 * H) {
    fill_uniform(a, -a_bound, a_bound, seed);
    fill_uniform(p, -a_bound, a_bound, seed + 1);
    fill_uniform(u, -u_bound, u_bound, seed + 2);
  }
  ParaLSTM<T, typename Space::memory_space> cell() const { return {a, p}; }
  Host3 reference() const { return lstm_sequential(as_double2(a), as_double2(p), as_double3(u)); }
};

inline NewtonConfig with_mode(NewtonMode mode, ScanConfig scan = {}, int fused_window = 0) {
  NewtonConfig config;
  config.mode = mode;
  config.scan = scan;
  config.fused_window = fused_window;
  return config;
}

// Threads that may share one fused window on Space, at most 5 (one on Serial). Host plans use one
// thread per window by default; asking for more covers the compose phase and the exchange of maps
// and boundary states on every backend that allows it. Five threads hold a 40-step window in
// chunks of 8, which every space's chunk capacity allows.
template <class Space>
int shared_window_threads() {
  using policy_t = Kokkos::TeamPolicy<Space>;
  const int most = policy_t(Space{}, 1, 1).team_size_max(KOKKOS_LAMBDA(const typename policy_t::member_type&){},
                                                         Kokkos::ParallelForTag{});
  return std::min(5, most);
}

// The one-pass mode with 16-step windows and K iterations: one thread per window, the window shared
// by several threads where the space allows it (their maps composed into the window's), and teams
// of 2 groups, each with those threads (a group per lane, the last tile with an idle lane when the
// groups are odd).
inline constexpr int one_pass_window_steps = 16;
template <class Space>
std::vector<NewtonConfig> one_pass_configs(int iterations) {
  std::vector<NewtonConfig> configs{with_mode(NewtonMode::one_pass, {}, one_pass_window_steps)};
  const int most = shared_window_threads<Space>();
  if (const int threads = std::min(4, most); threads > 1) {
    configs.push_back(configs.back());
    configs.back().fused_team_threads = threads;
    configs.push_back(configs.back());
    configs.back().fused_team_threads = std::max(1, std::min(threads, most / 2));
    configs.back().fused_team_groups = 2;
  }
  for (NewtonConfig& config : configs) config.max_iters = iterations;
  return configs;
}

} // namespace paraseq::test
