// The one-pass kernels built with other steps per thread and other launch bounds than the library's,
// against the library's: ParaGRU in fp32 at the one-pass mode's long shapes (bench_newton.hpp).

#include "bench_newton.hpp"

namespace {

using paraseq::bench::Space;
using namespace paraseq::bench::gru;

// The one-pass forward built with L = 4 or 8 steps per thread (the library's kernel on devices has
// 8, with each step's (f, J) cached): a thread's registers against the windows' count, which the
// look-back walks. And the library's L = 8 kernel (on devices 4 resident teams of at most 256
// threads per SM, 64 registers: one_pass_launch_bounds) against the same kernel without launch
// bounds (3 teams at its 72 registers) and for 3 teams (80 registers): resident warps against
// spills (5 and 6 teams, at most 48 and 40 registers, were slower than 4 at every shape on the H100:
// 0.654 and 0.858 against 0.558 ms at (1, 65536, 256), 3f24ee8, 2026-12-07, with 32 groups per team
// and the inputs in registers; evaluating the cell again in the re-run instead of keeping (f, J),
// 16 registers fewer, was 5-13% slower at 4 and 3 teams: 54d21b3, 2026-12-07). And the library's
// kernel with its look-backs reading 2 earlier windows at once instead of 1 (LookBackReadAhead):
// registers against rounds of memory latency (4 and 8 were slower still on the H100 and the H200:
// 24471d3 and fca8119, 2026-12-07; one_pass_read_ahead). And the library's kernel keeping its
// chunks' inputs in registers instead of team scratch (one_pass_chunk_inputs).
// The kernels run with G groups per team and P threads per group (windows of L x P steps).
template <int ChunkCapacity, class LaunchBounds = paraseq::detail::LibraryLaunchBounds,
          int LookBackReadAhead = paraseq::detail::one_pass_read_ahead,
          class InputsAt = paraseq::detail::LibraryChunkInputs>
void one_pass_with_chunks(benchmark::State& state) {
  const int B = int(state.range(0)), T = int(state.range(1)), H = int(state.range(2));
  GruProblem problem(B, T, H);
  const paraseq::NewtonConfig config = one_pass_config(state);
  const auto cell = problem.cell();
  // The View types newton_solve gives its compiled instances, so that L = 8 is the library's kernel.
  const paraseq::InView<float, 3, Space> u = problem.u;
  const paraseq::OutView<float, 3, Space> h = problem.h;
  const paraseq::InView<float, 2, Space> no_h0;
  const paraseq::ScanShape shape = paraseq::detail::newton_shape(cell, u);
  const double elements = double(B) * T * H;
  paraseq::bench::time_fenced(state, 16 * elements, forward_flops_per_element * elements, [&](const Space& space) {
    paraseq::detail::one_pass_newton<float, ChunkCapacity, LaunchBounds, LookBackReadAhead, InputsAt>(
        space, cell, u, h, no_h0, config, shape);
  });
}
// The kernels' variants with P threads for each of 32 groups per team (the library's plan before
// one_pass_team_groups), and with the library's plan (P = G = 0).
void one_pass_chunk_shapes(benchmark::internal::Benchmark* bench) {
  bench->ArgNames({"B", "T", "H", "P", "G"});
  constexpr bool on_host = Kokkos::SpaceAccessibility<Space, Kokkos::HostSpace>::accessible;
  for (auto [B, T, H] : one_pass_shapes()) {
    for (int P : one_pass_thread_choices())
      if (P % 4 == 0 || P == 1) bench->Args({B, T, H, P, on_host ? 0 : 32});
    if (!on_host) bench->Args({B, T, H, 0, 0});
  }
}
// The library's kernels with G groups per team and P threads per group (teams of 128 and 256
// threads), and with the library's plan (P = G = 0): the chains' windows against the steps a window
// holds (newton_fused.hpp, one_pass_team_groups).
void one_pass_team_shapes(benchmark::internal::Benchmark* bench) {
  bench->ArgNames({"B", "T", "H", "P", "G"});
  constexpr bool on_host = Kokkos::SpaceAccessibility<Space, Kokkos::HostSpace>::accessible;
  for (auto [B, T, H] : one_pass_shapes()) {
    bench->Args({B, T, H, on_host ? 1 : 0, 0});
    if (!on_host)
      for (int G : {32, 16, 8, 4})
        for (int threads : {256, 128}) bench->Args({B, T, H, threads / G, G});
  }
}
PARASEQ_BENCHMARK(one_pass_with_chunks<4>)->Name("gru_one_pass_chunks/L:4")->Apply(one_pass_chunk_shapes);
PARASEQ_BENCHMARK(one_pass_with_chunks<8>)->Name("gru_one_pass_chunks/L:8")->Apply(one_pass_team_shapes);
PARASEQ_BENCHMARK((one_pass_with_chunks<8, void>))->Name("gru_one_pass_chunks/L:8/bounds:none")->Apply(one_pass_chunk_shapes);
PARASEQ_BENCHMARK((one_pass_with_chunks<8, Kokkos::LaunchBounds<256, 3>>))
    ->Name("gru_one_pass_chunks/L:8/teams:3")
    ->Apply(one_pass_chunk_shapes);
PARASEQ_BENCHMARK((one_pass_with_chunks<8, paraseq::detail::LibraryLaunchBounds, 2>))
    ->Name("gru_one_pass_chunks/L:8/read_ahead:2")
    ->Apply(one_pass_chunk_shapes);
PARASEQ_BENCHMARK((one_pass_with_chunks<8, paraseq::detail::LibraryLaunchBounds, paraseq::detail::one_pass_read_ahead,
                                         paraseq::detail::chunk_inputs_at<paraseq::detail::ChunkInputs::registers>>))
    ->Name("gru_one_pass_chunks/L:8/registers")
    ->Apply(one_pass_chunk_shapes);

// The one-pass adjoint alone at the converged trajectory, with G groups per team and P threads per
// group: the library's kernel (on devices ptxas's registers: 2 teams of 256 threads per SM; see
// one_pass_adjoint) against the same kernel compiled for 3 teams (80 registers) and 4 (64), and
// with look-backs reading 2 or 4 later windows at once instead of 1 (LookBackReadAhead, as the
// forward above; 8 was slower than 4 at every shape on the H200: one_pass_adjoint_read_ahead).
// Bytes: u, h and g read and du written once.
template <class LaunchBounds, int LookBackReadAhead = paraseq::detail::one_pass_adjoint_read_ahead>
void one_pass_adjoint_with_bounds(benchmark::State& state) {
  const int B = int(state.range(0)), T = int(state.range(1)), H = int(state.range(2));
  GruProblem problem(B, T, H);
  const paraseq::NewtonConfig config = one_pass_config(state);
  const auto cell = problem.cell();
  const Space space;
  paraseq::newton_solve(space, cell, problem.u, problem.h, config);
  View3 g("g", B, T, H), du("du", B, T, 3 * H);
  fill(g, 1.0f, 3);
  // The View types newton_backward gives its compiled instances, so that the library's kernel is measured.
  const paraseq::InView<float, 3, Space> u = problem.u, h = problem.h, g_in = g;
  const paraseq::OutView<float, 3, Space> du_out = du;
  const paraseq::InView<float, 2, Space> no_h0;
  const paraseq::OutView<float, 2, Space> no_dh0;
  const paraseq::ScanShape shape = paraseq::detail::newton_shape(cell, u);
  const double elements = double(B) * T * H;
  paraseq::bench::time_fenced(state, 32 * elements, backward_flops_per_element * elements, [&](const Space& on) {
    paraseq::detail::one_pass_adjoint<float, LaunchBounds, LookBackReadAhead>(on, cell, u, h, no_h0, g_in, du_out,
                                                                             no_dh0, config, shape);
  });
}
PARASEQ_BENCHMARK(one_pass_adjoint_with_bounds<paraseq::detail::LibraryLaunchBounds>)
    ->Name("gru_one_pass_adjoint")
    ->Apply(one_pass_team_shapes);
PARASEQ_BENCHMARK((one_pass_adjoint_with_bounds<Kokkos::LaunchBounds<256, 3>>))
    ->Name("gru_one_pass_adjoint/teams:3")
    ->Apply(one_pass_chunk_shapes);
PARASEQ_BENCHMARK((one_pass_adjoint_with_bounds<Kokkos::LaunchBounds<256, 4>>))
    ->Name("gru_one_pass_adjoint/teams:4")
    ->Apply(one_pass_chunk_shapes);
PARASEQ_BENCHMARK((one_pass_adjoint_with_bounds<paraseq::detail::LibraryLaunchBounds, 2>))
    ->Name("gru_one_pass_adjoint/read_ahead:2")
    ->Apply(one_pass_chunk_shapes);
PARASEQ_BENCHMARK((one_pass_adjoint_with_bounds<paraseq::detail::LibraryLaunchBounds, 4>))
    ->Name("gru_one_pass_adjoint/read_ahead:4")
    ->Apply(one_pass_chunk_shapes);

} // namespace
