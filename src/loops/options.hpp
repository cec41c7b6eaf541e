#pragma once
// The vocabulary of the batched Runge–Kutta loops (integrate.hpp): the problem, the time stepping
// (fixed or adaptive), the outputs, the gradients, the options and the per-trajectory report.

#include <paraseq/core/errors.hpp>
#include <paraseq/loops/field.hpp>

#include <Kokkos_Core.hpp>

#include <cmath>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

namespace paraseq::ode {

// N trajectories of the field: y0 is [N, n]; params [N, P] holds each trajectory's own parameters
// and shared [Q] the parameters they all share (either may be NoView).
template <class Field, class Y0View, class ParamsView = NoView, class SharedView = NoView>
struct Problem {
  Field field;
  Y0View y0;
  ParamsView params;
  SharedView shared;
};

template <class Field, class Y0View, class ParamsView = NoView, class SharedView = NoView>
Problem<Field, Y0View, ParamsView, SharedView> problem(const Field& field, const Y0View& y0,
                                                       const ParamsView& params = {}, const SharedView& shared = {}) {
  return {field, y0, params, shared};
}

// Fixed steps over the grid t0 < t0 + dt < ... < t_end, or over an explicit grid. Observation
// times (nondecreasing, within [t0, t_end]) that fall inside a step split it, so every observation
// is a state of the integrator, landed on exactly. Zero steps (t_end = t0) return y0.
struct FixedSteps {
  double t0 = 0;
  double dt = 0;
  int steps = 0;
  double t_end = 0;
  std::vector<double> grid; // when not empty: the step boundaries, replacing t0, dt, steps and t_end
  std::vector<double> observation_times;

  // `steps` steps of dt: t_end = t0 + steps dt.
  static FixedSteps count(double t0, double dt, int steps) { return {t0, dt, steps, t0 + steps * dt, {}, {}}; }

  // Steps of dt from t0; a shorter last step lands exactly on t_end.
  static FixedSteps until(double t0, double t_end, double dt) {
    const char* fn = "paraseq::ode::FixedSteps::until";
    if (!(dt > 0) || !std::isfinite(dt)) detail::throw_invalid(fn, "dt", "value " + std::to_string(dt), "a finite dt > 0");
    if (!(t_end >= t0) || !std::isfinite(t_end) || !std::isfinite(t0))
      detail::throw_invalid(fn, "t_end", "value " + std::to_string(t_end), "finite t_end >= t0 = " + std::to_string(t0));
    const double ratio = (t_end - t0) / dt, nearest = std::round(ratio);
    // A ratio within rounding of an integer is that integer, not one more step of ~1e-16 dt.
    const double steps = std::fabs(ratio - nearest) <= 1e-9 * std::fmax(1.0, ratio) ? nearest : std::ceil(ratio);
    if (steps > 2147483647.0)
      detail::throw_invalid(fn, "dt", "value " + std::to_string(dt), "at most 2^31 - 1 steps over [t0, t_end]");
    return {t0, dt, int(steps), t_end, {}, {}};
  }

  // Steps between consecutive entries of an increasing grid.
  static FixedSteps on_grid(std::vector<double> times) {
    FixedSteps steps;
    steps.grid = std::move(times);
    return steps;
  }

  FixedSteps& observe_at(std::vector<double> times) {
    observation_times = std::move(times);
    return *this;
  }
};

// A PI step-size controller. After an accepted step with error norm e (the previous accepted one
// e_prev), h *= clamp(safety e^(-beta1/k) e_prev^(beta2/k), min_factor, max_factor), and never
// grows right after a rejection; a rejected step shrinks h by max(min_factor, safety e^(-1/k)).
// k is the embedded order + 1; beta2 = 0 gives the plain integral (I) controller.
struct StepController {
  double safety = 0.9;
  double min_factor = 0.2;
  double max_factor = 10;
  double beta1 = 0.7;
  double beta2 = 0.4;
};

// Adaptive steps from t0 to t_end, per trajectory, with an embedded pair. The error of a step is
// the RMS over components of err_i / (atol_i + rtol_i max(|y_i|, |y_next_i|)); a step is accepted
// when it is at most 1. Observations come from the method's dense output.
struct AdaptiveSteps {
  double t0 = 0;
  double t_end = 0;
  double rtol = 1e-6;
  double atol = 1e-8;
  std::vector<double> rtol_per_component; // when not empty (length n): replaces rtol
  std::vector<double> atol_per_component; // when not empty (length n): replaces atol
  double first_step = 0;                  // 0: chosen by Hairer's heuristic (one more evaluation)
  double min_step = 0;                    // a trajectory whose step falls below it, or no longer
                                          // advances t, stops with Status::step_too_small
  int max_steps = 100000;                 // attempted steps (accepted + rejected) per trajectory
  StepController controller;
  std::vector<double> observation_times;

