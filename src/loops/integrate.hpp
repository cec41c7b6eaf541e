#pragma once
// Batched Runge–Kutta loops: N independent trajectories of a vector field (field.hpp), with fixed
// or adaptive steps, and reverse-mode gradients through the discrete steps.
//
//   auto report = ode::solve(space, ode::RK4{}, ode::problem(field, y0, params, shared),
//                            ode::FixedSteps::count(t0, dt, steps), ode::final_state(y1), options);
//   ode::solve_with_gradient(space, method, problem, steps, outputs, cotangents, gradients, options);
//
// Shapes: y0 [N, n]; params [N, P]; shared [Q]; final state [N, n]; observations [N, n_obs, n];
// cotangents as the outputs; gradients as y0, params and shared. Views may have any layout and
// must be accessible from the execution space; they all hold the same float or double type T.
//
// Loops: one thread per trajectory runs the whole time loop in one kernel (LoopMode::fused, the
// default) or one step per launch (LoopMode::stepped), so that an observer can run on the host
// between steps; both give the same bits. Neither unrolls the time loop: its length costs run time,
// never compile time. Zero steps (or t_end = t0) return y0 (and observations at t0). Fixed steps of
// dt (count, until) form a uniform mesh that the kernels compute rather than load. A fused solve()
// allocates only its report (or nothing, given SolveOptions::workspace: see solve_workspace_bytes).
// So does solve_with_gradient: its checkpoints and adjoint state come from paraseq's workspace cache
// (core/workspace.hpp), which a later call of the same shape or a smaller one reuses.
//
// Adaptive steps (Heun, BogackiShampine3, DormandPrince5, Tsit5): each trajectory has its own step
// size and a Status. A trajectory that fails (max_steps, step_too_small, non_finite) stops; its
// final state and unreached observations are NaN, and by default solve() then throws.
//
// Gradients (the discrete adjoint, with respect to y0, own and shared parameters) go backwards
// through the steps actually taken: the fixed mesh, or the accepted adaptive mesh held fixed (the
// step-size controller is not differentiated). States are checkpointed every k steps and the steps
// in between recomputed: see gradient_workspace_bytes() for the memory. Adaptive gradients run the
// forward loop twice (once to count steps, once to checkpoint) before the backward pass, or once
// given the step counts of a solve() of the same problem (SolveOptions::accepted_steps).

#include <paraseq/config.hpp>
#include <paraseq/core/errors.hpp>
#include <paraseq/core/fill.hpp>
#include <paraseq/core/ordered_column_sum.hpp>
#include <paraseq/core/team_policy.hpp>
#include <paraseq/loops/field.hpp>
#include <paraseq/loops/integrate_kernels.hpp>
#include <paraseq/loops/options.hpp>
#include <paraseq/loops/tableaus.hpp>

#include <Kokkos_Core.hpp>
#include <Kokkos_Profiling_ScopedRegion.hpp>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace paraseq::ode {

// What an observer sees after each launch of LoopMode::stepped: the states [N, n], times [N] and
// statuses [N] (-1 while running, then a Status) of all trajectories, as device Views to read.
template <class StateView, class TimeView, class StatusView>
struct StepState {
  int launch;
  StateView y;
  TimeView t;
  StatusView status;
};

// Stands for "no observer".
struct NoObserver {};

// The checkpoint interval k of a gradient over `steps` steps: `requested` when positive, else
// ceil(sqrt(steps)), which keeps about 2 sqrt(steps) states per trajectory.
inline int checkpoint_interval(int requested, long steps) {
  return requested > 0 ? requested : std::max(1, int(std::ceil(std::sqrt(double(steps)))));
}

// Device bytes that solve_with_gradient uses per trajectory for state size n, `steps` steps
// (adaptive: the most accepted steps of any trajectory), checkpoint interval k (0: the default
// ceil(sqrt(steps))) and Q shared parameters (Q = 0 when their gradient is not asked for):
//   carry         (2n + 3) sizeof(T) + 5 sizeof(int)
//   checkpoints   (floor(steps / k) + 1) (n sizeof(T) [+ 3 sizeof(T) + sizeof(int) adaptive]) [+ sizeof(int): the lag, adaptive]
//   segment       k (n [+ 3 adaptive]) sizeof(T)
//   backward      n sizeof(T) + 3 sizeof(int)
//   shared rows   Q sizeof(T)
// Batches whose total exceeds SolveOptions::max_gradient_workspace_bytes run in chunks. With the
// default k the checkpoints and the segment together hold about 2 sqrt(steps) states. A call with a
// shared gradient also uses its block sums: at most max(Q, 65536) doubles (OrderedColumnSum). All
// of it stays in the workspace cache for the next call until paraseq::release_workspace().
template <class T>
std::size_t gradient_workspace_bytes(bool adaptive, int n, long steps, int interval, int shared_parameters) {
  const long k = checkpoint_interval(interval, steps);
  return detail::CarryViews<T, Kokkos::DefaultHostExecutionSpace>::bytes_per_trajectory(n) +
         detail::Checkpoints<T, Kokkos::DefaultHostExecutionSpace>::bytes_per_trajectory(adaptive, steps / k + 1, k, n) +
         n * sizeof(T) + 3 * sizeof(int) + std::size_t(shared_parameters) * sizeof(T);
}

namespace detail {
inline constexpr std::size_t workspace_alignment = 256;
} // namespace detail

// The bytes of a SolveOptions::workspace that solve() needs for N trajectories of state size n with
// these steps (fused mode): the report (3 N ints), an explicit mesh's points and lengths, the
// observations' mesh points (fixed steps) or the tolerances and observation times (adaptive steps),
// each piece with room for its alignment.
template <class T>
std::size_t solve_workspace_bytes(long N, int, const FixedSteps& steps) {
  const std::size_t observations = steps.observation_times.size();
  const std::size_t grid_steps = steps.grid.empty() ? std::size_t(std::max(steps.steps, 0)) : steps.grid.size() - 1;
  const std::size_t mesh_steps = grid_steps + observations; // each observation splits at most one step
  constexpr std::size_t A = detail::workspace_alignment;
  return 3 * std::size_t(N) * sizeof(int) + A + (2 * mesh_steps + 1) * sizeof(T) + A + observations * sizeof(int) + A;
}
template <class T>
std::size_t solve_workspace_bytes(long N, int n, const AdaptiveSteps& steps) {
  constexpr std::size_t A = detail::workspace_alignment;
  return 3 * std::size_t(N) * sizeof(int) + A + (2 * std::size_t(n) + steps.observation_times.size()) * sizeof(T) + A;
}

