#pragma once
// The kernels behind integrate.hpp: a device thread per trajectory, a host thread per block of 8
// trajectories stepped in lockstep (their chains of arithmetic overlap in a core's pipeline). Each
// trajectory's loop state (its Carry) lives in registers while a kernel runs and, in the stepped
// mode and for gradients, in Views between kernels, so the same step code runs the whole loop in
// one launch (fused) or one step per launch (stepped), bit for bit alike.
//
//   Forward: its FusedTag launch (the fused mode) sets up each trajectory, runs its whole loop and
//            writes the outputs and the report, with no carry Views unless a gradient needs them.
//            The stepped mode's InitTag launch sets up the carry from y0 (and the first step size);
//            its main launch runs up to `iterations` steps (adaptive: attempts), writing
//            observations, the final state and, for gradients, a checkpoint whenever the step count
//            is a multiple of the interval.
//   Backward: its InitTag launch takes the final cotangent; its main launch reverses up to
//            `iterations` steps of each trajectory of a block. Entering a checkpoint segment
//            replays its steps from the checkpoint (the same step code, so the same mesh,
//            rejections included) and stores their states.
//
// Fixed steps in the fused mode run in segments: between two stops (mesh points with an
// observation, a checkpoint, or the end) the loop only steps; finiteness, observations and
// checkpoints are handled at the stops. A non-finite state stays non-finite under an explicit RK
// step (y_next = y + h sum b_i K_i), so checking at the stops gives the same status as checking
// after every step.

#include <paraseq/core/workspace.hpp>
#include <paraseq/loops/field.hpp>
#include <paraseq/loops/options.hpp>
#include <paraseq/loops/rk_step.hpp>
#include <paraseq/loops/tableaus.hpp>

#include <Kokkos_Core.hpp>

#include <climits>
#include <string>
#include <type_traits>

namespace paraseq::ode::detail {

// Strided access to the user's Views (any layout), so kernels do not depend on their types.
template <class T>
struct Strided1 {
  T* data = nullptr;
  long s0 = 0;
  KOKKOS_INLINE_FUNCTION T& operator()(long i) const { return data[i * s0]; }
};
template <class T>
struct Strided2 {
  T* data = nullptr;
  long s0 = 0, s1 = 0;
  KOKKOS_INLINE_FUNCTION T& operator()(long i, long j) const { return data[i * s0 + j * s1]; }
};
template <class T>
struct Strided3 {
  T* data = nullptr;
  long s0 = 0, s1 = 0, s2 = 0;
  KOKKOS_INLINE_FUNCTION T& operator()(long i, long j, long k) const { return data[i * s0 + j * s1 + k * s2]; }
};

inline constexpr int status_running = -1;
// Carry flags.
inline constexpr int k_first_valid = 1;     // k_first holds f(t, y)
inline constexpr int last_rejected = 2;     // the previous attempt was rejected: do not grow h
inline constexpr int nonfinite_attempt = 4; // the latest rejection had a non-finite error or state

template <class T, int Capacity>
struct Carry {
  T y[Capacity];
  T k_first[Capacity];
  T t, h;
  T log_err_prev; // log of the previous accepted error norm: the controller needs its power
  int step;     // fixed: mesh steps done; adaptive: accepted steps
  int rejected; // adaptive: rejected attempts
  int next_observation;
  int status;
  int flags;
};

// A temporary View of type V: from this call site's cached buffer (core/workspace.hpp), so that
// repeated calls of one shape allocate nothing, or allocated for this call alone. The gradient's
// passes take the cache; the stepped solve() allocates, as its observer may call paraseq again.
template <class V, class Space, class... Extents>
V temporary(const Space& space, bool cached, const char* label, Extents... extents) {
  if (cached) return paraseq::detail::workspace_view<V>(space, label, extents...);
  return V(Kokkos::view_alloc(space, Kokkos::WithoutInitializing, std::string(label)), extents...);
}

template <class T, class Space>
struct CarryViews {
  using Layout = typename Space::array_layout;
  using Mem = typename Space::memory_space;
  Kokkos::View<T**, Layout, Mem> y, k_first;
  Kokkos::View<T*, Mem> t, h, log_err_prev;
  Kokkos::View<int*, Mem> step, rejected, next_observation, status, flags;

  CarryViews() = default;
  CarryViews(const Space& space, int count, int n, bool cached)
      : y(temporary<decltype(y)>(space, cached, "paraseq::ode::carry_y", count, n)),
        k_first(temporary<decltype(k_first)>(space, cached, "paraseq::ode::carry_k", count, n)),
        t(temporary<decltype(t)>(space, cached, "paraseq::ode::carry_t", count)),
        h(temporary<decltype(h)>(space, cached, "paraseq::ode::carry_h", count)),
        log_err_prev(temporary<decltype(log_err_prev)>(space, cached, "paraseq::ode::carry_err", count)),
        step(temporary<decltype(step)>(space, cached, "paraseq::ode::carry_step", count)),
        rejected(temporary<decltype(rejected)>(space, cached, "paraseq::ode::carry_rejected", count)),
        next_observation(temporary<decltype(next_observation)>(space, cached, "paraseq::ode::carry_obs", count)),
        status(temporary<decltype(status)>(space, cached, "paraseq::ode::carry_status", count)),
        flags(temporary<decltype(flags)>(space, cached, "paraseq::ode::carry_flags", count)) {}

  static constexpr std::size_t bytes_per_trajectory(int n) { return (2 * n + 3) * sizeof(T) + 5 * sizeof(int); }