  AdaptiveSteps& observe_at(std::vector<double> times) {
    observation_times = std::move(times);
    return *this;
  }
};

// What the loop writes: the final state [N, n] and/or the states at the observation times
// [N, n_obs, n]. The same struct carries the cotangents of a gradient computation.
template <class FinalView = NoView, class ObservedView = NoView>
struct Outputs {
  FinalView final_state;
  ObservedView observed;
};

template <class FinalView>
Outputs<FinalView, NoView> final_state(const FinalView& y) {
  return {y, {}};
}
template <class ObservedView>
Outputs<NoView, ObservedView> observed(const ObservedView& y) {
  return {{}, y};
}
template <class FinalView, class ObservedView>
Outputs<FinalView, ObservedView> final_and_observed(const FinalView& y, const ObservedView& y_observed) {
  return {y, y_observed};
}

// Where gradients go (each overwritten, each optional): with respect to y0 [N, n], the own
// parameters [N, P] and the shared parameters [Q].
template <class Y0Bar = NoView, class ParamsBar = NoView, class SharedBar = NoView>
struct Gradients {
  Y0Bar y0;
  ParamsBar params;
  SharedBar shared;
};

// fused: the whole time loop runs in one kernel, the state in registers.
// stepped: one launch per step (adaptive: per attempt), so an observer can run between steps.
enum class LoopMode { fused, stepped };

// The loop modes a call of solve() or solve_with_gradient() compiles, its first template argument:
// all by default; solve<CompiledModes::fused_only>(...) compiles the fused loop alone, about half the
// kernels (a third for solve()), for code that never runs an observer. Such a call given
// LoopMode::stepped throws std::invalid_argument.
enum class CompiledModes { all, fused_only };

enum class OnFailure {
  throw_exception, // std::runtime_error naming the first failed trajectory and its status
  report           // the Report says which trajectories failed; their outputs are NaN
};

// Device memory from the caller (for example a framework's caching allocator) for the temporaries
// of one solve() or solve_with_gradient() call: the report and the mesh or controller data. `data`
// must be reachable from the call's execution space and hold at least
// solve_workspace_bytes<T>(N, n, steps) bytes (any alignment; the call aligns its pieces). The
// returned Report's Views then point into it and stay valid while it does. nullptr: the call
// allocates them itself.
struct Workspace {
  void* data = nullptr;
  std::size_t bytes = 0;
};

struct SolveOptions {
  LoopMode mode = LoopMode::fused;
  OnFailure on_failure = OnFailure::throw_exception;
  // Bound on the elements N * n_obs * n of the observations (0: none): a larger request throws.
  std::size_t max_observation_elements = 0;
  // Gradients: store the state every checkpoint_interval steps and recompute the ones between;
  // 0 chooses ceil(sqrt(steps)), which gives O(sqrt(steps)) memory (see gradient_workspace_bytes).
  int checkpoint_interval = 0;
  // Gradients: the batch is processed in chunks whose workspace stays below this many bytes.
  std::size_t max_gradient_workspace_bytes = std::size_t(1) << 30;
  // LoopMode::fused: where the report and mesh go (solve() then allocates nothing, and neither does
  // solve_with_gradient(), whose larger temporaries come from the workspace cache). LoopMode::stepped
  // ignores it and allocates its carries.
  Workspace workspace;
  // Adaptive gradients: the accepted steps of every trajectory, N ints in memory the execution
  // space can access, as solve() of the same problem, steps and method reported them
  // (Report::accepted.data()). solve_with_gradient() then skips the forward loop that would count
  // them, one of its two before the backward pass; its checkpointing loop checks each count and
  // throws std::invalid_argument, before the backward pass, if one differs. nullptr: counted here.
  const int* accepted_steps = nullptr;
};

enum class Status : int { success = 0, max_steps = 1, step_too_small = 2, non_finite = 3 };

inline const char* status_name(Status status) {
  switch (status) {
  case Status::success: return "success";
  case Status::max_steps: return "max_steps (the step budget ran out before t_end)";
  case Status::step_too_small: return "step_too_small (the step size fell below min_step or no longer advances t)";
  case Status::non_finite: return "non_finite (a NaN or Inf appeared in the state or the error estimate)";
  }
  return "unknown status";
}

// Per-trajectory results of a solve: status (a Status), accepted and rejected step counts.
template <class MemorySpace>
struct Report {
  Kokkos::View<int*, MemorySpace> status;
  Kokkos::View<int*, MemorySpace> accepted;
  Kokkos::View<int*, MemorySpace> rejected;
  long failed = 0;         // trajectories whose status is not success
  long first_failed = -1;  // the lowest such index
  Status first_failed_status = Status::success;
  int max_accepted = 0;
};

} // namespace paraseq::ode