namespace detail {

template <class V>
using value_t = typename V::non_const_value_type;

// A View argument of the given rank holding T (or NoView), writable if asked, reachable from Space.
template <class Space, class T, int Rank, bool Writable, class V>
constexpr bool view_fits() {
  if constexpr (!is_given_v<V>) return true;
  else if constexpr (!Kokkos::is_view_v<V>) return false;
  else
    return int(V::rank) == Rank && std::is_same_v<value_t<V>, T> &&
           (!Writable || !std::is_const_v<typename V::value_type>) &&
           Kokkos::SpaceAccessibility<Space, typename V::memory_space>::accessible;
}

template <class T, class V>
Strided1<T> strided1(const V& v) {
  if constexpr (is_given_v<V>) return {v.data(), long(v.stride(0))};
  else return {};
}
template <class T, class V>
Strided2<T> strided2(const V& v) {
  if constexpr (is_given_v<V>) return {v.data(), long(v.stride(0)), long(v.stride(1))};
  else return {};
}
template <class T, class V>
Strided3<T> strided3(const V& v) {
  if constexpr (is_given_v<V>) return {v.data(), long(v.stride(0)), long(v.stride(1)), long(v.stride(2))};
  else return {};
}

// P, the own parameters per trajectory (0 without a params View).
template <class V>
int parameter_count(const V& params) {
  if constexpr (is_given_v<V>) return int(params.extent(1));
  else return 0;
}

template <class V>
void require_extents_if_given(const std::string& fn, const std::string& name, const V& v,
                              std::initializer_list<long> extents, const std::string& meaning) {
  if constexpr (is_given_v<V>) require_extents(fn, name, v, extents, meaning);
}

inline void require(bool ok, const std::string& fn, const std::string& argument, const std::string& given,
                    const std::string& expected) {
  if (!ok) throw_invalid(fn, argument, given, expected);
}

inline std::string value_text(double x) { return "value " + std::to_string(x); }

template <class V>
KOKKOS_INLINE_FUNCTION bool row_is_finite(const V& v, long i) {
  bool finite = true;
  if constexpr (V::rank == 1) finite = Kokkos::isfinite(v(i));
  else
    for (long j = 0; j < long(v.extent(1)); ++j) {
      if constexpr (V::rank == 2) finite = finite && Kokkos::isfinite(v(i, j));
      else
        for (long k = 0; k < long(v.extent(2)); ++k) finite = finite && Kokkos::isfinite(v(i, j, k));
    }
  return finite;
}

// lowest = i if row i of v exists and holds a NaN or Inf (and i is lower).
template <class V>
KOKKOS_INLINE_FUNCTION void note_nonfinite_row(const V& v, long i, long& lowest) {
  if constexpr (is_given_v<V>)
    if (i < long(v.extent(0)) && i < lowest && !row_is_finite(v, i)) lowest = i;
}

// The reduction of require_finite: the lowest non-finite row of each of the three Views.
template <class A, class B, class C>
struct LowestNonfiniteRows {
  A a;
  B b;
  C c;
  KOKKOS_INLINE_FUNCTION void operator()(long i, long& lowest_a, long& lowest_b, long& lowest_c) const {
    note_nonfinite_row(a, i, lowest_a);
    note_nonfinite_row(b, i, lowest_b);
    note_nonfinite_row(c, i, lowest_c);
  }
};

// Throws if one of up to three Views (rank 1 to 3, each optional) holds a NaN or Inf, naming the
// first such View in argument order and its first such row. One reduction and one host read for all.
template <class Space, class A, class B = NoView, class C = NoView>
void require_finite(const std::string& fn, const Space& space, const char* const (&names)[3], const A& a,
                    const B& b = {}, const C& c = {}) {
  auto rows = [](const auto& v) {
    if constexpr (is_given_v<std::decay_t<decltype(v)>>) return long(v.extent(0));
    else return 0L;
  };
  const long count = std::max({rows(a), rows(b), rows(c)});
  if (count == 0) return;
  long first_a = LONG_MAX, first_b = LONG_MAX, first_c = LONG_MAX;
  Kokkos::parallel_reduce("paraseq::ode::check_finite", Kokkos::RangePolicy<Space>(space, 0, count),
                          LowestNonfiniteRows<A, B, C>{a, b, c}, Kokkos::Min<long>(first_a), Kokkos::Min<long>(first_b),
                          Kokkos::Min<long>(first_c));
  const long first[3] = {first_a, first_b, first_c};
  for (int k = 0; k < 3; ++k)
    if (first[k] != LONG_MAX)
      throw_invalid(fn, names[k], "a NaN or Inf in row " + std::to_string(first[k]), "finite values");
}

template <class Field>
void check_field(const std::string& fn, const Field& field, int n) {
  require(n >= 1 && n <= max_state_size, fn, "field", "state size n = " + std::to_string(n),
          "1 <= n <= " + std::to_string(max_state_size));
  if constexpr (HasValidate<Field>) field.validate(fn);
}

// Observation times: nondecreasing, finite, within [t0, t_end].
inline void check_observation_times(const std::string& fn, const std::vector<double>& times, double t0, double t_end) {
  for (std::size_t j = 0; j < times.size(); ++j) {
    const std::string which = "observation_times[" + std::to_string(j) + "]";
    require(std::isfinite(times[j]) && times[j] >= t0 && times[j] <= t_end, fn, which, value_text(times[j]),
            "a time within [t0, t_end] = [" + std::to_string(t0) + ", " + std::to_string(t_end) + "]");
    require(j == 0 || times[j] >= times[j - 1], fn, which, value_text(times[j]),
            "nondecreasing times (the previous is " + (j ? std::to_string(times[j - 1]) : std::string()) + ")");
  }
}

// Aligned pieces of a caller's workspace (SolveOptions::workspace), whose size solve() has checked
// against solve_workspace_bytes, or nothing (allocate instead) when none was given.
class WorkspaceArena {
public:
  WorkspaceArena() = default;
  explicit WorkspaceArena(const Workspace& workspace)
      : begin_(static_cast<char*>(workspace.data)), bytes_(workspace.bytes) {}
  bool given() const { return begin_ != nullptr; }
  template <class T>
  T* take(std::size_t count) {
    const auto base = reinterpret_cast<std::uintptr_t>(begin_);
    const std::size_t start =
        (base + used_ + workspace_alignment - 1) / workspace_alignment * workspace_alignment - base;
    if (start + count * sizeof(T) > bytes_)
      throw std::logic_error("paraseq::ode: the workspace ran out (solve_workspace_bytes is too small)");
    used_ = start + count * sizeof(T);
    return reinterpret_cast<T*>(begin_ + start);
  }

private:
  char* begin_ = nullptr;
  std::size_t bytes_ = 0, used_ = 0;
};

// Host buffers that uploads read from, kept until the call's next fence (the status summary), so
// that no upload waits for its copy to finish. Destroyed early (an exception), it fences first.
template <class Space>
class Staging {
public:
  explicit Staging(const Space& space, WorkspaceArena* arena = nullptr) : space_(space), arena_(arena) {}
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;
  ~Staging() {
    if (!held_.empty()) space_.fence();
  }
  // After a fence of the space: nothing is in flight any more.
  void release() { held_.clear(); }