  template <int C>
  KOKKOS_INLINE_FUNCTION void load(int i, int n, Carry<T, C>& c) const {
    for (int k = 0; k < n; ++k) {
      c.y[k] = y(i, k);
      c.k_first[k] = k_first(i, k);
    }
    c.t = t(i), c.h = h(i), c.log_err_prev = log_err_prev(i);
    c.step = step(i), c.rejected = rejected(i), c.next_observation = next_observation(i);
    c.status = status(i), c.flags = flags(i);
  }
  template <int C>
  KOKKOS_INLINE_FUNCTION void store(int i, int n, const Carry<T, C>& c) const {
    for (int k = 0; k < n; ++k) {
      y(i, k) = c.y[k];
      k_first(i, k) = c.k_first[k];
    }
    t(i) = c.t, h(i) = c.h, log_err_prev(i) = c.log_err_prev;
    step(i) = c.step, rejected(i) = c.rejected, next_observation(i) = c.next_observation;
    status(i) = c.status, flags(i) = c.flags;
  }
};

// Fixed steps, shared by all trajectories: step m goes from point(m) to point(m + 1) and is
// length(m) long. A uniform mesh (FixedSteps::count and ::until with no observation inside a step)
// stores nothing: point m is fma(m, dt, t0) in T (one rounding), the last point is t_end exactly,
// and every step is dt long but the last, which is h_last = t_end - point(steps - 1) (rounded once
// from double), so that a partial last step lands on t_end. Otherwise (an explicit grid, or
// observations that split steps) the points and lengths are Views. observation_point(j) is the
// mesh point of observation j (nondecreasing).
template <class T, class Mem>
struct FixedMesh {
  static constexpr bool adaptive = false;
  bool uniform = true;
  int steps = 0;
  T t0 = 0, dt = 0, h_last = 0, t_end = 0;      // uniform
  Kokkos::View<const T*, Mem> points, lengths;  // explicit: [steps + 1], [steps]
  Kokkos::View<const int*, Mem> observation_point; // [n_obs]

