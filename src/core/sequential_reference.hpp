#pragma once
// The plain sequential recurrences in double precision on the host: the reference every parallel
// result is tested against. Inputs are host-accessible Views with the shapes of linear_scan.hpp.

#include <paraseq/core/linear_scan.hpp>

#include <Kokkos_Core.hpp>

namespace paraseq::reference {

using HostArray3 = Kokkos::View<double***, Kokkos::LayoutRight, Kokkos::HostSpace>;

// h_t = A_t h_{t-1} + b_t with h_{-1} = h0 (pass ZeroInitialState{} for zero).
template <class Structure, class AView, class BView, class H0View = ZeroInitialState>
HostArray3 linear_recurrence(Structure, const AView& A, const BView& b, const H0View& h0 = {}) {
  const int B = int(b.extent(0)), T = int(b.extent(1)), N = int(b.extent(2));
  const int d = group_size<Structure>(N);
  HostArray3 h("reference_h", B, T, N);
  for (int batch = 0; batch < B; ++batch)
    for (int g = 0; g < group_count<Structure>(N); ++g)
      for (int t = 0; t < T; ++t)
        for (int i = 0; i < d; ++i) {
          double sum = double(b(batch, t, g * d + i));
          for (int j = 0; j < d; ++j) {
            double previous = 0;
            if (t > 0) previous = h(batch, t - 1, g * d + j);
            else if constexpr (!std::is_same_v<H0View, ZeroInitialState>) previous = double(h0(batch, g * d + j));
            sum += double(detail::a_entry<Structure>(A, batch, t, g, i, j)) * previous;
          }
          h(batch, t, g * d + i) = sum;
        }
  return h;
}

// lambda_t = A_{t+1}^T lambda_{t+1} + g_t with lambda_{T-1} = g_{T-1}.
template <class Structure, class AView, class GView>
HostArray3 adjoint_recurrence(Structure, const AView& A, const GView& g_in) {
  const int B = int(g_in.extent(0)), T = int(g_in.extent(1)), N = int(g_in.extent(2));
  const int d = group_size<Structure>(N);
  HostArray3 lambda("reference_lambda", B, T, N);
  for (int batch = 0; batch < B; ++batch)
    for (int g = 0; g < group_count<Structure>(N); ++g)
      for (int t = T - 1; t >= 0; --t)
        for (int i = 0; i < d; ++i) {
          double sum = double(g_in(batch, t, g * d + i));
          if (t + 1 < T)
            for (int j = 0; j < d; ++j)
              sum += double(detail::a_entry<Structure>(A, batch, t + 1, g, j, i)) * lambda(batch, t + 1, g * d + j);
          lambda(batch, t, g * d + i) = sum;
        }
  return lambda;
}

} // namespace paraseq::reference