  // A device copy of `values` (in the workspace, if any), uploaded on the space in one copy, without a fence.
  template <class T>
  Kokkos::View<T*, typename Space::memory_space> upload(std::vector<T> values, const std::string& label) {
    auto host = std::make_shared<const std::vector<T>>(std::move(values));
    Kokkos::View<T*, typename Space::memory_space> device;
    if (arena_ && arena_->given()) device = decltype(device)(arena_->take<T>(host->size()), host->size());
    else device = decltype(device)(Kokkos::view_alloc(space_, Kokkos::WithoutInitializing, label), host->size());
    if (!host->empty()) {
      Kokkos::deep_copy(space_, device,
                        Kokkos::View<const T*, Kokkos::HostSpace, Kokkos::MemoryUnmanaged>(host->data(), host->size()));
      held_.push_back(host);
    }
    return device;
  }

private:
  Space space_;
  WorkspaceArena* arena_;
  std::vector<std::shared_ptr<const void>> held_;
};

// The mesh of fixed steps: the grid with the observation times inside its steps inserted. Steps of
// dt (count, until) with no observation inside a step give a uniform mesh, which stores nothing on
// the device but the observations' mesh points.
template <class T, class Space>
FixedMesh<T, typename Space::memory_space> build_mesh(const std::string& fn, Staging<Space>& staging,
                                                       const FixedSteps& steps) {
  std::vector<double> grid = steps.grid;
  const bool regular = grid.empty();
  if (regular) {
    require(steps.steps >= 0, fn, "steps", "steps = " + std::to_string(steps.steps), "steps >= 0");
    require(std::isfinite(steps.t0), fn, "steps", "t0 " + value_text(steps.t0), "a finite t0");
    if (steps.steps > 0) {
      require(steps.dt > 0 && std::isfinite(steps.dt), fn, "steps", "dt " + value_text(steps.dt), "a finite dt > 0");
      const double last_start = steps.t0 + (steps.steps - 1) * steps.dt;
      require(std::isfinite(steps.t_end) && steps.t_end > last_start, fn, "steps", "t_end " + value_text(steps.t_end),
              "t_end > t0 + (steps - 1) dt = " + std::to_string(last_start));
    }
    grid.resize(std::size_t(steps.steps) + 1);
    for (int k = 0; k < steps.steps; ++k) grid[k] = steps.t0 + k * steps.dt;
    grid[steps.steps] = steps.steps > 0 ? steps.t_end : steps.t0;
  } else {
    for (std::size_t k = 0; k < grid.size(); ++k)
      require(std::isfinite(grid[k]) && (k == 0 || grid[k] > grid[k - 1]), fn, "steps",
              "grid[" + std::to_string(k) + "] " + value_text(grid[k]), "finite, strictly increasing grid times");
  }
  const std::vector<double>& observations = steps.observation_times;
  check_observation_times(fn, observations, grid.front(), grid.back());

  // Observations within a few ulps of a grid point (0.3 against 3 * 0.1) fall on it, not a step away.
  const double span = grid.back() - grid.front();
  auto near_grid = [&](double t, double g) {
    return std::fabs(t - g) <= 8 * std::numeric_limits<double>::epsilon() * std::max(std::fabs(g), span);
  };
  std::vector<double> points;
  std::vector<int> observation_point(observations.size()); // the mesh point of each observation
  std::size_t j = 0;
  for (double g : grid) {
    for (; j < observations.size() && observations[j] < g && !near_grid(observations[j], g); ++j) {
      if (observations[j] != points.back()) points.push_back(observations[j]); // inside the step before g
      observation_point[j] = int(points.size()) - 1;
    }
    points.push_back(g);
    for (; j < observations.size() && (observations[j] <= g || near_grid(observations[j], g)); ++j)
      observation_point[j] = int(points.size()) - 1;
  }
  const int count = int(points.size()) - 1;
  FixedMesh<T, typename Space::memory_space> mesh;
  mesh.steps = count;
  mesh.uniform = regular && points.size() == grid.size();
  if (mesh.uniform) {
    mesh.t0 = T(steps.t0), mesh.dt = T(steps.dt), mesh.t_end = T(grid.back());
    // The last step from t0 + (steps - 1) dt to t_end, rounded once: a partial step lands on t_end.
    mesh.h_last = count > 0 ? T(grid.back() - (steps.t0 + (count - 1) * steps.dt)) : T(0);
  } else {
    // points [count + 1] then lengths [count], in one upload; lengths in T, so that t + h is t_next
    // wherever the difference is exact.
    std::vector<T> values(2 * std::size_t(count) + 1);
    for (int m = 0; m <= count; ++m) values[m] = T(points[m]);
    for (int m = 0; m < count; ++m) values[count + 1 + m] = values[m + 1] - values[m];
    const auto device = staging.upload(std::move(values), "paraseq::ode::mesh");
    mesh.points = Kokkos::subview(device, std::make_pair(0, count + 1));
    mesh.lengths = Kokkos::subview(device, std::make_pair(count + 1, 2 * count + 1));
    mesh.t0 = T(points.front()), mesh.t_end = T(points.back());
  }
  if (!observation_point.empty()) mesh.observation_point = staging.upload(std::move(observation_point), "paraseq::ode::mesh_observations");
  return mesh;
}

template <class Method, class T, class Space>
AdaptiveControl<T, typename Space::memory_space> build_control(const std::string& fn, Staging<Space>& staging,
                                                               const AdaptiveSteps& steps, int n) {
  require(std::isfinite(steps.t0), fn, "steps", "t0 " + value_text(steps.t0), "a finite t0");
  require(std::isfinite(steps.t_end) && steps.t_end >= steps.t0, fn, "steps", "t_end " + value_text(steps.t_end),
          "a finite t_end >= t0 = " + std::to_string(steps.t0));
  auto per_component = [&](const std::vector<double>& given, double scalar, const char* name) {
    require(given.empty() || int(given.size()) == n, fn, std::string("steps.") + name + "_per_component",
            "length " + std::to_string(given.size()), "length n = " + std::to_string(n) + " (or empty)");
    std::vector<T> values(n);
    for (int k = 0; k < n; ++k) {
      const double v = given.empty() ? scalar : given[k];
      require(std::isfinite(v) && v >= 0, fn, std::string("steps.") + name, value_text(v), "a finite value >= 0");
      values[k] = T(v);
    }
    return values;
  };
  const std::vector<T> rtol = per_component(steps.rtol_per_component, steps.rtol, "rtol");
  const std::vector<T> atol = per_component(steps.atol_per_component, steps.atol, "atol");
  for (int k = 0; k < n; ++k)
    require(rtol[k] > 0 || atol[k] > 0, fn, "steps", "rtol = atol = 0 for component " + std::to_string(k),
            "rtol > 0 or atol > 0 for every component");
  require(std::isfinite(steps.first_step) && steps.first_step >= 0, fn, "steps.first_step", value_text(steps.first_step),
          "a finite value >= 0 (0: chosen automatically)");
  require(std::isfinite(steps.min_step) && steps.min_step >= 0, fn, "steps.min_step", value_text(steps.min_step),
          "a finite value >= 0");
  require(steps.max_steps >= 1, fn, "steps.max_steps", "max_steps = " + std::to_string(steps.max_steps), "max_steps >= 1");
  const StepController& pi = steps.controller;
  require(pi.safety > 0 && pi.safety <= 1, fn, "steps.controller.safety", value_text(pi.safety), "0 < safety <= 1");
  require(pi.min_factor > 0 && pi.min_factor <= 1 && pi.max_factor >= 1 && std::isfinite(pi.max_factor), fn,
          "steps.controller", "min_factor " + std::to_string(pi.min_factor) + ", max_factor " + std::to_string(pi.max_factor),
          "0 < min_factor <= 1 <= max_factor");
  require(pi.beta1 >= 0 && pi.beta2 >= 0, fn, "steps.controller",
          "beta1 " + std::to_string(pi.beta1) + ", beta2 " + std::to_string(pi.beta2), "beta1 >= 0 and beta2 >= 0");
  check_observation_times(fn, steps.observation_times, steps.t0, steps.t_end);

  const double k = Method::embedded_order + 1;
  AdaptiveControl<T, typename Space::memory_space> control;
  control.t0 = T(steps.t0), control.t_end = T(steps.t_end);
  control.first_step = T(steps.first_step), control.min_step = T(steps.min_step);
  control.max_steps = steps.max_steps;
  control.safety = T(pi.safety), control.min_factor = T(pi.min_factor), control.max_factor = T(pi.max_factor);
  control.beta1 = T(pi.beta1 / k), control.beta2 = T(pi.beta2 / k);
  control.reject_exponent = T(1 / k), control.first_step_exponent = T(1 / k);
  // rtol [n], atol [n] and the observation times [n_obs] in one upload.
  std::vector<T> values(rtol);
  values.insert(values.end(), atol.begin(), atol.end());
  values.insert(values.end(), steps.observation_times.begin(), steps.observation_times.end());
  const auto device = staging.upload(std::move(values), "paraseq::ode::control");
  control.rtol = Kokkos::subview(device, std::make_pair(0, n));
  control.atol = Kokkos::subview(device, std::make_pair(n, 2 * n));
  control.observation_times = Kokkos::subview(device, std::make_pair(2 * n, int(device.extent(0))));
  return control;
}

// Runs f(std::integral_constant<int, Capacity>): n itself when known at compile time, else, on a
// device, the smallest of 8, 32 and 64 that holds it (a GPU thread's arrays beyond its registers
// go to local memory, which the GPU reserves for every thread it can hold). A host thread's arrays
// are on its stack, where a larger capacity costs only space: hosts compile one, 64, a third of
// the kernels.
template <class Field, class Space, class F>
void with_capacity(int n, const F& f) {
  if constexpr (Field::state_size != runtime_size) f(std::integral_constant<int, Field::state_size>{});
  else if constexpr (Kokkos::SpaceAccessibility<Space, Kokkos::HostSpace>::accessible)
    f(std::integral_constant<int, max_state_size>{});
  else if (n <= 8) f(std::integral_constant<int, 8>{});
  else if (n <= 32) f(std::integral_constant<int, 32>{});
  else f(std::integral_constant<int, max_state_size>{});
}

// Adaptive trajectories take different step counts, so host threads take them dynamically.
template <bool Adaptive, class Space, class... Tag>
auto trajectory_policy(const Space& space, int begin, int end) {
  using Schedule = Kokkos::Schedule<std::conditional_t<Adaptive, Kokkos::Dynamic, Kokkos::Static>>;
  return Kokkos::RangePolicy<Space, Schedule, Tag...>(space, begin, end);
}

template <class StatusView>
struct CountRunning {
  StatusView status;
  KOKKOS_INLINE_FUNCTION void operator()(int i, long& sum) const { sum += status(i) == status_running; }
};

template <class Space, class StatusView>
long count_running(const Space& space, const StatusView& status) {
  long running = 0;
  Kokkos::parallel_reduce("paraseq::ode::count_running", Kokkos::RangePolicy<Space>(space, 0, status.extent(0)),
                          CountRunning<StatusView>{status}, running);
  return running;
}

// The loop: one launch that also sets up and reports (fused), or an init launch and one launch per
// step (stepped), calling the observer after each.
template <class Kernel, class Space>
void run_fused(const Space& space, const Kernel& kernel, int begin, int end) {
  constexpr bool adaptive = decltype(kernel.stepping)::adaptive;
  const int blocks = int(paraseq::detail::ceil_div(end - begin, Kernel::lanes));
  Kokkos::parallel_for("paraseq::ode::fused", trajectory_policy<adaptive, Space, typename Kernel::FusedTag>(space, 0, blocks),
                       kernel);
}

template <class Kernel, class Space, class Observer>
void run_stepped(const Space& space, Kernel kernel, int begin, int end, int fixed_steps, const Observer& observer) {
  constexpr bool adaptive = decltype(kernel.stepping)::adaptive;
  const int blocks = int(paraseq::detail::ceil_div(end - begin, Kernel::lanes));
  Kokkos::parallel_for("paraseq::ode::init", trajectory_policy<false, Space, typename Kernel::InitTag>(space, begin, end),
                       kernel);
  kernel.iterations = 1;
  for (int launch = 0; adaptive ? count_running(space, kernel.carry.status) > 0 : launch < fixed_steps; ++launch) {
    Kokkos::parallel_for("paraseq::ode::step", trajectory_policy<adaptive>(space, 0, blocks), kernel);
    if constexpr (!std::is_same_v<Observer, NoObserver>) {
      space.fence();
      observer(StepState<decltype(kernel.carry.y), decltype(kernel.carry.t), decltype(kernel.carry.status)>{
          launch, kernel.carry.y, kernel.carry.t, kernel.carry.status});
    }
  }
}

// The loop kernels a pass compiles: a call of CompiledModes::all picks one of two passes at run
// time, so that its fused pass is the same function as a CompiledModes::fused_only call's (for a
// built-in field, the paraseq library's compiled instance: cmake/paraseqInstances.cmake).
enum class Loop { fused, stepped };

template <Loop L, class Kernel, class Space, class Observer>
void run_forward(const Space& space, const Kernel& kernel, int begin, int end, int fixed_steps, const Observer& observer) {
  if constexpr (L == Loop::fused) run_fused(space, kernel, begin, end);
  else run_stepped(space, kernel, begin, end, fixed_steps, observer);
}

// Refuses a loop mode that the call did not compile.
template <CompiledModes Modes>
void check_loop_mode(const std::string& fn, LoopMode mode) {
  require(Modes == CompiledModes::all || mode == LoopMode::fused, fn, "options.mode", "LoopMode::stepped",
          "LoopMode::fused: this call compiles the fused loop only (CompiledModes::fused_only)");
}

// The three per-trajectory Views of a report in one allocation (or piece of the workspace).
template <class Space>
Report<typename Space::memory_space> allocate_report(const Space& space, long N, WorkspaceArena* arena = nullptr) {
  Kokkos::View<int*, typename Space::memory_space> block;
  if (arena && arena->given()) block = decltype(block)(arena->take<int>(3 * std::size_t(N)), 3 * N);
  else block = decltype(block)(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, "paraseq::ode::report"), 3 * N);
  return {Kokkos::subview(block, std::make_pair(0L, N)), Kokkos::subview(block, std::make_pair(N, 2 * N)),
          Kokkos::subview(block, std::make_pair(2 * N, 3 * N))};
}