  KOKKOS_INLINE_FUNCTION T uniform_point(int m) const { return m == steps ? t_end : Kokkos::fma(T(m), dt, t0); }
  KOKKOS_INLINE_FUNCTION T point(int m) const { return uniform ? uniform_point(m) : points(m); }
  KOKKOS_INLINE_FUNCTION T length(int m) const { return uniform ? (m + 1 == steps ? h_last : dt) : lengths(m); }
};

// Adaptive steps: everything a trajectory's controller reads.
template <class T, class Mem>
struct AdaptiveControl {
  static constexpr bool adaptive = true;
  T t0, t_end, first_step, min_step;
  int max_steps;
  T safety, min_factor, max_factor, beta1, beta2, reject_exponent, first_step_exponent;
  Kokkos::View<const T*, Mem> rtol, atol;         // [n]
  Kokkos::View<const T*, Mem> observation_times;  // [n_obs]
  KOKKOS_INLINE_FUNCTION Tolerances<T> tolerances() const { return {rtol.data(), atol.data()}; }
};

template <class T>
KOKKOS_INLINE_FUNCTION bool all_finite(int n, const T* y) {
  bool finite = true;
  for (int k = 0; k < n; ++k) finite = finite && Kokkos::isfinite(y[k]);
  return finite;
}

template <class T>
KOKKOS_INLINE_FUNCTION void copy(int n, const T* from, T* to) {
  for (int k = 0; k < n; ++k) to[k] = from[k];
}

// One step from (t, y) to t_next: K[0] is the carry's k_first for FSAL methods (which must be
// valid), else f(t, y). The carry's y (and an FSAL method's k_first) then hold the step's end.
template <class Method, class Rk, class T, int C>
KOKKOS_FORCEINLINE_FUNCTION void rk_step(const Rk& rk, T t, T h, T t_next, Carry<T, C>& c) {
  typename Rk::Stages K;
  T y_new[C];
  if constexpr (Method::fsal) copy(rk.size(), c.k_first, K[0]);
  else rk.evaluate(t, c.y, K[0]);
  rk.stages(t, h, t_next, c.y, K, y_new);
  copy(rk.size(), y_new, c.y);
  if constexpr (Method::fsal) copy(rk.size(), K[Method::stages - 1], c.k_first);
}

// One step on the fixed mesh; the carry then holds the new state.
template <class Method, class Rk, class T, int C, class Mesh>
KOKKOS_INLINE_FUNCTION void fixed_step(const Rk& rk, const Mesh& mesh, Carry<T, C>& c) {
  const int m = c.step;
  const T t = mesh.point(m), h = mesh.length(m), t_next = mesh.point(m + 1);
  if constexpr (Method::fsal)
    if (!(c.flags & k_first_valid)) {
      rk.evaluate(t, c.y, c.k_first);
      c.flags |= k_first_valid;
    }
  rk_step<Method>(rk, t, h, t_next, c);
  c.t = t_next;
  c.step = m + 1;
}

// One adaptive attempt. on_accept(c, K, h, t_new, y_new) runs for an accepted step while the carry
// still holds the step's start (it may advance c.next_observation); the carry then moves on to the
// step's end. Sets c.status when the trajectory stops.
template <class Method, class Rk, class T, int C, class Control, class OnAccept>
KOKKOS_INLINE_FUNCTION void adaptive_attempt(const Rk& rk, const Control& ctl, Carry<T, C>& c,
                                             const OnAccept& on_accept) {
  const int n = rk.size();
  if (c.step + c.rejected >= ctl.max_steps) {
    c.status = int(Status::max_steps);
    return;
  }
  const bool lands = c.t + c.h >= ctl.t_end;
  const T t_new = lands ? ctl.t_end : c.t + c.h;
  const T h = lands ? ctl.t_end - c.t : c.h;
  if (c.h < ctl.min_step || !(t_new > c.t)) {
    c.status = int((c.flags & nonfinite_attempt) ? Status::non_finite : Status::step_too_small);
    return;
  }
  if (!(c.flags & k_first_valid)) {
    rk.evaluate(c.t, c.y, c.k_first);
    c.flags |= k_first_valid;
  }
  typename Rk::Stages K;
  T y_new[C];
  copy(n, c.k_first, K[0]);
  rk.stages(c.t, h, t_new, c.y, K, y_new);
  const T err = rk.error_norm(h, c.y, y_new, K, ctl.tolerances());
  const bool finite = Kokkos::isfinite(err) && all_finite(n, y_new);
  // Powers of the error norms as exp and log: one of each per attempt.
  const T log_err = Kokkos::log(err);
  if (!(finite && err <= T(1))) {
    const T factor =
        finite ? Kokkos::max(ctl.min_factor, ctl.safety * Kokkos::exp(-ctl.reject_exponent * log_err)) : ctl.min_factor;
    c.h = h * factor;
    c.rejected += 1;
    c.flags = (c.flags | last_rejected) & ~nonfinite_attempt;
    if (!finite) c.flags |= nonfinite_attempt;
    return;
  }
  on_accept(c, K, h, t_new, y_new);
  T factor = err == T(0) ? ctl.max_factor : ctl.safety * Kokkos::exp(ctl.beta2 * c.log_err_prev - ctl.beta1 * log_err);
  factor = Kokkos::min(ctl.max_factor, Kokkos::max(ctl.min_factor, factor));
  if (c.flags & last_rejected) factor = Kokkos::min(factor, T(1));
  copy(n, y_new, c.y);
  c.t = t_new;
  c.h = h * factor;
  c.log_err_prev = Kokkos::max(log_err, T(-9.210340371976184)); // log(1e-4): a floor on e_prev
  c.step += 1;
  c.flags &= ~(last_rejected | nonfinite_attempt | k_first_valid);
  if constexpr (Method::fsal) {
    copy(n, K[Method::stages - 1], c.k_first);
    c.flags |= k_first_valid;
  }
  if (lands) c.status = int(Status::success);
}

// Hairer's starting step size (Solving ODEs I, II.4) from y0 and k_first = f(t0, y0).
template <class Rk, class T, int C, class Control>
KOKKOS_INLINE_FUNCTION T first_step_size(const Rk& rk, const Control& ctl, const Carry<T, C>& c) {
  const int n = rk.size();
  const Tolerances<T> tol = ctl.tolerances();
  T d0 = 0, d1 = 0;
  for (int k = 0; k < n; ++k) {
    const T scale = tol.atol[k] + tol.rtol[k] * Kokkos::abs(c.y[k]);
    d0 += (c.y[k] / scale) * (c.y[k] / scale);
    d1 += (c.k_first[k] / scale) * (c.k_first[k] / scale);
  }
  d0 = Kokkos::sqrt(d0 / T(n));
  d1 = Kokkos::sqrt(d1 / T(n));
  const T span = ctl.t_end - c.t;
  const T h0 = Kokkos::min(span, (d0 < T(1e-5) || d1 < T(1e-5)) ? T(1e-6) : T(0.01) * d0 / d1);
  T y1[C], f1[C];
  for (int k = 0; k < n; ++k) y1[k] = c.y[k] + h0 * c.k_first[k];
  rk.evaluate(c.t + h0, y1, f1);
  T d2 = 0;
  for (int k = 0; k < n; ++k) {
    const T scale = tol.atol[k] + tol.rtol[k] * Kokkos::abs(c.y[k]);
    d2 += ((f1[k] - c.k_first[k]) / scale) * ((f1[k] - c.k_first[k]) / scale);
  }
  d2 = Kokkos::sqrt(d2 / T(n)) / h0;
  const T d_max = Kokkos::max(d1, d2);
  const T h1 = d_max <= T(1e-15) ? Kokkos::max(T(1e-6), h0 * T(1e-3))
                                 : Kokkos::pow(T(0.01) / d_max, ctl.first_step_exponent);
  const T h = Kokkos::min(T(100) * h0, Kokkos::min(h1, span));
  return Kokkos::isfinite(h) && h > T(0) ? h : span;
}

// Checkpoints of the carry, one per segment of `interval` steps, and the segment buffer of the
// backward pass. Adaptive trajectories take different step counts, and the backward loop walks
// each back from its last step: so each one's segments end at its last step (segment k starts at
// step k interval - lag, lag = its step count rounded up to a multiple of the interval, minus the
// count; segment 0 is the shorter one), and the trajectories of a warp replay their segments in the
// same iterations of that loop, not each in its own while the others wait.
template <class T, class Space>
struct Checkpoints {
  using Layout = typename Space::array_layout;
  using Mem = typename Space::memory_space;
  Kokkos::View<T***, Layout, Mem> y;                      // [chunk, count, n]
  Kokkos::View<T**, Layout, Mem> t, h, log_err_prev;      // adaptive: [chunk, count]
  Kokkos::View<int**, Layout, Mem> flags;                 // adaptive: [chunk, count]
  Kokkos::View<int*, Mem> lag;                            // adaptive: [chunk]
  Kokkos::View<T***, Layout, Mem> segment_y;              // [chunk, interval, n]
  Kokkos::View<T**, Layout, Mem> segment_t, segment_h, segment_t_next; // adaptive: [chunk, interval]
  int interval = 1;

