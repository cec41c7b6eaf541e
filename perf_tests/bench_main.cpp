// The paraseq performance suite: Google Benchmark inside one Kokkos scope.
#include <Kokkos_Core.hpp>
#include <benchmark/benchmark.h>

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  benchmark::Initialize(&argc, argv);
  benchmark::AddCustomContext("kokkos_version", std::to_string(KOKKOS_VERSION));
  benchmark::AddCustomContext("execution_space", Kokkos::DefaultExecutionSpace::name());
  benchmark::AddCustomContext("concurrency", std::to_string(Kokkos::DefaultExecutionSpace().concurrency()));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