template <class Space>
ReportRows report_rows(const Report<typename Space::memory_space>& report) {
  return {report.status.data(), report.accepted.data(), report.rejected.data()};
}

// The reduction of summarize: failures, the lowest failed key 8 i + status + 1, the most accepted steps.
template <class Mem>
struct SummarizeReport {
  Kokkos::View<int*, Mem> status, accepted;
  KOKKOS_INLINE_FUNCTION void operator()(long i, long& failures, long& lowest, int& highest) const {
    const bool bad = status(i) != int(Status::success);
    failures += bad;
    const long key = 8 * i + (status(i) + 1);
    if (bad && key < lowest) lowest = key;
    if (accepted(i) > highest) highest = accepted(i);
  }
};

// Fills the report's totals from its per-trajectory Views (one reduction, one host read, which is
// the call's fence: the staged uploads are released after it) and throws if asked to.
template <class Space, class Mem>
void summarize(const std::string& fn, const Space& space, Report<Mem>& report, bool throw_on_failure,
               Staging<Space>* staging = nullptr) {
  const long N = long(report.status.extent(0));
  long failed = 0, first = LONG_MAX; // first: 8 i + status + 1 of the lowest failed trajectory i
  int most = 0;
  Kokkos::parallel_reduce("paraseq::ode::summarize", Kokkos::RangePolicy<Space>(space, 0, N),
                          SummarizeReport<Mem>{report.status, report.accepted}, Kokkos::Sum<long>(failed),
                          Kokkos::Min<long>(first), Kokkos::Max<int>(most));
  if (staging) staging->release();
  report.failed = failed;
  report.max_accepted = most;
  if (failed == 0) return;
  report.first_failed = first / 8;
  report.first_failed_status = Status(int(first % 8) - 1);
  if (throw_on_failure)
    throw std::runtime_error(fn + ": " + std::to_string(failed) + " of " + std::to_string(N) +
                             " trajectories failed; the first, trajectory " + std::to_string(report.first_failed) +
                             ", stopped with status " + status_name(report.first_failed_status));
}