  Checkpoints() = default;
  // From the workspace cache: a gradient call of a shape seen before allocates nothing.
  Checkpoints(const Space& space, bool adaptive, int chunk, int count, int interval_, int n) : interval(interval_) {
    const int scalars = adaptive ? chunk : 0;
    auto cached = [&]<class V>(V& view, const char* label, auto... extents) {
      view = paraseq::detail::workspace_view<V>(space, label, extents...);
    };
    cached(y, "paraseq::ode::checkpoint_y", chunk, count, n);
    cached(t, "paraseq::ode::checkpoint_t", scalars, count);
    cached(h, "paraseq::ode::checkpoint_h", scalars, count);
    cached(log_err_prev, "paraseq::ode::checkpoint_err", scalars, count);
    cached(flags, "paraseq::ode::checkpoint_flags", scalars, count);
    cached(lag, "paraseq::ode::checkpoint_lag", scalars);
    cached(segment_y, "paraseq::ode::segment_y", chunk, interval, n);
    cached(segment_t, "paraseq::ode::segment_t", scalars, interval);
    cached(segment_h, "paraseq::ode::segment_h", scalars, interval);
    cached(segment_t_next, "paraseq::ode::segment_t_next", scalars, interval);
  }

  // Device bytes per trajectory for `count` checkpoints and a segment of `interval` steps.
  static constexpr std::size_t bytes_per_trajectory(bool adaptive, long count, long interval, int n) {
    return std::size_t(count) * (n * sizeof(T) + (adaptive ? 3 * sizeof(T) + sizeof(int) : 0)) +
           std::size_t(interval) * (n + (adaptive ? 3 : 0)) * sizeof(T) + (adaptive ? sizeof(int) : 0);
  }

  // The segment of row i's step, and the first step of its segment k.
  KOKKOS_INLINE_FUNCTION int segment_of(bool adaptive, int i, int step) const {
    return (step + (adaptive ? lag(i) : 0)) / interval;
  }
  KOKKOS_INLINE_FUNCTION int segment_start(bool adaptive, int i, int k) const {
    return Kokkos::max(0, k * interval - (adaptive ? lag(i) : 0));
  }

  template <int C>
  KOKKOS_INLINE_FUNCTION void save(bool adaptive, int i, int n, const Carry<T, C>& c) const {
    const int k = segment_of(adaptive, i, c.step);
    // More steps than the counts that sized the checkpoints (SolveOptions::accepted_steps, checked
    // after the pass): nothing is written past them.
    if (k >= int(y.extent(1))) return;
    for (int j = 0; j < n; ++j) y(i, k, j) = c.y[j];
    if (adaptive) {
      t(i, k) = c.t, h(i, k) = c.h, log_err_prev(i, k) = c.log_err_prev;
      flags(i, k) = c.flags & ~k_first_valid;
    }
  }
  // The carry at the start of segment k; k_first is recomputed, to the same bits.
  template <int C>
  KOKKOS_INLINE_FUNCTION void restore(bool adaptive, int i, int k, int n, Carry<T, C>& c) const {
    for (int j = 0; j < n; ++j) c.y[j] = y(i, k, j);
    c.next_observation = 0;
    c.step = segment_start(adaptive, i, k);
    c.rejected = 0;
    c.status = status_running;
    c.flags = 0;
    if (adaptive) c.t = t(i, k), c.h = h(i, k), c.log_err_prev = log_err_prev(i, k), c.flags = flags(i, k);
  }
};

// Trajectories per thread of the forward and backward loops: 8 on host cores, stepped in lockstep
// so that their independent chains of arithmetic overlap in the pipeline (one trajectory alone
// waits on each result); one on devices, whose warps hide latency.
template <class Space>
inline constexpr int trajectories_per_thread = Kokkos::SpaceAccessibility<Space, Kokkos::HostSpace>::accessible ? 8 : 1;

// What the forward kernels read and write besides the carry.
template <class T>
struct ForwardData {
  Strided2<const T> y0;
  Strided2<const T> params;
  Strided1<const T> shared;
  Strided2<T> final_state;
  Strided3<T> observed;
  int observations = 0;
  int parameter_count = 0; // P

  KOKKOS_INLINE_FUNCTION ParameterAccess<T> parameters(int traj) const {
    return {params.data ? params.data + traj * params.s0 : nullptr, params.s1, shared.data, shared.s0};
  }
  // The trajectory's parameters as the field will see them (in registers where they fit).
  template <class Field>
  KOKKOS_INLINE_FUNCTION ParametersFor<Field, T> parameters_of(int traj) const {
    return parameters_for<Field>(parameters(traj), parameter_count);
  }
};

// Where the fused mode writes each trajectory's report (indexed by trajectory).
struct ReportRows {
  int* status = nullptr;
  int* accepted = nullptr;
  int* rejected = nullptr;
};

// Stands for the carry Views or the checkpoints in a kernel that has none: the fused solve()
// kernel stays small enough (under Kokkos' 512 bytes) to be launched with its arguments rather
// than through constant memory, which costs a copy and a wait on the previous such launch.
struct NoStorage {};

// Carried: the kernel has carry Views (the stepped mode, gradients); Checkpointing: checkpoints.
template <class Method, class Field, class T, int Capacity, class Space, class Stepping, bool Checkpointing,
          bool Carried = true>
struct Forward {
  using Params = ParametersFor<Field, T>;
  using Rk = RkStep<Method, Field, T, Capacity, Params>;
  using C = Carry<T, Capacity>;
  struct InitTag {};
  struct FusedTag {};

  Field field;
  int runtime_n;
  ForwardData<T> data;
  Stepping stepping;
  std::conditional_t<Carried, CarryViews<T, Space>, NoStorage> carry;
  std::conditional_t<Checkpointing, Checkpoints<T, Space>, NoStorage> checkpoints;
  int begin, end; // the chunk's trajectories: carry row = trajectory - begin
  int iterations; // steps (adaptive: attempts) per launch of the stepped mode
  ReportRows report; // written by the fused mode

  KOKKOS_FORCEINLINE_FUNCTION constexpr int size() const { return known_size<Field>(runtime_n); }

  static constexpr int lanes = trajectories_per_thread<Space>;

  // Observations may be wanted by cotangents only, with no View to write.
  KOKKOS_INLINE_FUNCTION void write_observation(int traj, int j, const T* y) const {
    if (data.observed.data)
      for (int k = 0; k < size(); ++k) data.observed(traj, j, k) = y[k];
  }

