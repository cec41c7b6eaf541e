// The cached workspace (core/workspace.hpp): repeated calls of one shape allocate nothing in the
// space's memory, counted through the Kokkos Tools allocation callback (what a memory profiler
// sees); a larger shape allocates, a smaller one after it does not; the results are bitwise those of
// a fresh cache; and two host threads calling at once both get the results of a sequential loop.
// The scans, the Newton solver and its backward pass, and the Runge–Kutta gradients (their report
// and mesh in the caller's SolveOptions::workspace). Its own executable, as the allocation callback
// is global to the process.

#include <paraseq/core/linear_scan.hpp>
#include <paraseq/core/workspace.hpp>
#include <paraseq/loops/fields.hpp>
#include <paraseq/loops/integrate.hpp>
#include <paraseq/solvers/cells.hpp>
#include <paraseq/solvers/newton.hpp>
#include <paraseq/solvers/newton_backward.hpp>

#include "test_support.hpp"

#include <gmock/gmock.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace paraseq;
using namespace paraseq::test;

// Allocations in MemorySpace while one is alive, with their labels (for the failure message).
template <class MemorySpace>
class AllocationCounter {
public:
  AllocationCounter() {
    labels().clear();
    Kokkos::Tools::Experimental::set_allocate_data_callback(
        [](Kokkos::Profiling::SpaceHandle handle, const char* label, const void*, std::uint64_t) {
          if (std::string(handle.name) == MemorySpace::name()) labels().push_back(label);
        });
  }
  ~AllocationCounter() { Kokkos::Tools::Experimental::set_allocate_data_callback(nullptr); }
  AllocationCounter(const AllocationCounter&) = delete;
  AllocationCounter& operator=(const AllocationCounter&) = delete;

  // The allocations made by `call`, as "label, label, ...".
  std::string during(const std::function<void()>& call) {
    labels().clear();
    call();
    Kokkos::fence();
    std::string made;
    for (const std::string& label : labels()) made += (made.empty() ? "" : ", ") + label;
    return made;
  }

private:
  static std::vector<std::string>& labels() {
    static std::vector<std::string> made;
    return made;
  }
};

template <class Space>
struct GruCase {
  View2<double, Space> a;
  View3<double, Space> u, h, g, du;
  View1<double, Space> da;
  GruCase(int B, int T, int H, unsigned seed)
      : a("a", 3, H), u("u", B, T, 3 * H), h("h", B, T, H), g("g", B, T, H), du("du", B, T, 3 * H), da("da", 3 * H) {
    fill_uniform(a, -0.5, 0.5, seed);
    fill_uniform(u, -0.5, 0.5, seed + 1);
    fill_uniform(g, -1, 1, seed + 2);
  }
  ParaGRU<double, typename Space::memory_space> cell() const { return {a}; }
};

template <class Space>
struct ScanCase {
  View3<double, Space> A, b, h;
  ScanCase(int B, int T, int N, unsigned seed) : A("A", B, T, N), b("b", B, T, N), h("h", B, T, N) {
    fill_uniform(A, -0.9, 0.9, seed);
    fill_uniform(b, -1, 1, seed + 1);
  }
};

// The values of these Views, copied out (a host View's mirror would be the View itself).
template <class... Views>
std::vector<double> snapshot(const Views&... views) {
  std::vector<double> values;
  auto append = [&](const auto& view) {
    const auto host = to_host(view);
    values.insert(values.end(), host.data(), host.data() + host.span());
  };
  (append(views), ...);
  return values;
}

bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0;
}

NewtonConfig with_mode(NewtonMode mode, ScanConfig scan = {}) {
  NewtonConfig config;
  config.mode = mode;
  config.scan = scan;
  return config;
}

// Calls of `run(size)` on the sizes small, small, large, small: only the first (which allocates the
// buffer `site`, so the path under test ran) and the large one allocate; and each call's output (read
// by `result`) is bitwise the one after release_workspace().
template <class Space, class Run, class Result>
void expect_steady_state_without_allocations(const Run& run, const Result& result, int small, int large,
                                             const std::string& site) {
  AllocationCounter<typename Space::memory_space> counter;
  release_workspace();
  EXPECT_THAT(counter.during([&] { run(small); }), ::testing::HasSubstr(site)) << "the first call";
  EXPECT_EQ(counter.during([&] { run(small); }), "") << "the second call of the same shape";
  const auto cached_small = result();
  EXPECT_NE(counter.during([&] { run(large); }), "") << "a larger shape needs larger buffers";
  EXPECT_EQ(counter.during([&] { run(small); }), "") << "a smaller shape after a larger one";
  EXPECT_TRUE(same_bits(result(), cached_small));
  release_workspace();
  run(small);
  EXPECT_TRUE(same_bits(result(), cached_small)) << "a fresh cache gives other bits";
}