// The forward loop over all N trajectories, with its report (see summarize). The fused loop keeps
// each trajectory's carry in registers and allocates only the report; the stepped loop keeps the
// carries in Views between launches, and the report is the carry's status and step counts.
template <class Method, Loop L, class Field, class T, class Space, class Stepping, class Observer>
Report<typename Space::memory_space> forward_pass(const std::string& fn, const Space& space, const Field& field, int n,
                                                  int N, const ForwardData<T>& data, const Stepping& stepping,
                                                  const Observer& observer, bool throw_on_failure,
                                                  Staging<Space>& staging, WorkspaceArena* arena) {
  Report<typename Space::memory_space> report;
  with_capacity<Field, Space>(n, [&](auto capacity) {
    constexpr int C = decltype(capacity)::value;
    if constexpr (L == Loop::fused) {
      report = allocate_report(space, N, arena);
      using Kernel = Forward<Method, Field, T, C, Space, Stepping, false, false>;
      run_fused(space, Kernel{field, n, data, stepping, {}, {}, 0, N, 0, report_rows<Space>(report)}, 0, N);
    } else {
      int fixed_steps = 0;
      if constexpr (!Stepping::adaptive) fixed_steps = stepping.steps;
      CarryViews<T, Space> carry(space, N, n, false);
      report = {carry.status, carry.step, carry.rejected};
      using Kernel = Forward<Method, Field, T, C, Space, Stepping, false, true>;
      run_stepped(space, Kernel{field, n, data, stepping, carry, {}, 0, N, 0, {}}, 0, N, fixed_steps, observer);
    }
  });
  summarize(fn, space, report, throw_on_failure, &staging);
  return report;
}

// Each adaptive trajectory's lag (Checkpoints): its accepted steps (counted before the checkpointing
// pass) rounded up to a multiple of the interval, less themselves.
template <class Lag, class Accepted>
struct SegmentLags {
  Lag lag;
  Accepted accepted;
  int begin, interval;
  KOKKOS_INLINE_FUNCTION void operator()(int row) const {
    lag(row) = (interval - accepted(begin + row) % interval) % interval;
  }
};

// to(q) = from(q), converted to to's value type.
template <class From, class To>
struct Convert {
  From from;
  To to;
  KOKKOS_INLINE_FUNCTION void operator()(int q) const { to(q) = typename To::non_const_value_type(from(q)); }
};

template <class Space, class From, class To>
void convert(const Space& space, const From& from, const To& to) {
  Kokkos::parallel_for("paraseq::ode::convert", Kokkos::RangePolicy<Space>(space, 0, to.extent(0)),
                       Convert<From, To>{from, to});
}

// The caller's SolveOptions::workspace for the fused loop's report and mesh, checked against
// solve_workspace_bytes; none in the stepped mode, which allocates them.
template <class T, class Steps>
WorkspaceArena workspace_arena(const std::string& fn, const SolveOptions& options, long N, int n, const Steps& steps) {
  if (!options.workspace.data || options.mode != LoopMode::fused) return {};
  const std::size_t needed = solve_workspace_bytes<T>(N, n, steps);
  require(options.workspace.bytes >= needed, fn, "options.workspace", std::to_string(options.workspace.bytes) + " bytes",
          "at least solve_workspace_bytes(N, n, steps) = " + std::to_string(needed) + " bytes");
  return WorkspaceArena(options.workspace);
}

// Checks what solve() and solve_with_gradient() share; returns n.
template <class Space, class Field, class Y0, class Params, class Shared, class Steps, class Final, class Observed>
int check_problem(const std::string& fn, const Space& space, const Problem<Field, Y0, Params, Shared>& problem,
                  const Steps& steps, const Outputs<Final, Observed>& outputs, const SolveOptions& options) {
  const Field& field = problem.field;
  const int n = field_size(field);
  check_field(fn, field, n);
  const long N = long(problem.y0.extent(0));
  require_extents(fn, "y0", problem.y0, {N, n}, "[N, n] with n the field's state size");
  if constexpr (is_given_v<Params>) {
    if constexpr (HasParameterCount<Field>)
      require_extents(fn, "params", problem.params, {N, field.parameter_count()},
                      "[N, P] with P the field's parameter_count()");
    else require_extents(fn, "params", problem.params, {N, long(problem.params.extent(1))}, "[N, P]: a row per trajectory");
  } else if constexpr (HasParameterCount<Field>) {
    require(field.parameter_count() == 0, fn, "params", "no View",
            "a [N, " + std::to_string(field.parameter_count()) + "] View of the field's own parameters");
  }
  if constexpr (is_given_v<Shared>) {
    if constexpr (HasSharedParameterCount<Field>)
      require_extents(fn, "shared", problem.shared, {field.shared_parameter_count()}, "[Q] with Q the field's shared_parameter_count()");
  } else if constexpr (HasSharedParameterCount<Field>) {
    require(field.shared_parameter_count() == 0, fn, "shared", "no View",
            "a [" + std::to_string(field.shared_parameter_count()) + "] View of the field's shared parameters");
  }
  // The kernels keep as many parameters (and gradient sums) in registers as the field's bounds say.
  if constexpr (is_given_v<Params> && register_parameters<Field> > 0)
    require(long(problem.params.extent(1)) <= Field::max_parameter_count, fn, "params",
            "shape " + shape_of(problem.params),
            "at most max_parameter_count = " + std::to_string(Field::max_parameter_count) + " columns (the field's bound)");
  if constexpr (is_given_v<Shared> && register_shared_parameters<Field> > 0)
    require(long(problem.shared.extent(0)) <= Field::max_shared_parameter_count, fn, "shared",
            "shape " + shape_of(problem.shared),
            "at most max_shared_parameter_count = " + std::to_string(Field::max_shared_parameter_count) +
                " values (the field's bound)");
  const long observations = long(steps.observation_times.size());
  require_extents_if_given(fn, "outputs.final_state", outputs.final_state, {N, n}, "[N, n], the shape of y0");
  require_extents_if_given(fn, "outputs.observed", outputs.observed, {N, observations, n},
                           "[N, n_obs, n] with n_obs the number of observation times");
  if (options.max_observation_elements > 0 && is_given_v<Observed>) {
    const double elements = double(N) * double(observations) * n;
    require(elements <= double(options.max_observation_elements), fn, "outputs.observed",
            std::to_string(long(elements)) + " elements (N * n_obs * n)",
            "at most options.max_observation_elements = " + std::to_string(options.max_observation_elements));
  }
  require(options.checkpoint_interval >= 0, fn, "options.checkpoint_interval",
          "value " + std::to_string(options.checkpoint_interval), "a value >= 0 (0: ceil(sqrt(steps)))");
  require_finite(fn, space, {"y0", "params", "shared"}, problem.y0, problem.params, problem.shared);
  return n;
}