  // A stopped trajectory: its final state, or NaN for what a failure left unreached.
  KOKKOS_INLINE_FUNCTION void finish(int traj, C& c) const {
    const bool failed = c.status != int(Status::success);
    if (failed) {
      T unreached[Capacity];
      for (int k = 0; k < size(); ++k) unreached[k] = Kokkos::Experimental::quiet_NaN_v<T>;
      for (int j = c.next_observation; j < data.observations; ++j) write_observation(traj, j, unreached);
    }
    if (data.final_state.data)
      for (int k = 0; k < size(); ++k) data.final_state(traj, k) = failed ? Kokkos::Experimental::quiet_NaN_v<T> : c.y[k];
  }

  // Saves the carry of a step that starts a segment.
  KOKKOS_INLINE_FUNCTION void checkpoint(int row, const C& c) const {
    if constexpr (Checkpointing) {
      constexpr bool adaptive = Stepping::adaptive;
      if (c.step == checkpoints.segment_start(adaptive, row, checkpoints.segment_of(adaptive, row, c.step)))
        checkpoints.save(adaptive, row, size(), c);
    }
  }

  // The carry of a trajectory at t0: observations at t0 written, k_first (FSAL or adaptive) and the
  // first step size set, and a status when it is done already (no steps, or a non-finite y0).
  KOKKOS_INLINE_FUNCTION void start(int traj, const Rk& rk, C& c) const {
    for (int k = 0; k < size(); ++k) c.y[k] = data.y0(traj, k);
    c.step = 0, c.rejected = 0, c.next_observation = 0, c.flags = 0;
    c.log_err_prev = T(0); // e_prev = 1
    c.status = status_running;
    bool done;
    if constexpr (Stepping::adaptive) {
      const auto& ctl = stepping;
      c.t = ctl.t0;
      for (; c.next_observation < data.observations && ctl.observation_times(c.next_observation) <= c.t;
           ++c.next_observation)
        write_observation(traj, c.next_observation, c.y);
      done = !(ctl.t_end > ctl.t0);
      if (!done) {
        rk.evaluate(c.t, c.y, c.k_first);
        c.flags = k_first_valid;
        c.h = ctl.first_step > T(0) ? ctl.first_step : first_step_size(rk, ctl, c);
      }
    } else {
      c.t = stepping.point(0), c.h = T(0);
      for (; c.next_observation < data.observations && stepping.observation_point(c.next_observation) == 0;
           ++c.next_observation)
        write_observation(traj, c.next_observation, c.y);
      done = stepping.steps == 0;
      if (!done && Method::fsal) {
        rk.evaluate(c.t, c.y, c.k_first);
        c.flags = k_first_valid;
      }
    }
    if (!all_finite(size(), c.y)) c.status = int(Status::non_finite);
    else if (done) c.status = int(Status::success);
    if (c.status != status_running) finish(traj, c);
    checkpoint(traj - begin, c);
  }

  KOKKOS_FUNCTION void operator()(InitTag, int traj) const {
    C c;
    start(traj, Rk{field, runtime_n, data.template parameters_of<Field>(traj)}, c);
    carry.store(traj - begin, size(), c);
  }

  // One step (adaptive: one attempt) of a running trajectory.
  KOKKOS_INLINE_FUNCTION void advance(int traj, C& c, const Params& p) const {
    const Rk rk{field, runtime_n, p};
    const int step = c.step;
    if constexpr (Stepping::adaptive) {
      const auto& ctl = stepping;
      adaptive_attempt<Method>(rk, ctl, c, [&](C& start, const typename Rk::Stages& K, T h, T t_new, const T* y_new) {
        for (; start.next_observation < data.observations && ctl.observation_times(start.next_observation) <= t_new;
             ++start.next_observation) {
          const T when = ctl.observation_times(start.next_observation);
          if (when == t_new) write_observation(traj, start.next_observation, y_new);
          else {
            T y_at[Capacity];
            rk.dense((when - start.t) / h, h, start.y, K, y_at);
            write_observation(traj, start.next_observation, y_at);
          }
        }
      });
    } else {
      fixed_step<Method>(rk, stepping, c);
      int last = c.next_observation; // past the observations at the new point
      while (last < data.observations && stepping.observation_point(last) <= c.step) ++last;
      if (c.next_observation < last && !all_finite(size(), c.y)) c.status = int(Status::non_finite);
      for (; c.next_observation < last; ++c.next_observation) write_observation(traj, c.next_observation, c.y);
      if (c.step == stepping.steps && c.status == status_running)
        c.status = int(all_finite(size(), c.y) ? Status::success : Status::non_finite);
    }
    if (c.step != step && c.status == status_running) checkpoint(traj - begin, c);
    if (c.status != status_running) finish(traj, c);
  }

  // One step (or attempt) of every lane of a block that is still running; false once none is.
  KOKKOS_FORCEINLINE_FUNCTION bool advance_running(int first, int count, C* carries, const Params* params) const {
    bool running = false;
    for (int l = 0; l < count; ++l)
      if (carries[l].status == status_running) {
        advance(first + l, carries[l], params[l]);
        running = true;
      }
    return running;
  }

  // The stepped mode: runs the trajectories of one block of `lanes` for `iterations` steps, step by
  // step in lockstep: on a host core their independent steps overlap in the pipeline, where one
  // trajectory alone waits on each result.
  KOKKOS_FUNCTION void operator()(int block) const {
    constexpr int L = lanes; // a local: device code cannot bind a static member to a reference
    const int first = begin + block * L, count = Kokkos::min(L, end - first);
    C carries[L];
    Params params[L];
    for (int l = 0; l < count; ++l) {
      carry.load(first + l - begin, size(), carries[l]);
      params[l] = data.template parameters_of<Field>(first + l);
    }
    for (int it = 0; it < iterations && advance_running(first, count, carries, params); ++it) {
    }
    for (int l = 0; l < count; ++l) carry.store(first + l - begin, size(), carries[l]);
  }