template <class Space>
class Workspace : public ::testing::Test {};
TYPED_TEST_SUITE(Workspace, ExecutionSpaces, SpaceName);

TYPED_TEST(Workspace, LinearScanAllocatesOnlyWhenItGrows) {
  using Space = TypeParam;
  for (TimeSplit split : {TimeSplit::two_pass, TimeSplit::single_pass}) {
    SCOPED_TRACE("time_split=" + std::to_string(int(split)));
    const ScanConfig config{1, 7, 6, split}; // 6 time chunks: chunk maps and carries (and statuses)
    ScanCase<Space> small(2, 300, 5, 3), large(3, 900, 9, 5);
    expect_steady_state_without_allocations<Space>(
        [&](int size) {
          if (size == 0) linear_scan(Space{}, Diagonal{}, small.A, small.b, small.h, config);
          else linear_scan(Space{}, Diagonal{}, large.A, large.b, large.h, config);
        },
        [&] { return snapshot(small.h); }, 0, 1,
        split == TimeSplit::single_pass ? "paraseq::chunk_status" : "paraseq::chunk_carries");
  }
}

TYPED_TEST(Workspace, NewtonSolveAndBackwardAllocateOnlyWhenTheyGrow) {
  using Space = TypeParam;
  GruCase<Space> small(2, 300, 5, 11), large(3, 700, 8, 17);
  for (const NewtonConfig& base : {with_mode(NewtonMode::newton, ScanConfig{1, 7, 5, TimeSplit::two_pass}),
                                   with_mode(NewtonMode::newton, ScanConfig{1, 7, 5, TimeSplit::single_pass}),
                                   with_mode(NewtonMode::fused), with_mode(NewtonMode::one_pass)}) {
    NewtonConfig config = base;
    const bool one_pass = config.mode == NewtonMode::one_pass; // which refuses residual_atol
    // the newton mode's residuals, the fused mode's iteration count
    if (!one_pass) config.residual_atol = 1e-12;
    config.max_iters = 20;
    SCOPED_TRACE("mode=" + std::to_string(int(config.mode)) + " split=" + std::to_string(int(config.scan.time_split)));
    const bool newton = config.mode == NewtonMode::newton;
    auto pick = [&](int size) -> GruCase<Space>& { return size == 0 ? small : large; };
    expect_steady_state_without_allocations<Space>(
        [&](int size) { newton_solve(Space{}, pick(size).cell(), pick(size).u, pick(size).h, config); },
        [&] { return snapshot(small.h); }, 0, 1,
        newton ? "paraseq::newton_iterate" : one_pass ? "paraseq::newton_one_pass" : "paraseq::newton_fused_iterations");
    expect_steady_state_without_allocations<Space>(
        [&](int size) {
          GruCase<Space>& c = pick(size);
          newton_backward(Space{}, c.cell(), c.u, c.h, c.g, c.du, c.da, ZeroInitialState{}, NoGradient{}, config);
        },
        [&] { return snapshot(small.du, small.da); }, 0, 1,
        newton ? "paraseq::newton_adjoint" : one_pass ? "paraseq::newton_one_pass_adjoint" : "paraseq::newton_param_partials");
  }
}

// Every word i of `words` = (tag, i), on Space.
template <class Space, class Words>
void write_with_tag(const Words& words, std::uint32_t tag) {
  Kokkos::parallel_for(
      "test::write_with_tag", Kokkos::RangePolicy<Space>(0, words.size()),
      KOKKOS_LAMBDA(std::size_t i) { words(i) = (std::uint64_t(tag) << 32) | std::uint32_t(i); });
}

template <class Words>
std::vector<std::uint32_t> tags_of(const Words& words) {
  const auto copied = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, words);
  std::vector<std::uint32_t> tags;
  for (std::size_t i = 0; i < copied.size(); ++i) tags.push_back(std::uint32_t(copied(i) >> 32));
  return tags;
}

