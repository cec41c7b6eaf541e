// ParaGRU (diagonal and head-block) forward and forward+backward through newton_solve in its modes,
// and the input projection GEMM. Shapes (B, T, H): the anchors (16, 4096, 1024) and (8, 16384, 512), a long
// sequence with a small batch (1, 65536, 256), and (1, 262144, 1), where B x H is below the
// thread count of any machine, so the automatic rule picks Newton over the sequential loop.
// The problem and the counters: bench_newton.hpp.

#include "bench_newton.hpp"

#include <paraseq/solvers/input_projection.hpp>

#include <cmath>
#include <tuple>
#include <vector>

namespace {

using paraseq::bench::Space;
using namespace paraseq::bench::gru;

paraseq::NewtonMode mode_of(const benchmark::State& state) { return paraseq::NewtonMode(state.range(3)); }

// ParaGRU's forward (and with `backward` its adjoint) of shape (B, T, H) under `config`, K = 3.
void time_gru(benchmark::State& state, int B, int T, int H, const paraseq::NewtonConfig& config, bool backward) {
  GruProblem problem(B, T, H);
  View3 g("g", backward ? B : 0, T, H), du("du", backward ? B : 0, T, 3 * H);
  View1 da("da", backward ? 3 * H : 0);
  if (backward) fill(g, 1.0f, 3);
  const double elements = double(B) * T * H;
  const double bytes = (backward ? 16 + 32 : 16) * elements;
  const double flops = (forward_flops_per_element + (backward ? backward_flops_per_element : 0)) * elements;
  paraseq::bench::time_fenced(state, bytes, flops, [&](const Space& space) {
    paraseq::newton_solve(space, problem.cell(), problem.u, problem.h, config);
    if (backward)
      paraseq::newton_backward(space, problem.cell(), problem.u, problem.h, g, du, da, paraseq::ZeroInitialState{},
                               paraseq::NoGradient{}, config);
  });
}

void gru_forward(benchmark::State& state) {
  time_gru(state, int(state.range(0)), int(state.range(1)), int(state.range(2)), config_of(mode_of(state)), false);
}

void gru_forward_backward(benchmark::State& state) {
  time_gru(state, int(state.range(0)), int(state.range(1)), int(state.range(2)), config_of(mode_of(state)), true);
}

void gru_shapes(benchmark::internal::Benchmark* bench) {
  bench->ArgNames({"B", "T", "H", "mode"});
  for (auto mode : {paraseq::NewtonMode::newton, paraseq::NewtonMode::fused, paraseq::NewtonMode::one_pass,
                    paraseq::NewtonMode::sequential, paraseq::NewtonMode::automatic}) {
    for (auto [B, T, H] : {std::tuple{16, 4096, 1024}, {8, 16384, 512}, {1, 65536, 256}, {1, 262144, 1}})
      bench->Args({B, T, H, long(mode)});
  }
}
PARASEQ_BENCHMARK(gru_forward)->Apply(gru_shapes);
PARASEQ_BENCHMARK(gru_forward_backward)->Apply(gru_shapes);

// Long sequences with few channels, where the one-pass mode is meant to beat both fused (windows
// one after another) and newton (memory re-read every iteration): its three modes side by side, and
// the automatic rule's choice at the two shapes that gru_forward does not run.
void long_sequence_shapes(benchmark::internal::Benchmark* bench) {
  bench->ArgNames({"B", "T", "H", "mode"});
  for (auto mode : {paraseq::NewtonMode::newton, paraseq::NewtonMode::fused, paraseq::NewtonMode::one_pass})
    for (auto [B, T, H] : {std::tuple{1, 65536, 256}, {16, 4096, 1024}, {1, 1 << 20, 64}, {4, 1 << 18, 128}})
      bench->Args({B, T, H, long(mode)});
  for (auto [B, T, H] : {std::tuple{1, 1 << 20, 64}, {4, 1 << 18, 128}})
    bench->Args({B, T, H, long(paraseq::NewtonMode::automatic)});
}
PARASEQ_BENCHMARK(gru_forward)->Name("gru_forward_long")->Apply(long_sequence_shapes);

// The one-pass mode at the long shape and the fused mode at the anchor shape with K = 1 .. 4
// iterations: the slope is what one more iteration costs (its windows' exchanges included), the
// intercept what a call pays once (reading u, writing h, the initial guess).
void gru_forward_iterations(benchmark::State& state) {
  paraseq::NewtonConfig config = config_of(mode_of(state));
  config.max_iters = int(state.range(4));
  time_gru(state, int(state.range(0)), int(state.range(1)), int(state.range(2)), config, false);
}
void iteration_counts(benchmark::internal::Benchmark* bench) {
  bench->ArgNames({"B", "T", "H", "mode", "K"});
  for (auto [B, T, H, mode] : {std::tuple{1, 65536, 256, paraseq::NewtonMode::one_pass},
                               {16, 4096, 1024, paraseq::NewtonMode::fused}})
    for (int K = 1; K <= 4; ++K) bench->Args({B, T, H, long(mode), K});
}
PARASEQ_BENCHMARK(gru_forward_iterations)->Apply(iteration_counts);

// The head-block ParaGRU (ParaGRUHeads: a dense d_head x d_head block per head and gate) at the
// shapes of perf_tests/compare.py's head section, forward and forward + backward in the modes the
// automatic rule chooses between. Flops count each head's three matrix-vector products (6 d_head
// per element) on top of the diagonal cell's.
struct GruHeadsProblem {
  Kokkos::View<float****, Kokkos::LayoutRight, memory> a;
  View3 u, h;
  GruHeadsProblem(int B, int T, int H, int d_head)
      : a("a", 3, H / d_head, d_head, d_head), u("u", B, T, 3 * H), h("h", B, T, H) {
    fill(a, 0.5f / std::sqrt(float(d_head)), 1); // blocks of norm about 0.5: a contraction, as trained heads are
    fill(u, 1.0f, 2);
  }
  paraseq::ParaGRUHeads<float, memory> cell() const { return {a}; }
};

void gru_heads(benchmark::State& state, bool backward) {
  const int B = int(state.range(0)), T = int(state.range(1)), H = int(state.range(2)), d_head = int(state.range(3));
  GruHeadsProblem problem(B, T, H, d_head);
  View3 g("g", B, T, H), du("du", B, T, 3 * H);
  View1 da("da", 3 * H * d_head);
  fill(g, 1.0f, 3);
  paraseq::NewtonConfig config = paraseq::compile_safe_config(3);
  config.mode = paraseq::NewtonMode(state.range(4));
  const double elements = double(B) * T * H;
  const double flops = (forward_flops_per_element + 6.0 * d_head) * elements;
  const double bytes = (backward ? 48 : 16) * elements;
  paraseq::bench::time_fenced(state, bytes, (backward ? 3 : 1) * flops, [&](const Space& space) {
    paraseq::newton_solve(space, problem.cell(), problem.u, problem.h, config);
    if (backward)
      paraseq::newton_backward(space, problem.cell(), problem.u, problem.h, g, du, da, paraseq::ZeroInitialState{},
                               paraseq::NoGradient{}, config);
  });
}
void gru_heads_forward(benchmark::State& state) { gru_heads(state, false); }
void gru_heads_forward_backward(benchmark::State& state) { gru_heads(state, true); }
void gru_heads_shapes(benchmark::internal::Benchmark* bench) {
  bench->ArgNames({"B", "T", "H", "d_head", "mode"});
  for (auto mode : {paraseq::NewtonMode::newton, paraseq::NewtonMode::fused, paraseq::NewtonMode::one_pass,
                    paraseq::NewtonMode::sequential, paraseq::NewtonMode::automatic})
    for (auto [B, T, H, d_head] : {std::tuple{16, 4096, 1024, 32}, {4, 65536, 256, 32}, {16, 4096, 512, 8}})
      bench->Args({B, T, H, d_head, long(mode)});
}
PARASEQ_BENCHMARK(gru_heads_forward)->Apply(gru_heads_shapes);
PARASEQ_BENCHMARK(gru_heads_forward_backward)->Apply(gru_heads_shapes);

// The fused forward at the anchor shape with P threads per lane (NewtonConfig::fused_team_threads),
// so that the device rule choosing P can be checked against its neighbours in one run.
void gru_forward_fused_threads(benchmark::State& state) {
  paraseq::NewtonConfig config = config_of(paraseq::NewtonMode::fused);
  config.fused_team_threads = int(state.range(0));
  time_gru(state, 16, 4096, 1024, config, false);
}
void fused_thread_counts(benchmark::internal::Benchmark* bench) {
  bench->ArgName("P");
  if (Kokkos::SpaceAccessibility<Space, Kokkos::HostSpace>::accessible) bench->Arg(1); // hosts: one thread per window
  else bench->DenseRange(2, 16, 2)->Arg(5);
}
PARASEQ_BENCHMARK(gru_forward_fused_threads)->Apply(fused_thread_counts);

// The one-pass mode at the long shapes with G groups per team and P threads per group (a window of
// 8 P steps on devices), forward and forward + backward (its one-pass adjoint): the library's plan
// (P = G = 0; newton_fused.hpp, one_pass_team_groups) against teams of 256 threads for 32, 16 and 8
// groups (32 groups of 8 threads: the library's plan before one_pass_team_groups, 2026-12-07).
void gru_one_pass_threads(benchmark::State& state) {
  time_gru(state, int(state.range(0)), int(state.range(1)), int(state.range(2)), one_pass_config(state),
           state.range(5) != 0);
}
void one_pass_thread_counts(benchmark::internal::Benchmark* bench) {
  bench->ArgNames({"B", "T", "H", "P", "G", "backward"});
  constexpr bool on_host = Kokkos::SpaceAccessibility<Space, Kokkos::HostSpace>::accessible;
  for (int backward : {0, 1})
    for (auto [B, T, H] : one_pass_shapes()) {
      bench->Args({B, T, H, 0, 0, backward});
      if (!on_host)
        for (int G : {32, 16, 8}) bench->Args({B, T, H, 256 / G, G, backward});
    }
}
PARASEQ_BENCHMARK(gru_one_pass_threads)->Apply(one_pass_thread_counts);

// u = x W^T + b for M = B*T rows: KokkosBlas::gemm where available, else the team-tiled GEMM.
void projection_gemm(benchmark::State& state) {
  const int M = int(state.range(0)), D = int(state.range(1)), U = int(state.range(2));
  Kokkos::View<float***, Kokkos::LayoutRight, memory> x("x", 1, M, D), u("u", 1, M, U);
  View2 W("W", U, D);
  View1 bias("b", U);
  fill(x, 1.0f, 4);
  fill(W, 0.1f, 5);
  paraseq::bench::time_fenced(state, 4.0 * (double(M) * D + double(U) * D + double(M) * U), 2.0 * M * D * U,
                              [&](const Space& space) { paraseq::project_inputs(space, x, W, bias, u); });
}
PARASEQ_BENCHMARK(projection_gemm)->ArgNames({"M", "D", "U"})->Args({16384, 256, 768})->Args({65536, 256, 768});

} // namespace