// The cotangents and gradients of solve_with_gradient, as its backward kernels read them.
template <class T>
struct GradientViews {
  Strided2<const T> final_bar;    // [N, n]
  Strided3<const T> observed_bar; // [N, n_obs, n]
  Strided2<T> y0_bar;             // [N, n]
  Strided2<T> params_bar;         // [N, P]
  int parameters = 0;             // P
};

// The most accepted steps of any trajectory, and the lowest trajectory whose accepted steps differ
// between two counts (LONG_MAX if none).
template <class Counts>
struct MostAccepted {
  Counts accepted;
  KOKKOS_INLINE_FUNCTION void operator()(long i, int& most) const { most = Kokkos::max(most, accepted(i)); }
};
template <class Given, class Taken>
struct FirstDifferentCount {
  Given given;
  Taken taken;
  KOKKOS_INLINE_FUNCTION void operator()(long i, long& lowest) const {
    if (given(i) != taken(i)) lowest = Kokkos::min(lowest, i);
  }
};

// The most accepted steps of any trajectory in `accepted` (read on the host).
template <class Space, class Counts>
int most_accepted(const Space& space, const Counts& accepted) {
  int most = 0;
  Kokkos::parallel_reduce("paraseq::ode::most_accepted", Kokkos::RangePolicy<Space>(space, 0, long(accepted.extent(0))),
                          MostAccepted<Counts>{accepted}, Kokkos::Max<int>(most));
  space.fence("paraseq::ode::solve_with_gradient: read the most accepted steps");
  return most;
}

// Throws if the checkpointing loop took other accepted steps than options.accepted_steps gave for
// trajectories [begin, end) (`taken`: its report rows): the checkpoints were placed for the given
// counts, so the backward pass would read the wrong states.
template <class Space, class Given, class Taken>
void require_given_counts(const std::string& fn, const Space& space, const Given& given, const Taken& taken, int begin,
                          int end) {
  long first = LONG_MAX;
  Kokkos::parallel_reduce("paraseq::ode::check_accepted_steps", Kokkos::RangePolicy<Space>(space, begin, end),
                          FirstDifferentCount<Given, Taken>{given, taken}, Kokkos::Min<long>(first));
  space.fence("paraseq::ode::solve_with_gradient: check the accepted steps");
  if (first == LONG_MAX) return;
  int given_count = 0, taken_count = 0;
  Kokkos::deep_copy(space, given_count, Kokkos::subview(given, first));
  Kokkos::deep_copy(space, taken_count, Kokkos::subview(taken, first));
  space.fence("paraseq::ode::solve_with_gradient: read the accepted steps");
  throw_invalid(fn, "options.accepted_steps",
                std::to_string(given_count) + " accepted steps for trajectory " + std::to_string(first) +
                    ", which took " + std::to_string(taken_count),
                "the accepted steps of solve() with the same problem, steps and method (Report::accepted)");
}

