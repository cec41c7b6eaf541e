// Build-cost probe: an application unit that solves and differentiates a ParaGRU layer, a built-in
// cell, so that both calls run the paraseq library's compiled instances and compile no kernel here.
// Its time against kokkos_core.cpp's is what paraseq's headers add (docs/performance.md).

#include <paraseq/core/views.hpp>
#include <paraseq/solvers/cells.hpp>
#include <paraseq/solvers/newton.hpp>
#include <paraseq/solvers/newton_backward.hpp>

#include <Kokkos_Core.hpp>

using Space = Kokkos::DefaultExecutionSpace;

void paraseq_probe_gru(paraseq::InView<float, 2, Space> a, paraseq::InView<float, 3, Space> u,
                       paraseq::OutView<float, 3, Space> h, paraseq::InView<float, 3, Space> g,
                       paraseq::OutView<float, 3, Space> du, paraseq::OutView<float, 1, Space> da) {
  const Space space;
  const paraseq::ParaGRU<float, Space::memory_space> cell{a};
  paraseq::newton_solve(space, cell, u, h, paraseq::compile_safe_config(3));
  paraseq::newton_backward(space, cell, u, h, g, du, da);
}