  // Fixed steps m, ..., stop - 1 of every running lane, nothing else: the mesh's point times and
  // lengths as fixed_step computes them, without its bookkeeping.
  KOKKOS_INLINE_FUNCTION void run_segment(int m, int stop, int count, C* carries, const Params* params) const {
    constexpr int L = lanes;
    auto step_lanes = [&](T t, T h, T t_next) {
      for (int l = 0; l < count; ++l)
        if (L == 1 || carries[l].status == status_running) // a device thread's only lane runs
          rk_step<Method>(Rk{field, runtime_n, params[l]}, t, h, t_next, carries[l]);
    };
    if (stepping.uniform) {
      const T t0 = stepping.t0, dt = stepping.dt;
      const int full = Kokkos::min(stop, stepping.steps - 1); // steps of dt; the last is h_last long
      for (; m < full; ++m) step_lanes(Kokkos::fma(T(m), dt, t0), dt, Kokkos::fma(T(m + 1), dt, t0));
      if (m < stop) step_lanes(Kokkos::fma(T(m), dt, t0), stepping.h_last, stepping.t_end);
    } else {
      for (; m < stop; ++m) step_lanes(stepping.points(m), stepping.lengths(m), stepping.points(m + 1));
    }
  }

  // The fused fixed-step loop: segments between stops (observation points, checkpoints, the end).
  // Running lanes are all at mesh point m; at a stop each is checked for finiteness (where there is
  // an observation, and at the end), observed, checkpointed or finished.
  KOKKOS_INLINE_FUNCTION void run_fixed(int first, int count, C* carries, const Params* params) const {
    bool running = false;
    for (int l = 0; l < count; ++l) running = running || carries[l].status == status_running;
    int m = 0, j = 0; // the mesh point, and the first observation after it
    while (j < data.observations && stepping.observation_point(j) == 0) ++j;
    while (running) {
      int stop = j < data.observations ? stepping.observation_point(j) : stepping.steps;
      if constexpr (Checkpointing) stop = Kokkos::min(stop, (m / checkpoints.interval + 1) * checkpoints.interval);
      run_segment(m, stop, count, carries, params);
      m = stop;
      int j_end = j;
      while (j_end < data.observations && stepping.observation_point(j_end) == m) ++j_end;
      running = false;
      for (int l = 0; l < count; ++l) {
        C& c = carries[l];
        if (c.status != status_running) continue;
        c.step = m;
        c.t = stepping.point(m);
        if (j_end > j && !all_finite(size(), c.y)) c.status = int(Status::non_finite);
        for (; c.next_observation < j_end; ++c.next_observation) write_observation(first + l, c.next_observation, c.y);
        if (m == stepping.steps && c.status == status_running)
          c.status = int(all_finite(size(), c.y) ? Status::success : Status::non_finite);
        if (c.status == status_running) {
          checkpoint(first + l - begin, c);
          running = true;
        } else {
          finish(first + l, c);
        }
      }
      j = j_end;
    }
  }

  // The fused mode: set-up, the whole loop and the report in one launch, the carries in registers.
  KOKKOS_FUNCTION void operator()(FusedTag, int block) const {
    constexpr int L = lanes;
    // A device thread's block is exactly one trajectory (blocks = end - begin): say so at compile time.
    const int first = begin + block * L, count = L == 1 ? 1 : Kokkos::min(L, end - first);
    C carries[L];
    Params params[L];
    for (int l = 0; l < count; ++l) {
      params[l] = data.template parameters_of<Field>(first + l);
      start(first + l, Rk{field, runtime_n, params[l]}, carries[l]);
    }
    if constexpr (Stepping::adaptive) {
      while (advance_running(first, count, carries, params)) {
      }
    } else {
      run_fixed(first, count, carries, params);
    }
    for (int l = 0; l < count; ++l) {
      const int traj = first + l;
      if (report.status) {
        report.status[traj] = carries[l].status;
        report.accepted[traj] = carries[l].step;
        report.rejected[traj] = carries[l].rejected;
      }
      if constexpr (Carried) carry.store(traj - begin, size(), carries[l]);
    }
  }
};

// What the backward kernels read and write.
template <class T, class Space>
struct BackwardData {
  Strided2<const T> final_bar;   // [N, n]
  Strided3<const T> observed_bar; // [N, n_obs, n]
  Strided2<T> y0_bar;             // [N, n]
  Strided2<T> params_bar;         // [N, P]
  Kokkos::View<T**, typename Space::array_layout, typename Space::memory_space> shared_bar; // [chunk, Q]
  Kokkos::View<T**, typename Space::array_layout, typename Space::memory_space> lambda;     // [chunk, n]
  Kokkos::View<int*, typename Space::memory_space> step, next_observation, segment;        // [chunk]
  int parameters = 0; // P
};

template <class Method, class Field, class T, int Capacity, class Space, class Stepping, bool OwnGradients>
struct Backward {
  using Params = ParametersFor<Field, T>;
  using Rk = RkStep<Method, Field, T, Capacity, Params>;
  using C = Carry<T, Capacity>;
  struct InitTag {};
  // Own-parameter gradients accumulate in a local array when the field declares a small bound, and
  // the trajectory's part of the shared ones likewise.
  static constexpr int local_parameters = register_parameters<Field>;
  static constexpr int local_shared_parameters = register_shared_parameters<Field>;

  Field field;
  int runtime_n;
  ForwardData<T> data;
  Stepping stepping;
  CarryViews<T, Space> carry; // the forward carry: its step is each trajectory's step count
  Checkpoints<T, Space> checkpoints;
  BackwardData<T, Space> grads;
  int begin, end; // the chunk's trajectories: row = trajectory - begin
  int iterations;