// The one-pass Newton kernels' tagged words (detail::tagged_workspace_view): each call gets a tag
// that no word of the buffer carries, without clearing the buffer (the words a call wrote with its
// tag stay), and a new or grown buffer starts with every word zero.
TYPED_TEST(Workspace, TaggedWordsGetATagNoWordCarries) {
  using Space = TypeParam;
  release_workspace();
  const auto [first, first_tag] = paraseq::detail::tagged_workspace_view(Space{}, "paraseq::test_tagged", 100);
  EXPECT_THAT(tags_of(first), ::testing::Each(0u)) << "a new buffer is zeroed";
  EXPECT_NE(first_tag, 0u);
  write_with_tag<Space>(first, first_tag);
  const auto [again, tag] = paraseq::detail::tagged_workspace_view(Space{}, "paraseq::test_tagged", 60);
  EXPECT_EQ(again.data(), first.data());
  EXPECT_NE(tag, first_tag);
  EXPECT_THAT(tags_of(first), ::testing::Each(first_tag)) << "the words stay, not cleared";
  const auto [grown, grown_tag] = paraseq::detail::tagged_workspace_view(Space{}, "paraseq::test_tagged", 1000);
  EXPECT_THAT(tags_of(grown), ::testing::Each(0u)) << "a grown buffer is zeroed";
  EXPECT_NE(grown_tag, 0u);
  release_workspace();
}

// N trajectories of two states for the built-in fields (their compiled instances), the weights of a
// loss on the final states, the gradients, and a caller's workspace for the report and mesh.
template <class Space>
struct OdeCase {
  View2<double, Space> y0, params, w, y0_bar, params_bar;
  View1<double, Space> shared, shared_bar;
  Kokkos::View<unsigned char*, typename Space::memory_space> workspace;
  OdeCase(int N, int P, int Q, unsigned seed)
      : y0("y0", N, 2), params("params", N, P), w("w", N, 2), y0_bar("y0_bar", N, 2), params_bar("params_bar", N, P),
        shared("shared", Q), shared_bar("shared_bar", Q),
        workspace("workspace", std::max(ode::solve_workspace_bytes<double>(N, 2, ode::FixedSteps::count(0, 0.05, 40)),
                                        ode::solve_workspace_bytes<double>(N, 2, ode::AdaptiveSteps{}))) {
    fill_uniform(y0, -1, 1, seed);
    fill_uniform(params, 0.5, 2, seed + 1);
    fill_uniform(w, -1, 1, seed + 2);
    fill_uniform(shared, -0.5, 0.5, seed + 3);
  }
  ode::SolveOptions options() const {
    ode::SolveOptions options;
    options.workspace = {workspace.data(), workspace.size()};
    options.checkpoint_interval = 7; // several segments, the last one short
    return options;
  }
};

// 40 RK4 steps of damped oscillators with their own coefficients.
template <class Space>
void oscillator_rk4_gradient(const OdeCase<Space>& c, const ode::SolveOptions& options) {
  ode::solve_with_gradient<ode::CompiledModes::fused_only>(
      Space{}, ode::RK4{}, ode::problem(ode::DampedOscillator{}, c.y0, c.params), ode::FixedSteps::count(0, 0.05, 40),
      ode::Outputs<>{}, ode::final_state(c.w),
      ode::Gradients<decltype(c.y0_bar), decltype(c.params_bar)>{c.y0_bar, c.params_bar}, options);
}

