// Batched Runge–Kutta loops in fp32: adaptive Dormand–Prince 5(4), forward and forward+gradient,
// fused and stepped (the cases: bench_rk.hpp), in a unit of its own beside bench_rk.cpp's RK4.

#include "bench_rk.hpp"

namespace {

using namespace paraseq::bench::rk;

void dopri5_adaptive(benchmark::State& state) { run_method<ode::DormandPrince5>(state); }
PARASEQ_BENCHMARK(dopri5_adaptive)->Apply(adaptive_grid);

} // namespace