  KOKKOS_FORCEINLINE_FUNCTION constexpr int size() const { return known_size<Field>(runtime_n); }

  KOKKOS_INLINE_FUNCTION void add_observation_bar(int traj, int j, T* lambda) const {
    for (int k = 0; k < size(); ++k) lambda[k] += grads.observed_bar(traj, j, k);
  }

  KOKKOS_FUNCTION void operator()(InitTag, int traj) const {
    const int row = traj - begin;
    for (int k = 0; k < size(); ++k) grads.lambda(row, k) = grads.final_bar.data ? grads.final_bar(traj, k) : T(0);
    if (grads.params_bar.data)
      for (int k = 0; k < grads.parameters; ++k) grads.params_bar(traj, k) = T(0);
    for (int k = 0; k < int(grads.shared_bar.extent(1)); ++k) grads.shared_bar(row, k) = T(0);
    grads.step(row) = carry.step(row);
    grads.next_observation(row) = data.observations - 1;
    grads.segment(row) = -1;
    if (carry.step(row) == 0) finalize(traj, row);
  }

  // Observations at t0 and the gradient with respect to y0.
  KOKKOS_INLINE_FUNCTION void finalize(int traj, int row) const {
    T lambda[Capacity];
    for (int k = 0; k < size(); ++k) lambda[k] = grads.lambda(row, k);
    for (int j = grads.next_observation(row); j >= 0; --j) add_observation_bar(traj, j, lambda);
    grads.next_observation(row) = -1;
    if (grads.y0_bar.data)
      for (int k = 0; k < size(); ++k) grads.y0_bar(traj, k) = lambda[k];
  }

  static constexpr int lanes = trajectories_per_thread<Space>;

  // One trajectory's place in the backward loop, held in registers while a launch runs.
  struct Lane {
    int traj, row;
    int m;           // steps still to reverse
    int total_steps; // its forward step count
    int j;           // the last observation not yet added
    int loaded;      // the segment whose states the segment buffer holds
    T lambda[Capacity];
  };

  // A lane's parameter gradients: its own parameters' in a local array when the field declares a
  // small bound, and its part of the shared ones likewise; `sink` takes what is not wanted. Arrays
  // of their own, not members of Lane: the device compiler keeps them in registers only so.
  struct Accumulators {
    T (&own_bar)[local_parameters > 0 ? local_parameters : 1];
    T (&shared_sums)[local_shared_parameters > 0 ? local_shared_parameters : 1];
    T& sink;
  };

  // Where the field's VJP adds a lane's parameter gradients: its accumulators where the field's
  // bounds allow, the gradient Views otherwise.
  KOKKOS_FORCEINLINE_FUNCTION ParameterGradients<T> parameter_gradients(const Lane& lane,
                                                                        const Accumulators& sums) const {
    ParameterGradients<T> p_bar{&sums.sink, 0, &sums.sink, 0};
    if constexpr (OwnGradients) {
      if constexpr (local_parameters > 0) p_bar.own_data = sums.own_bar, p_bar.own_stride = 1;
      else p_bar.own_data = &grads.params_bar(lane.traj, 0), p_bar.own_stride = grads.params_bar.s1;
    }
    if (grads.shared_bar.extent(1) > 0) {
      if constexpr (local_shared_parameters > 0) p_bar.shared_data = sums.shared_sums, p_bar.shared_stride = 1;
      else p_bar.shared_data = &grads.shared_bar(lane.row, 0), p_bar.shared_stride = long(grads.shared_bar.stride(1));
    }
    return p_bar;
  }

  KOKKOS_FORCEINLINE_FUNCTION void load_lane(int traj, Lane& lane, const Accumulators& sums) const {
    lane.traj = traj, lane.row = traj - begin;
    lane.m = grads.step(lane.row);
    lane.total_steps = carry.step(lane.row);
    lane.j = grads.next_observation(lane.row);
    lane.loaded = grads.segment(lane.row);
    sums.sink = T(0);
    for (int k = 0; k < size(); ++k) lane.lambda[k] = grads.lambda(lane.row, k);
    if constexpr (OwnGradients && local_parameters > 0)
      for (int k = 0; k < grads.parameters; ++k) sums.own_bar[k] = grads.params_bar(traj, k);
    if constexpr (local_shared_parameters > 0)
      for (int k = 0; k < int(grads.shared_bar.extent(1)); ++k) sums.shared_sums[k] = grads.shared_bar(lane.row, k);
  }

  KOKKOS_FORCEINLINE_FUNCTION void store_lane(const Lane& lane, const Accumulators& sums) const {
    for (int c = 0; c < size(); ++c) grads.lambda(lane.row, c) = lane.lambda[c];
    grads.step(lane.row) = lane.m;
    grads.next_observation(lane.row) = lane.j;
    grads.segment(lane.row) = lane.loaded;
    if constexpr (OwnGradients && local_parameters > 0)
      for (int k = 0; k < grads.parameters; ++k) grads.params_bar(lane.traj, k) = sums.own_bar[k];
    if constexpr (local_shared_parameters > 0)
      for (int k = 0; k < int(grads.shared_bar.extent(1)); ++k) grads.shared_bar(lane.row, k) = sums.shared_sums[k];
    if (lane.m == 0) finalize(lane.traj, lane.row);
  }

  // The segment of a lane's next step to reverse, if the segment buffer does not hold it yet, else -1.
  KOKKOS_FORCEINLINE_FUNCTION int segment_to_replay(const Lane& lane) const {
    if (lane.m == 0) return -1;
    const int k = checkpoints.segment_of(Stepping::adaptive, lane.row, lane.m - 1);
    return k == lane.loaded ? -1 : k;
  }