// The passes of solve_with_gradient over all N trajectories: (adaptive steps, unless
// options.accepted_steps gives the counts) a forward loop that counts each trajectory's accepted
// steps, which size and place the checkpoints, then per chunk of trajectories a checkpointing
// forward loop and the backward loop. Writes the gradients and the shared parameters' gradient
// rows summed into shared_total [Q]; returns the report (not yet summarized).
template <class Method, Loop L, bool OwnGradients, class Field, class T, class Space, class Stepping>
Report<typename Space::memory_space>
gradient_pass(const std::string& fn, const Space& space, const Field& field, int n, int N, const ForwardData<T>& data,
              const Stepping& stepping, const GradientViews<T>& gradients, const SolveOptions& options,
              Staging<Space>& staging, const Kokkos::View<double*, typename Space::memory_space>& shared_total,
              WorkspaceArena* arena) {
  using Mem = typename Space::memory_space;
  constexpr bool adaptive = Stepping::adaptive;
  const int shared_rows = int(shared_total.extent(0));
  // Adaptive steps: each trajectory's accepted steps, given or counted by a first pass, size and
  // place the checkpoints.
  const bool given_counts = adaptive && options.accepted_steps;
  Report<Mem> report;
  if constexpr (adaptive)
    if (!given_counts)
      report = forward_pass<Method, L>(fn, space, field, n, N, data, stepping, NoObserver{}, true, staging, arena);
  if (!adaptive || given_counts) report = allocate_report(space, N, arena);
  const Kokkos::View<const int*, Mem, Kokkos::MemoryUnmanaged> counts(
      given_counts ? options.accepted_steps : report.accepted.data(), given_counts || adaptive ? N : 0);
  int most_steps = 0;
  if constexpr (adaptive) most_steps = given_counts ? most_accepted(space, counts) : report.max_accepted;
  else most_steps = stepping.steps;

  with_capacity<Field, Space>(n, [&](auto capacity) {
    constexpr int C = decltype(capacity)::value;
    const int interval = checkpoint_interval(options.checkpoint_interval, most_steps);
    const std::size_t per_trajectory = gradient_workspace_bytes<T>(adaptive, n, most_steps, interval, shared_rows);
    require(per_trajectory <= options.max_gradient_workspace_bytes, fn, "options.max_gradient_workspace_bytes",
            "value " + std::to_string(options.max_gradient_workspace_bytes),
            "at least " + std::to_string(per_trajectory) + " bytes, the workspace of one trajectory");
    const int chunk = int(std::min<std::size_t>(std::max<long>(N, 1), options.max_gradient_workspace_bytes / per_trajectory));

    CarryViews<T, Space> carry(space, chunk, n, true);
    // The shared parameters' gradient rows of all N trajectories, summed in an order that neither
    // the device nor the chunking of the batch changes (blocks of at least 256 trajectories).
    const paraseq::detail::OrderedColumnSum<Space> shared_sum(space, "paraseq::ode::shared_gradient_blocks", N,
                                                              shared_rows, 256);
    Checkpoints<T, Space> checkpoints(space, adaptive, chunk, most_steps / interval + 1, interval, n);
    // The backward kernel's InitTag sets every row of these before it reads them.
    using Grads = BackwardData<T, Space>;
    const Grads grads{gradients.final_bar,
                      gradients.observed_bar,
                      gradients.y0_bar,
                      gradients.params_bar,
                      paraseq::detail::workspace_view<decltype(Grads::shared_bar)>(space, "paraseq::ode::shared_rows", chunk, shared_rows),
                      paraseq::detail::workspace_view<decltype(Grads::lambda)>(space, "paraseq::ode::lambda", chunk, n),
                      paraseq::detail::workspace_view<decltype(Grads::step)>(space, "paraseq::ode::backward_step", chunk),
                      paraseq::detail::workspace_view<decltype(Grads::step)>(space, "paraseq::ode::backward_observation", chunk),
                      paraseq::detail::workspace_view<decltype(Grads::step)>(space, "paraseq::ode::backward_segment", chunk),
                      gradients.parameters};
    using ForwardKernel = Forward<Method, Field, T, C, Space, Stepping, true>;
    using BackwardKernel = Backward<Method, Field, T, C, Space, Stepping, OwnGradients>;

    for (int begin = 0; begin < int(N); begin += chunk) {
      const int end = std::min<int>(int(N), begin + chunk);
      if constexpr (adaptive)
        Kokkos::parallel_for("paraseq::ode::segment_lags", Kokkos::RangePolicy<Space>(space, 0, end - begin),
                             SegmentLags<decltype(checkpoints.lag), decltype(counts)>{checkpoints.lag, counts, begin,
                                                                                      interval});
      run_forward<L>(space,
                     ForwardKernel{field, n, data, stepping, carry, checkpoints, begin, end, 0, report_rows<Space>(report)},
                     begin, end, most_steps, NoObserver{});
      // Without a counting pass the report comes chunk by chunk (the fused loop writes its rows).
      if ((!adaptive || given_counts) && L == Loop::stepped) {
        auto rows = std::make_pair(0, end - begin), part = std::make_pair(begin, end);
        paraseq::detail::copy(space, Kokkos::subview(report.status, part), Kokkos::subview(carry.status, rows));
        paraseq::detail::copy(space, Kokkos::subview(report.accepted, part), Kokkos::subview(carry.step, rows));
        paraseq::detail::copy(space, Kokkos::subview(report.rejected, part), Kokkos::subview(carry.rejected, rows));
      }
      if (given_counts) require_given_counts(fn, space, counts, report.accepted, begin, end);
      BackwardKernel backward{field, n, data, stepping, carry, checkpoints, grads, begin, end, 0};
      Kokkos::parallel_for("paraseq::ode::backward_init",
                           trajectory_policy<false, Space, typename BackwardKernel::InitTag>(space, begin, end), backward);
      backward.iterations = L == Loop::fused ? INT_MAX : 1;
      const int launches = L == Loop::fused ? 1 : most_steps;
      const int blocks = int(paraseq::detail::ceil_div(end - begin, BackwardKernel::lanes));
      for (int launch = 0; launch < launches; ++launch)
        Kokkos::parallel_for("paraseq::ode::backward", trajectory_policy<adaptive>(space, 0, blocks), backward);
      if (shared_rows > 0) shared_sum.add(space, grads.shared_bar, begin, end - begin);
    }
    if (shared_rows > 0) shared_sum.write(space, shared_total);
  });
  return report;
}

template <class Method, class Space, class Field, class Y0, class Params, class Shared, class Steps>
constexpr void check_types() {
  using T = value_t<Y0>;
  static_assert(Kokkos::is_execution_space_v<Space>, "paraseq::ode: the first argument must be a Kokkos execution space instance");
  static_assert(is_method_v<Method>, "paraseq::ode: the method must be Euler, Heun, RK4, BogackiShampine3, DormandPrince5 or Tsit5");
  static_assert(std::is_same_v<Steps, FixedSteps> || std::is_same_v<Steps, AdaptiveSteps>,
                "paraseq::ode: the time stepping must be FixedSteps or AdaptiveSteps");
  static_assert(!std::is_same_v<Steps, AdaptiveSteps> || is_adaptive_method_v<Method>,
                "paraseq::ode: adaptive steps need a method with an embedded error estimate (Heun, BogackiShampine3, "
                "DormandPrince5, Tsit5); Euler and RK4 take FixedSteps");
  static_assert(std::is_floating_point_v<T>, "paraseq::ode: y0 must hold float or double");
  check_field_type<Field, T>();
  static_assert(view_fits<Space, T, 2, false, Y0>() && is_given_v<Y0>,
                "paraseq::ode: y0 must be a rank-2 View [N, n] accessible from the execution space");
  static_assert(view_fits<Space, T, 2, false, Params>(),
                "paraseq::ode: params must be a rank-2 View [N, P] of y0's value type, accessible from the execution space");
  static_assert(view_fits<Space, T, 1, false, Shared>(),
                "paraseq::ode: shared must be a rank-1 View [Q] of y0's value type, accessible from the execution space");
}

} // namespace detail

// Integrates every trajectory of `problem` with `method` over `steps`, writing `outputs`.
template <CompiledModes Modes = CompiledModes::all, class Method, class Space, class Field, class Y0, class Params,
          class Shared, class Steps, class Final, class Observed, class Observer = NoObserver>
Report<typename Space::memory_space> solve(const Space& space, Method, const Problem<Field, Y0, Params, Shared>& problem,
                                           const Steps& steps, const Outputs<Final, Observed>& outputs,
                                           const SolveOptions& options = {}, const Observer& observer = {}) {
  using namespace detail;
  using T = value_t<Y0>;
  check_types<Method, Space, Field, Y0, Params, Shared, Steps>();
  static_assert(view_fits<Space, T, 2, true, Final>(),
                "paraseq::ode::solve: outputs.final_state must be a writable rank-2 View [N, n] of y0's value type");
  static_assert(view_fits<Space, T, 3, true, Observed>(),
                "paraseq::ode::solve: outputs.observed must be a writable rank-3 View [N, n_obs, n] of y0's value type");
  const std::string fn = "paraseq::ode::solve";
  const Kokkos::Profiling::ScopedRegion region(fn);
  static_assert(Modes == CompiledModes::all || std::is_same_v<Observer, NoObserver>,
                "paraseq::ode::solve: an observer needs LoopMode::stepped, which CompiledModes::fused_only does not compile");
  const int n = check_problem(fn, space, problem, steps, outputs, options);
  check_loop_mode<Modes>(fn, options.mode);
  if constexpr (!std::is_same_v<Observer, NoObserver>)
    require(options.mode == LoopMode::stepped, fn, "observer", "an observer with LoopMode::fused",
            "LoopMode::stepped: observers run between the launches of single steps");
  const int N = int(problem.y0.extent(0));

  ForwardData<T> data{strided2<const T>(problem.y0),       strided2<const T>(problem.params),
                      strided1<const T>(problem.shared),   strided2<T>(outputs.final_state),
                      strided3<T>(outputs.observed),       int(steps.observation_times.size()),
                      parameter_count(problem.params)};
  WorkspaceArena arena = workspace_arena<T>(fn, options, N, n, steps);
  Staging<Space> staging(space, &arena);
  const auto stepping = [&] {
    if constexpr (std::is_same_v<Steps, FixedSteps>) return build_mesh<T>(fn, staging, steps);
    else return build_control<Method, T>(fn, staging, steps, n);
  }();
  const bool throw_on_failure = options.on_failure == OnFailure::throw_exception;
  if constexpr (Modes == CompiledModes::all)
    if (options.mode == LoopMode::stepped)
      return forward_pass<Method, Loop::stepped>(fn, space, problem.field, n, N, data, stepping, observer,
                                                 throw_on_failure, staging, &arena);
  return forward_pass<Method, Loop::fused>(fn, space, problem.field, n, N, data, stepping, NoObserver{}, throw_on_failure,
                                           staging, &arena);
}

