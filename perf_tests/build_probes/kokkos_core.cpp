// Build-cost probe: a unit that includes Kokkos' core header and launches one kernel, the floor of
// every application unit's compile time (perf_tests/build_cost.py reports it; docs/performance.md).

#include <Kokkos_Core.hpp>

void paraseq_probe_fill(Kokkos::View<float***> h) { Kokkos::deep_copy(h, 1.0f); }
