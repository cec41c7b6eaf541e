#pragma once
// The ParaGRU benchmarks' problem (bench_newton.cpp: the modes through newton_solve and
// newton_backward; bench_newton_kernels.cpp: the one-pass kernels built with other steps per thread
// and launch bounds, a unit of its own, since each kernel is most of a unit's nvcc time): fp32,
// gates' weights and inputs uniform in [-0.5, 0.5] and [-1, 1], K = 3.
//
// Counters: bytes are the compulsory traffic of the fused ideal (read u, 3 values per element, and
// write h once; the backward also reads h and g and writes du); flops are the useful arithmetic of
// one sequential pass (about 25 per element forward, 45 backward), so GFLOP/s compares modes by the
// work the answer needs, not by the work each mode does.

#include "bench_support.hpp"

#include <paraseq/solvers/cells.hpp>
#include <paraseq/solvers/newton.hpp>
#include <paraseq/solvers/newton_backward.hpp>

#include <tuple>
#include <vector>

namespace paraseq::bench::gru {

using memory = Space::memory_space;
using View1 = Kokkos::View<float*, Kokkos::LayoutRight, memory>;
using View2 = Kokkos::View<float**, Kokkos::LayoutRight, memory>;
using View3 = Kokkos::View<float***, Kokkos::LayoutRight, memory>;

inline constexpr double forward_flops_per_element = 25, backward_flops_per_element = 45;

template <class View>
void fill(const View& view, float bound, unsigned seed) {
  fill_uniform(view, -bound, bound, seed);
}

struct GruProblem {
  View2 a;
  View3 u, h;
  GruProblem(int B, int T, int H) : a("a", 3, H), u("u", B, T, 3 * H), h("h", B, T, H) {
    fill(a, 0.5f, 1);
    fill(u, 1.0f, 2);
  }
  ParaGRU<float, memory> cell() const { return {a}; }
};

inline NewtonConfig config_of(NewtonMode mode) {
  NewtonConfig config = compile_safe_config(3);
  config.mode = mode;
  return config;
}

// The one-pass mode's long shapes on devices; on hosts (one thread per window, chunks of up to 256
// steps) a small one. And its threads per lane P (windows of 8 P steps on devices).
inline std::vector<std::tuple<int, int, int>> one_pass_shapes() {
  if (Kokkos::SpaceAccessibility<Space, Kokkos::HostSpace>::accessible) return {{1, 4096, 64}};
  return {{1, 65536, 256}, {1, 1 << 20, 64}, {4, 1 << 18, 128}};
}
inline std::vector<int> one_pass_thread_choices() {
  if (Kokkos::SpaceAccessibility<Space, Kokkos::HostSpace>::accessible) return {1};
  return {2, 4, 8};
}

// The one-pass mode's config for a benchmark whose arguments 3 and 4 are P (threads per group) and G
// (groups per team); 0 leaves either to the library's plan.
inline NewtonConfig one_pass_config(const benchmark::State& state) {
  NewtonConfig config = config_of(NewtonMode::one_pass);
  config.fused_team_threads = int(state.range(3));
  config.fused_team_groups = int(state.range(4));
  return config;
}

} // namespace paraseq::bench::gru