// solve(), then the gradients of a loss L through the discrete steps: given the cotangents
// dL/d(outputs) (same shapes as the outputs; either may be NoView), writes dL/dy0, dL/dparams and
// dL/dshared (each optional). Any failed trajectory makes it throw.
template <CompiledModes Modes = CompiledModes::all, class Method, class Space, class Field, class Y0, class Params,
          class Shared, class Steps, class Final, class Observed, class FinalBar, class ObservedBar, class Y0Bar,
          class ParamsBar, class SharedBar>
Report<typename Space::memory_space>
solve_with_gradient(const Space& space, Method, const Problem<Field, Y0, Params, Shared>& problem,
                    const Steps& steps, const Outputs<Final, Observed>& outputs,
                    const Outputs<FinalBar, ObservedBar>& cotangents,
                    const Gradients<Y0Bar, ParamsBar, SharedBar>& gradients, const SolveOptions& options = {}) {
  using namespace detail;
  using T = value_t<Y0>;
  using Mem = typename Space::memory_space;
  constexpr bool adaptive = std::is_same_v<Steps, AdaptiveSteps>;
  check_types<Method, Space, Field, Y0, Params, Shared, Steps>();
  check_field_gradient<Field, T>();
  static_assert(view_fits<Space, T, 2, true, Final>() && view_fits<Space, T, 3, true, Observed>(),
                "paraseq::ode::solve_with_gradient: outputs must be writable Views [N, n] and [N, n_obs, n] of y0's value type");
  static_assert(view_fits<Space, T, 2, false, FinalBar>() && view_fits<Space, T, 3, false, ObservedBar>(),
                "paraseq::ode::solve_with_gradient: cotangents must be Views [N, n] and [N, n_obs, n] of y0's value type");
  static_assert(view_fits<Space, T, 2, true, Y0Bar>() && view_fits<Space, T, 2, true, ParamsBar>() &&
                    view_fits<Space, T, 1, true, SharedBar>(),
                "paraseq::ode::solve_with_gradient: gradients must be writable Views [N, n], [N, P] and [Q] of y0's value type");
  static_assert(!is_given_v<ParamsBar> || is_given_v<Params>,
                "paraseq::ode::solve_with_gradient: a params gradient needs params in the problem");
  static_assert(!is_given_v<SharedBar> || is_given_v<Shared>,
                "paraseq::ode::solve_with_gradient: a shared gradient needs shared parameters in the problem");
  static_assert(!is_given_v<SharedBar> || FieldWithVjp<Field, T>,
                "paraseq::ode::solve_with_gradient: gradients with respect to shared parameters need the field's vjp()");
  static_assert(!is_given_v<ParamsBar> || FieldWithVjp<Field, T> || HasMaxParameterCount<Field>,
                "paraseq::ode::solve_with_gradient: a field without vjp() must declare max_parameter_count to be "
                "differentiated with respect to its own parameters");
  constexpr bool own_gradients = is_given_v<ParamsBar>;

  const std::string fn = "paraseq::ode::solve_with_gradient";
  const Kokkos::Profiling::ScopedRegion region(fn);
  const int n = check_problem(fn, space, problem, steps, outputs, options);
  check_loop_mode<Modes>(fn, options.mode);
  const long N = long(problem.y0.extent(0)), observations = long(steps.observation_times.size());
  require_extents_if_given(fn, "cotangents.final_state", cotangents.final_state, {N, n}, "[N, n], the shape of y0");
  require_extents_if_given(fn, "cotangents.observed", cotangents.observed, {N, observations, n},
                           "[N, n_obs, n] with n_obs the number of observation times");
  require_extents_if_given(fn, "gradients.y0", gradients.y0, {N, n}, "[N, n], the shape of y0");
  const int P = parameter_count(problem.params);
  int Q = 0;
  if constexpr (is_given_v<Shared>) Q = int(problem.shared.extent(0));
  require_extents_if_given(fn, "gradients.params", gradients.params, {N, P}, "[N, P], the shape of params");
  require_extents_if_given(fn, "gradients.shared", gradients.shared, {Q}, "[Q], the shape of shared");
  require_finite(fn, space, {"cotangents.final_state", "cotangents.observed", ""}, cotangents.final_state,
                 cotangents.observed);
  const int shared_rows = is_given_v<SharedBar> ? Q : 0;

  ForwardData<T> data{strided2<const T>(problem.y0),     strided2<const T>(problem.params),
                      strided1<const T>(problem.shared), strided2<T>(outputs.final_state),
                      strided3<T>(outputs.observed),     int(observations),
                      parameter_count(problem.params)};
  const GradientViews<T> gradient_views{strided2<const T>(cotangents.final_state), strided3<const T>(cotangents.observed),
                                        strided2<T>(gradients.y0), strided2<T>(gradients.params), P};
  WorkspaceArena arena = workspace_arena<T>(fn, options, N, n, steps);
  Staging<Space> staging(space, &arena);
  const auto stepping = [&] {
    if constexpr (adaptive) return build_control<Method, T>(fn, staging, steps, n);
    else return build_mesh<T>(fn, staging, steps);
  }();
  const auto shared_total =
      paraseq::detail::workspace_view<Kokkos::View<double*, Mem>>(space, "paraseq::ode::shared_gradient", shared_rows);
  Report<Mem> report;
  if constexpr (Modes == CompiledModes::all)
    if (options.mode == LoopMode::stepped)
      report = gradient_pass<Method, Loop::stepped, own_gradients>(fn, space, problem.field, n, int(N), data, stepping,
                                                                   gradient_views, options, staging, shared_total, &arena);
  if (Modes == CompiledModes::fused_only || options.mode == LoopMode::fused)
    report = gradient_pass<Method, Loop::fused, own_gradients>(fn, space, problem.field, n, int(N), data, stepping,
                                                             gradient_views, options, staging, shared_total, &arena);
  if constexpr (is_given_v<SharedBar>) convert(space, shared_total, gradients.shared);
  summarize(fn, space, report, true, &staging);
  return report;
}

} // namespace paraseq::ode

// The built-in fields' fused loops are compiled into the paraseq library (cmake/paraseqInstances.cmake).
#if PARASEQ_ETI
#include <paraseq/eti/integrate_instances.hpp>
#endif