TYPED_TEST(Workspace, RungeKuttaGradientsAllocateOnlyWhenTheyGrow) {
  using Space = TypeParam;
  using Linear = ode::Linear<ode::Sharing::shared, ode::Sharing::shared>; // Q = n^2 + n shared coefficients
  OdeCase<Space> small(5, 2, 6, 21), large(40, 2, 6, 25);
  auto pick = [&](int size) -> OdeCase<Space>& { return size == 0 ? small : large; };
  ode::AdaptiveSteps adaptive;
  adaptive.t_end = 2;
  adaptive.rtol = 1e-7;
  adaptive.atol = 1e-9;
  {
    SCOPED_TRACE("RK4, the oscillators' own parameters");
    expect_steady_state_without_allocations<Space>(
        [&](int size) { oscillator_rk4_gradient(pick(size), pick(size).options()); },
        [&] { return snapshot(small.y0_bar, small.params_bar); }, 0, 1, "paraseq::ode::checkpoint_y");
  }
  {
    SCOPED_TRACE("adaptive Dormand-Prince, the oscillators' own parameters");
    expect_steady_state_without_allocations<Space>(
        [&](int size) {
          OdeCase<Space>& c = pick(size);
          ode::solve_with_gradient<ode::CompiledModes::fused_only>(
              Space{}, ode::DormandPrince5{}, ode::problem(ode::DampedOscillator{}, c.y0, c.params), adaptive,
              ode::Outputs<>{}, ode::final_state(c.w),
              ode::Gradients<decltype(c.y0_bar), decltype(c.params_bar)>{c.y0_bar, c.params_bar}, c.options());
        },
        [&] { return snapshot(small.y0_bar, small.params_bar); }, 0, 1, "paraseq::ode::segment_t");
  }
  {
    SCOPED_TRACE("RK4, shared parameters (their gradient's block sums)");
    expect_steady_state_without_allocations<Space>(
        [&](int size) {
          OdeCase<Space>& c = pick(size);
          ode::solve_with_gradient<ode::CompiledModes::fused_only>(
              Space{}, ode::RK4{}, ode::problem(Linear{2}, c.y0, ode::NoView{}, c.shared), ode::FixedSteps::count(0, 0.05, 40),
              ode::Outputs<>{},
              ode::final_state(c.w), ode::Gradients<decltype(c.y0_bar), ode::NoView, decltype(c.shared_bar)>{c.y0_bar, {}, c.shared_bar},
              c.options());
        },
        [&] { return snapshot(small.y0_bar, small.shared_bar); }, 0, 1, "paraseq::ode::shared_gradient_blocks");
  }
  // What the cache holds after the last case (the small batch, since the helper released the larger
  // one's): at least the bytes per trajectory that gradient_workspace_bytes gives for 40 steps, k = 7
  // and Q = 6 shared coefficients; nothing after a release.
  EXPECT_GE(workspace_bytes(), std::size_t(5) * ode::gradient_workspace_bytes<double>(false, 2, 40, 7, 6));
  release_workspace();
  EXPECT_EQ(workspace_bytes(), 0u);
  // Without a workspace of the caller's, a call of a shape seen before allocates its report alone.
  AllocationCounter<typename Space::memory_space> counter;
  ode::SolveOptions options = small.options();
  options.workspace = {};
  oscillator_rk4_gradient(small, options);
  EXPECT_EQ(counter.during([&] { oscillator_rk4_gradient(small, options); }), "paraseq::ode::report");
}

// The diagonal recurrence h_t = A_t h_{t-1} + b_t from h_{-1} = 0, one step after another.
Host3 sequential_scan(const Host3& A, const Host3& b) {
  Host3 h("reference", A.extent(0), A.extent(1), A.extent(2));
  for (std::size_t i = 0; i < A.extent(0); ++i)
    for (std::size_t n = 0; n < A.extent(2); ++n) {
      double state = 0;
      for (std::size_t t = 0; t < A.extent(1); ++t) h(i, t, n) = state = A(i, t, n) * state + b(i, t, n);
    }
  return h;
}

TEST(WorkspaceThreads, TwoHostThreadsCallingAtOnceGetCorrectResults) {
  using Space = Kokkos::DefaultHostExecutionSpace;
  const ScanConfig config{1, 5, 8, TimeSplit::single_pass};
  std::vector<ScanCase<Space>> cases;
  for (unsigned seed : {41u, 43u}) cases.emplace_back(2, 2000, 6, seed);
  std::vector<Host3> references;
  for (const ScanCase<Space>& c : cases) references.push_back(sequential_scan(as_double3(c.A), as_double3(c.b)));
  std::vector<double> errors(cases.size(), 0);
  std::vector<std::thread> threads;
  for (std::size_t k = 0; k < cases.size(); ++k)
    threads.emplace_back([&, k] {
      for (int repeat = 0; repeat < 20; ++repeat) {
        Kokkos::deep_copy(cases[k].h, NAN);
        linear_scan(Space{}, Diagonal{}, cases[k].A, cases[k].b, cases[k].h, config);
        errors[k] = std::fmax(errors[k], max_relative_error(cases[k].h, references[k]));
      }
    });
  for (std::thread& thread : threads) thread.join();
  for (double error : errors) EXPECT_LE(error, 1e-12);
}

} // namespace