  // Records one step of a replay that started from a checkpoint: the state (and, adaptive, t, h,
  // t_next) at the step's start, in slot `recorded` of the row's segment buffer.
  KOKKOS_FORCEINLINE_FUNCTION void replay_step(const Rk& rk, int row, C& c, int& recorded) const {
    if constexpr (Stepping::adaptive) {
      adaptive_attempt<Method>(rk, stepping, c, [&](const C& start, const typename Rk::Stages&, T h, T t_new,
                                                     const T*) {
        for (int j = 0; j < size(); ++j) checkpoints.segment_y(row, recorded, j) = start.y[j];
        checkpoints.segment_t(row, recorded) = start.t;
        checkpoints.segment_h(row, recorded) = h;
        checkpoints.segment_t_next(row, recorded) = t_new;
        ++recorded;
      });
    } else {
      for (int j = 0; j < size(); ++j) checkpoints.segment_y(row, recorded, j) = c.y[j];
      fixed_step<Method>(rk, stepping, c);
      ++recorded;
    }
  }

  // Replays, from its checkpoint, the segment that each lane's next step enters (every lane that
  // enters one does so at the same iteration: segments end at each trajectory's last step), the
  // lanes' steps in lockstep.
  KOKKOS_FORCEINLINE_FUNCTION void replay_entered(int count, Lane* lane, const Params* params) const {
    C carries[lanes];
    int left[lanes], recorded[lanes];
    bool any = false;
    for (int l = 0; l < count; ++l) {
      const int k = segment_to_replay(lane[l]);
      left[l] = 0, recorded[l] = 0;
      if (k < 0) continue;
      checkpoints.restore(Stepping::adaptive, lane[l].row, k, size(), carries[l]);
      left[l] = Kokkos::min(checkpoints.segment_start(Stepping::adaptive, lane[l].row, k + 1), lane[l].total_steps) -
                carries[l].step;
      lane[l].loaded = k;
      any = true;
    }
    while (any) {
      any = false;
      for (int l = 0; l < count; ++l)
        if (recorded[l] < left[l]) {
          replay_step(Rk{field, runtime_n, params[l]}, lane[l].row, carries[l], recorded[l]);
          any = any || recorded[l] < left[l];
        }
    }
  }

  // Reverses a lane's next step, whose segment the buffer holds.
  KOKKOS_FORCEINLINE_FUNCTION void reverse_step(const Rk& rk, Lane& lane, const Accumulators& sums) const {
    const int step = lane.m - 1, row = lane.row, traj = lane.traj;
    const int slot = step - checkpoints.segment_start(Stepping::adaptive, row, lane.loaded);
    T y[Capacity];
    for (int c = 0; c < size(); ++c) y[c] = checkpoints.segment_y(row, slot, c);
    T t, h, t_next;
    if constexpr (Stepping::adaptive) {
      t = checkpoints.segment_t(row, slot), h = checkpoints.segment_h(row, slot);
      t_next = checkpoints.segment_t_next(row, slot);
      for (; lane.j >= 0 && stepping.observation_times(lane.j) >= t_next; --lane.j)
        add_observation_bar(traj, lane.j, lane.lambda);
    } else {
      t = stepping.point(step), h = stepping.length(step), t_next = stepping.point(step + 1);
      for (; lane.j >= 0 && stepping.observation_point(lane.j) >= lane.m; --lane.j)
        add_observation_bar(traj, lane.j, lane.lambda);
    }
    typename Rk::Stages Y, K_bar; // the stages' inputs and cotangents
    rk.recompute(t, h, t_next, y, Y);
    rk.seed(h, lane.lambda, K_bar);
    bool last_stage_seeded = false;
    if constexpr (Stepping::adaptive) {
      for (; lane.j >= 0 && stepping.observation_times(lane.j) > t; --lane.j) {
        T g[Capacity];
        for (int c = 0; c < size(); ++c) g[c] = grads.observed_bar(traj, lane.j, c), lane.lambda[c] += g[c];
        rk.seed_dense((stepping.observation_times(lane.j) - t) / h, h, g, K_bar);
        last_stage_seeded = true;
      }
    }
    rk.template sweep<OwnGradients>(t, h, t_next, y, Y, K_bar, lane.lambda, parameter_gradients(lane, sums),
                                    grads.parameters, last_stage_seeded);
    --lane.m;
  }

  // Up to `iterations` steps back of the block's trajectories (a device thread's block is one).
  KOKKOS_FUNCTION void operator()(int block) const {
    constexpr int L = lanes; // a local: device code cannot bind a static member to a reference
    const int first = begin + block * L, count = L == 1 ? 1 : Kokkos::min(L, end - first);
    Lane lane[L];
    T own_bar[L][local_parameters > 0 ? local_parameters : 1];
    T shared_sums[L][local_shared_parameters > 0 ? local_shared_parameters : 1];
    T sink[L];
    auto sums = [&](int l) { return Accumulators{own_bar[l], shared_sums[l], sink[l]}; };
    Params params[L];
    bool reversing[L]; // finished trajectories (in an earlier launch, or with no steps) are left alone
    for (int l = 0; l < count; ++l) {
      load_lane(first + l, lane[l], sums(l));
      params[l] = data.template parameters_of<Field>(first + l);
      reversing[l] = lane[l].m > 0;
    }
    for (int it = 0; it < iterations; ++it) {
      replay_entered(count, lane, params);
      bool running = false;
      for (int l = 0; l < count; ++l)
        if (lane[l].m > 0) {
          reverse_step(Rk{field, runtime_n, params[l]}, lane[l], sums(l));
          running = true;
        }
      if (!running) break;
    }
    for (int l = 0; l < count; ++l)
      if (reversing[l]) store_lane(lane[l], sums(l));
  }
};

} // namespace paraseq::ode::detail
