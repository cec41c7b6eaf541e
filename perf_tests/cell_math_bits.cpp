// The built-in cells' logistic function and tanh in float on a CUDA device, against the same
// formulas written with __expf, for every one of the 2^32 float bit patterns: prints a JSON line
// with the number of inputs where the two differ in any bit (NaN inputs: where either result is
// not NaN). docs/numerics.md states the functions as `1 / (1 + __expf(-x))` and
// `1 - 2 / (1 + __expf(2x))`; the library's versions skip __expf's scaling of results below 2^-126
// (cells.hpp, flushing_exp), which this checks changes no gate. Built with CUDA only; run by
// tools/gpu_build_cost.sh.
#include <paraseq/solvers/cells.hpp>

#include <Kokkos_Core.hpp>

#include <cstdint>
#include <cstdio>

namespace {

// 1 where a and b differ in a bit, NaN against NaN aside.
KOKKOS_INLINE_FUNCTION int differs(float a, float b) {
  if (a != a && b != b) return 0;
  return Kokkos::bit_cast<std::uint32_t>(a) != Kokkos::bit_cast<std::uint32_t>(b);
}

constexpr long long patterns = 1LL << 32;

// The library's gates and the formulas they stand for (the latter on devices only: __expf).
struct Logistic {
  KOKKOS_FUNCTION float operator()(float x) const { return paraseq::detail::logistic(x); }
};
struct LogisticByExpf {
  KOKKOS_FUNCTION float operator()(float x) const {
    KOKKOS_IF_ON_DEVICE((return __fdividef(1.0f, 1.0f + __expf(-x));))
    KOKKOS_IF_ON_HOST((Kokkos::abort("paraseq_cell_math_bits: device only"); return x;))
  }
};
struct Tanh {
  KOKKOS_FUNCTION float operator()(float x) const { return paraseq::detail::tanh(x); }
};
struct TanhByExpf {
  KOKKOS_FUNCTION float operator()(float x) const {
    KOKKOS_IF_ON_DEVICE((return 1.0f - __fdividef(2.0f, 1.0f + __expf(2.0f * x));))
    KOKKOS_IF_ON_HOST((Kokkos::abort("paraseq_cell_math_bits: device only"); return x;))
  }
};

// The inputs where Gate and Reference differ, over every float x.
template <class Gate, class Reference>
long long mismatches(const char* label) {
  long long count = 0;
  Kokkos::parallel_reduce(
      label, Kokkos::RangePolicy<Kokkos::Cuda, Kokkos::IndexType<long long>>(0, patterns),
      KOKKOS_LAMBDA(long long bits, long long& sum) {
        const float x = Kokkos::bit_cast<float>(std::uint32_t(bits));
        sum += differs(Gate{}(x), Reference{}(x));
      },
      count);
  return count;
}

} // namespace

int main(int argc, char* argv[]) {
  Kokkos::ScopeGuard kokkos(argc, argv);
  const long long logistic = mismatches<Logistic, LogisticByExpf>("paraseq::cell_math_bits::logistic");
  const long long tanh = mismatches<Tanh, TanhByExpf>("paraseq::cell_math_bits::tanh");
  std::printf("{\"inputs\": %lld, \"logistic_mismatches\": %lld, \"tanh_mismatches\": %lld}\n", patterns, logistic,
              tanh);
  return logistic == 0 && tanh == 0 ? 0 : 1;
}
