#pragma once
// Shared by the Runge–Kutta tests: the damped oscillator's closed form, batches of oscillators with
// random parameters, plain host loops (classic RK4 in double) that the tests compare against, and
// the gradient tests' check against central differences.

#include <paraseq/loops/fields.hpp>
#include <paraseq/loops/integrate.hpp>

#include "test_support.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <string>
#include <vector>

namespace paraseq::test {

// The tests' calls whose subject is not the loop mode compile the fused loop alone,
// ode::solve<fused_only>(...): for a built-in field and a method with compiled instances, that is
// the paraseq library's instance, so that such a call compiles no loop kernel in the test's unit.
inline constexpr ode::CompiledModes fused_only = ode::CompiledModes::fused_only;

// y'' + c y' + k y = 0 with y(0) = y0, y'(0) = v0, underdamped (c^2 < 4k): the state (y, y') at t.
inline std::array<double, 2> oscillator_exact(double y0, double v0, double k, double c, double t) {
  const double omega = std::sqrt(k - c * c / 4), decay = std::exp(-c * t / 2);
  const double a = y0, b = (v0 + c * y0 / 2) / omega;
  const double cos_t = std::cos(omega * t), sin_t = std::sin(omega * t);
  const double y = decay * (a * cos_t + b * sin_t);
  const double dy = -c / 2 * y + decay * omega * (-a * sin_t + b * cos_t);
  return {y, dy};
}

// N damped oscillators: y0 in [-1, 1]^2, k in [1, 4], c in [0.05, 0.5].
template <class T, class Space>
struct OscillatorBatch {
  View2<T, Space> y0, params;
  explicit OscillatorBatch(int N, unsigned seed = 1) : y0("y0", N, 2), params("params", N, 2) {
    fill_uniform(y0, -1, 1, seed);
    auto host = Kokkos::create_mirror_view(params);
    std::mt19937_64 rng(seed + 1000);
    std::uniform_real_distribution<double> k(1, 4), c(0.05, 0.5);
    for (int i = 0; i < N; ++i) host(i, 0) = T(k(rng)), host(i, 1) = T(c(rng));
    copy_contiguous(params, host);
  }
  auto problem() const { return ode::problem(ode::DampedOscillator{}, y0, params); }

  // The exact states at time t, [N, 2] on the host.
  Kokkos::View<double**, Kokkos::HostSpace> exact(double t) const {
    auto y = to_host(y0);
    auto p = to_host(params);
    Kokkos::View<double**, Kokkos::HostSpace> out("exact", y.extent(0), 2);
    for (std::size_t i = 0; i < y.extent(0); ++i) {
      const auto s = oscillator_exact(y(i, 0), y(i, 1), p(i, 0), p(i, 1), t);
      out(i, 0) = s[0], out(i, 1) = s[1];
    }
    return out;
  }
};

// Counts every evaluation of the oscillator.
template <class Memory>
struct CountingOscillator {
  static constexpr int state_size = 2;
  static constexpr int max_parameter_count = 2;
  ode::DampedOscillator oscillator;
  Kokkos::View<unsigned long long, Memory> evaluations;

  static CountingOscillator fresh() { return {{}, Kokkos::View<unsigned long long, Memory>("evaluations")}; }

  template <class S, class P>
  KOKKOS_FUNCTION void operator()(S t, const S* y, const P& p, S* dy) const {
    Kokkos::atomic_inc(&evaluations());
    oscillator(t, y, p, dy);
  }
};

template <class View, class Ref>
double max_abs_difference(const View& x, const Ref& ref) {
  auto host = to_host(x);
  double worst = 0;
  for (std::size_t i = 0; i < host.span(); ++i) {
    const double d = std::fabs(double(host.data()[i]) - double(ref.data()[i]));
    worst = std::isfinite(d) ? std::fmax(worst, d) : INFINITY;
  }
  return worst;
}

// Parameters of one trajectory for calling a field on the host.
template <class T>
struct HostParameters {
  const T* own_values = nullptr;
  const T* shared_values = nullptr;
  T own(int k) const { return own_values[k]; }
  T shared(int k) const { return shared_values[k]; }
};

// The classic RK4 step written out, with scalar type S (double, or a test's AD type).
template <class S, class Field, class P>
std::vector<S> rk4_step(const Field& field, S t, S h, const std::vector<S>& y, const P& p) {
  const std::size_t n = y.size();
  std::vector<S> k1(n), k2(n), k3(n), k4(n), stage(n), next(n);
  field(t, y.data(), p, k1.data());
  for (std::size_t i = 0; i < n; ++i) stage[i] = y[i] + h * k1[i] / 2;
  field(t + h / 2, stage.data(), p, k2.data());
  for (std::size_t i = 0; i < n; ++i) stage[i] = y[i] + h * k2[i] / 2;
  field(t + h / 2, stage.data(), p, k3.data());
  for (std::size_t i = 0; i < n; ++i) stage[i] = y[i] + h * k3[i];
  field(t + h, stage.data(), p, k4.data());
  for (std::size_t i = 0; i < n; ++i) next[i] = y[i] + h * (k1[i] + 2 * k2[i] + 2 * k3[i] + k4[i]) / 6;
  return next;
}

// The sum of v * w over every element, in double, on the host.
template <class V, class W>
double dot(const V& v, const W& w) {
  auto hv = to_host(v);
  auto hw = to_host(w);
  double sum = 0;
  for (std::size_t i = 0; i < hv.span(); ++i) sum += double(hv.data()[i]) * double(hw.data()[i]);
  return sum;
}

// Compares gradient (laid out as v) with central differences of loss() in each element of v.
template <class V, class Loss, class G>
void expect_central_differences(const V& v, const Loss& loss, const G& gradient, double eps, double tolerance,
                                const std::string& what) {
  auto host = to_host(v);
  auto grad = to_host(gradient);
  for (std::size_t i = 0; i < host.span(); ++i) {
    const double saved = host.data()[i];
    host.data()[i] = saved + eps;
    copy_contiguous(v, host);
    const double plus = loss();
    host.data()[i] = saved - eps;
    copy_contiguous(v, host);
    const double minus = loss();
    host.data()[i] = saved;
    copy_contiguous(v, host);
    const double fd = (plus - minus) / (2 * eps);
    EXPECT_NEAR(grad.data()[i], fd, tolerance * std::fmax(1.0, std::fabs(fd))) << what << " element " << i;
  }
}

} // namespace paraseq::test
