#pragma once
// Configuration, statistics and errors of the Newton solver (newton.hpp).
//
// The solver computes h_t = f(h_{t-1}, u_t), t = 0 .. T-1, for all t at once by Newton's method on
// the residual F_t(h) = h_t - f(h_{t-1}, u_t). Each iteration is one linear recurrence (a scan).
// Host synchronisation: the solver reads device data on the host only to decide or report
// something (stop early, retry, throw, the fused mode's iteration count). Those reads happen only
// when residual_atol, residual_fail or picard_adapt is set; every one goes through
// detail::read_residual_on_host or detail::read_count_on_host, which count it (newton_host_syncs).

#include <paraseq/core/ordered_scan.hpp>

#include <Kokkos_Core.hpp>

#include <atomic>
#include <optional>
#include <stdexcept>
#include <string>

namespace paraseq {

// How the recurrence is solved.
enum class NewtonMode {
  automatic,  // the rule in choose_newton_mode (newton.hpp)
  newton,     // one ordered scan per iteration over the whole sequence
  fused,      // all iterations in one kernel, window by window, with u and h on chip
  sequential, // the plain loop over t, parallel over batch and groups: the reference
  one_pass,   // the newton mode's iterations in one kernel: windows in parallel, joined by a look-back
};

// The iterate Newton starts from.
enum class InitialGuess {
  cell_at_zero, // h_t = f(0, u_t) at every t, computed inside the first pass (ml-pararnn's choice)
  zeros,        // h_t = 0
  given,        // the output View h holds the guess on entry
};

// Which Jacobian the linear solves use for a cell.
enum class NewtonJacobian {
  exact, // the structure the cell declares (diagonal, block K or dense)
  quasi, // only the diagonal of the cell's Jacobian (quasi-DEER); converges linearly, not quadratically
};

// The kernel families a call of newton_solve or newton_backward compiles where the solver is
// instantiated, that is for a cell of your own (the built-in cells' compiled instances hold every
// family). Each family is a few ordered scans or one fused kernel, minutes of nvcc for a dense cell,
// so a translation unit that runs one mode names it and compiles that family alone:
//     newton_solve<CompiledNewtonModes::fused>(space, cell, u, h, config);
// config.mode must then be a compiled mode, and the automatic choice picks among the compiled ones.
enum class CompiledNewtonModes : unsigned {
  sequential = 1,   // NewtonMode::sequential (the adjoint: the fused kernel over one window per thread)
  newton = 2,       // NewtonMode::newton with the exact Jacobian, and the adjoint's reverse scan
  newton_quasi = 4, // NewtonMode::newton with NewtonJacobian::quasi (a diagonal scan), same adjoint
  fused = 8,        // NewtonMode::fused, forward and adjoint
  one_pass = 16,    // NewtonMode::one_pass, forward and adjoint (newton_one_pass.hpp, newton_one_pass_adjoint.hpp)
  all = 31,
};

// The families of either set.
constexpr CompiledNewtonModes operator|(CompiledNewtonModes a, CompiledNewtonModes b) {
  return CompiledNewtonModes(unsigned(a) | unsigned(b));
}

// Whether every family of `families` is in `set`.
constexpr bool compiles(CompiledNewtonModes set, CompiledNewtonModes families) {
  return (unsigned(set) & unsigned(families)) == unsigned(families);
}

struct NewtonConfig {
  int max_iters = 3;                   // Newton iterations (fewer only when residual_atol stops early)
  double omega = 1.0;                  // damping: h <- h + omega * delta, 0 < omega <= 1
  // Stop once max |F| <= atol. The newton mode reads max |F| on the host after every iteration; the
  // fused mode decides on the device, window by window (newton_fused.hpp), and reads nothing on the
  // host but its iteration count when stats are asked for or residual_fail is set. The one-pass
  // mode takes none (its windows depend on each other's iterations).
  std::optional<double> residual_atol;
  std::optional<double> residual_fail; // throw NewtonDivergenceError if max |F| exceeds it at the end
  int picard_iters = 0;                // fixed-point sweeps h_t <- f(h_{t-1}, u_t) before Newton
  bool picard_adapt = false;           // on a failed residual check, restart with more Picard sweeps
  int picard_adapt_max = 64;           // most Picard sweeps picard_adapt tries before giving up
  InitialGuess initial_guess = InitialGuess::cell_at_zero;
  NewtonJacobian jacobian = NewtonJacobian::exact;
  NewtonMode mode = NewtonMode::automatic;
  // Work of one Newton solve per step relative to the sequential loop's, for the automatic mode;
  // 0 = the measured default (newton.hpp, choose_newton_mode).
  double auto_work_ratio = 0;
  ScanConfig scan{};    // decomposition of every scan (Newton iterations and the adjoint)
  int fused_window = 0; // steps per on-chip window of the fused and one-pass modes; 0 = chosen from the space
  // Threads per group that share one window of the fused mode (each takes window / threads steps,
  // at most the kernel's per-thread capacity); 0 = chosen from the space (newton_fused.hpp).
  int fused_team_threads = 0;
  // Groups that share one team of the fused and one-pass modes, fused_team_threads threads each;
  // 0 = chosen from the space (newton_fused.hpp: fewer for the one-pass mode's long sequences of few
  // groups, whose windows then hold more steps).
  int fused_team_groups = 0;
};

// A fixed number of iterations and no residual-driven decision: the solve never reads device data
// on the host, so it can be captured in one graph (CUDA graphs, torch.compile).
inline NewtonConfig compile_safe_config(int iterations = 3) {
  NewtonConfig config;
  config.max_iters = iterations;
  return config;
}

// True when `config` makes no host read: what compile_safe_config guarantees.
inline bool is_compile_safe(const NewtonConfig& config) {
  return !config.residual_atol && !config.residual_fail && !config.picard_adapt;
}

// Optional output of a solve. The host fields are known without synchronisation; the Views are
// filled on the device (one extra residual pass) and read only if the caller reads them.
template <class MemorySpace = Kokkos::DefaultExecutionSpace::memory_space>
struct NewtonStats {
  // Newton iterations run (0 in sequential mode); in fused mode with residual_atol, the most that any
  // window ran (its windows stop on their own).
  int iterations = 0;
  int picard_sweeps = 0; // Picard sweeps run before the last Newton attempt
  NewtonMode mode = NewtonMode::automatic; // the mode that ran
  Kokkos::View<double*, MemorySpace> residual; // [B]: max over t and channels of |F_t(h)| at the result
  // [B]: 1 if residual <= residual_atol (or residual_fail when atol is unset; finite when neither is set)
  Kokkos::View<int*, MemorySpace> converged;
};

// Thrown when max |F| exceeds NewtonConfig::residual_fail after the last iteration (or is not finite).
class NewtonDivergenceError : public std::runtime_error {
public:
  NewtonDivergenceError(double residual, int iteration, double threshold)
      : std::runtime_error("paraseq::newton_solve: the Newton iteration did not converge: max |F| = " +
                           std::to_string(residual) + " after iteration " + std::to_string(iteration) +
                           ", expected <= residual_fail = " + std::to_string(threshold)),
        residual_(residual), iteration_(iteration) {}
  double residual() const noexcept { return residual_; }
  int iteration() const noexcept { return iteration_; }

private:
  double residual_;
  int iteration_;
};

// Stands for "this gradient is not wanted" (newton_backward, project_inputs_backward).
struct NoGradient {};

namespace detail {
inline std::atomic<long>& newton_host_sync_counter() {
  static std::atomic<long> count{0};
  return count;
}
} // namespace detail

// How many times the Newton solver has read device data on the host since the program started.
inline long newton_host_syncs() { return detail::newton_host_sync_counter().load(); }

} // namespace paraseq
