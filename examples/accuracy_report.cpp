// Measures the error of the ordered scan against the float64 sequential reference for each
// structure, value type and accumulation type; docs/numerics.md quotes its output.
//
//   build/main/examples/paraseq_accuracy_report

#include <paraseq/core/linear_scan.hpp>
#include <paraseq/core/sequential_reference.hpp>

#include <Kokkos_Core.hpp>
#include <Kokkos_Random.hpp>

#include <cmath>
#include <cstdio>

namespace {

using Space = Kokkos::DefaultExecutionSpace;

// A contractive operator with long memory: (1 - rho) on the diagonal, off-diagonal noise below rho / d.
template <class View>
void fill_operator(const View& A, int d, double rho, Kokkos::Random_XorShift64_Pool<Space>& pool) {
  using T = typename View::value_type;
  Kokkos::fill_random(A, pool, T(-rho / (2 * d)), T(rho / (2 * d)));
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, A);
  for (std::size_t e = 0; e < host.span(); e += std::size_t(d) * d)
    for (int i = 0; i < d; ++i) host.data()[e + i * d + i] += T(1 - rho);
  Kokkos::deep_copy(A, host);
}

template <class T, class Acc, class Structure, class AView>
void report(const char* structure_name, const AView& A, int B, int T_steps, int N,
            Kokkos::Random_XorShift64_Pool<Space>& pool) {
  Kokkos::View<T***, Kokkos::LayoutRight, Space::memory_space> b("b", B, T_steps, N), h("h", B, T_steps, N);
  Kokkos::fill_random(b, pool, T(-1), T(1));
  paraseq::linear_scan<Acc>(Space{}, Structure{}, A, b, h);
  const auto A_host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, A);
  const auto ref = paraseq::reference::linear_recurrence(
      Structure{}, A_host, Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, b));
  const auto out = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, h);
  double max_error = 0, max_ref = 0;
  for (std::size_t i = 0; i < ref.span(); ++i) {
    max_error = std::fmax(max_error, std::fabs(double(out.data()[i]) - ref.data()[i]));
    max_ref = std::fmax(max_ref, std::fabs(ref.data()[i]));
  }
  std::printf("| %-16s | %-6s | %-6s | %7d | %9.2e |\n", structure_name, sizeof(T) == 4 ? "float" : "double",
              sizeof(Acc) == 4 ? "float" : "double", T_steps, max_error / max_ref);
}

template <class T, class Acc>
void report_all(int T_steps, Kokkos::Random_XorShift64_Pool<Space>& pool) {
  using memory = Space::memory_space;
  Kokkos::View<T***, Kokkos::LayoutRight, memory> diagonal("A", 4, T_steps, 64);
  Kokkos::fill_random(diagonal, pool, T(0.95), T(1.0));
  report<T, Acc, paraseq::Diagonal>("diagonal", diagonal, 4, T_steps, 64, pool);
  Kokkos::View<T*****, Kokkos::LayoutRight, memory> block("A", 4, T_steps, 8, 4, 4);
  fill_operator(block, 4, 0.05, pool);
  report<T, Acc, paraseq::BlockDiagonal<4>>("block-diagonal 4", block, 4, T_steps, 32, pool);
  Kokkos::View<T****, Kokkos::LayoutRight, memory> dense("A", 2, T_steps, 16, 16);
  fill_operator(dense, 16, 0.05, pool);
  report<T, Acc, paraseq::Dense>("dense 16", dense, 2, T_steps, 16, pool);
}

} // namespace

int main(int argc, char** argv) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  Kokkos::Random_XorShift64_Pool<Space> pool(7);
  std::printf("paraseq scan accuracy on %s: max |h - h_ref| / max |h_ref|, h_ref the float64 loop\n\n", Space::name());
  std::printf("| structure        | values | accum. |       T | rel. error |\n| --- | --- | --- | ---: | ---: |\n");
  for (int T_steps : {1000, 100000}) {
    report_all<double, double>(T_steps, pool);
    report_all<float, double>(T_steps, pool);
    report_all<float, float>(T_steps, pool);
  }
  return 0;
}
