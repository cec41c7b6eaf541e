#pragma once
// Explicit Runge–Kutta methods as constexpr Butcher tableaus:
//
//   Y_i = y + h sum_{j<i} a_ij K_j,   K_i = f(t + c_i h, Y_i),   y_next = y + h sum_i b_i K_i
//
// with, for the embedded pairs, a second set of weights b_hat whose result has order
// embedded_order; y_next - y_hat = h sum_i (b_i - b_hat_i) K_i estimates the local error.
// FSAL ("first same as last") methods evaluate their last stage at y_next, so it is the next
// step's first stage: a step costs stages - 1 new evaluations.
//
// Methods with dense output give weights w_i(theta) such that y(t + theta h) is approximated by
// y + h sum_i w_i(theta) K_i over the step's own stages, with w_i(1) = b_i.
//
// Every tableau is checked at compile time: strictly lower triangular a, row sums equal c, the
// order conditions up to min(order, 4) for b and b_hat (weights sum to 1 among them), the FSAL
// conditions, and w_i(0) = 0, w_i(1) = b_i for the dense output.

#include <Kokkos_Core.hpp>

namespace paraseq::ode {

// Forward Euler: order 1, fixed steps only.
struct Euler {
  static constexpr const char* name = "euler";
  static constexpr int stages = 1, order = 1, embedded_order = 0;
  static constexpr bool fsal = false, has_dense_output = false;
  static constexpr double c[stages] = {0};
  static constexpr double a[stages][stages] = {{0}};
  static constexpr double b[stages] = {1};
  static constexpr double b_hat[stages] = {0};
};

// Heun's method (explicit trapezoid), order 2, with embedded Euler (order 1) for adaptive steps.
// Dense output: its natural continuous extension, of order 2.
struct Heun {
  static constexpr const char* name = "heun";
  static constexpr int stages = 2, order = 2, embedded_order = 1;
  static constexpr bool fsal = false, has_dense_output = true;
  static constexpr double c[stages] = {0, 1};
  static constexpr double a[stages][stages] = {{0, 0}, {1, 0}};
  static constexpr double b[stages] = {0.5, 0.5};
  static constexpr double b_hat[stages] = {1, 0};

  template <class T>
  KOKKOS_INLINE_FUNCTION static constexpr void dense_weights(T theta, T* w) {
    w[0] = theta - theta * theta / 2;
    w[1] = theta * theta / 2;
  }
};

// The classic fourth-order method, fixed steps only.
struct RK4 {
  static constexpr const char* name = "rk4";
  static constexpr int stages = 4, order = 4, embedded_order = 0;
  static constexpr bool fsal = false, has_dense_output = false;
  static constexpr double c[stages] = {0, 0.5, 0.5, 1};
  static constexpr double a[stages][stages] = {{0, 0, 0, 0}, {0.5, 0, 0, 0}, {0, 0.5, 0, 0}, {0, 0, 1, 0}};
  static constexpr double b[stages] = {1.0 / 6, 1.0 / 3, 1.0 / 3, 1.0 / 6};
  static constexpr double b_hat[stages] = {0, 0, 0, 0};
};

// Bogacki–Shampine 3(2), FSAL; its dense output is the cubic Hermite interpolant between
// (y, K_0) and (y_next, K_3 = f(t + h, y_next)), written as weights over the stages.
struct BogackiShampine3 {
  static constexpr const char* name = "bosh3";
  static constexpr int stages = 4, order = 3, embedded_order = 2;
  static constexpr bool fsal = true, has_dense_output = true;
  static constexpr double c[stages] = {0, 0.5, 0.75, 1};
  static constexpr double a[stages][stages] = {
      {0, 0, 0, 0}, {0.5, 0, 0, 0}, {0, 0.75, 0, 0}, {2.0 / 9, 1.0 / 3, 4.0 / 9, 0}};
  static constexpr double b[stages] = {2.0 / 9, 1.0 / 3, 4.0 / 9, 0};
  static constexpr double b_hat[stages] = {7.0 / 24, 0.25, 1.0 / 3, 0.125};

  template <class T>
  KOKKOS_INLINE_FUNCTION static constexpr void dense_weights(T x, T* w) {
    w[0] = x * (T(1) + x * (T(-4.0 / 3) + x * T(5.0 / 9)));
    w[1] = x * x * (T(1) + x * T(-2.0 / 3));
    w[2] = x * x * (T(4.0 / 3) + x * T(-8.0 / 9));
    w[3] = x * x * (T(-1) + x);
  }
};

// Dormand–Prince 5(4), FSAL, with Shampine's (1986) fourth-order dense output.
struct DormandPrince5 {
  static constexpr const char* name = "dopri5";
  static constexpr int stages = 7, order = 5, embedded_order = 4;
  static constexpr bool fsal = true, has_dense_output = true;
  static constexpr double c[stages] = {0, 0.2, 0.3, 0.8, 8.0 / 9, 1, 1};
  static constexpr double a[stages][stages] = {
      {0, 0, 0, 0, 0, 0, 0},
      {0.2, 0, 0, 0, 0, 0, 0},
      {3.0 / 40, 9.0 / 40, 0, 0, 0, 0, 0},
      {44.0 / 45, -56.0 / 15, 32.0 / 9, 0, 0, 0, 0},
      {19372.0 / 6561, -25360.0 / 2187, 64448.0 / 6561, -212.0 / 729, 0, 0, 0},
      {9017.0 / 3168, -355.0 / 33, 46732.0 / 5247, 49.0 / 176, -5103.0 / 18656, 0, 0},
      {35.0 / 384, 0, 500.0 / 1113, 125.0 / 192, -2187.0 / 6784, 11.0 / 84, 0}};
  static constexpr double b[stages] = {35.0 / 384, 0, 500.0 / 1113, 125.0 / 192, -2187.0 / 6784, 11.0 / 84, 0};
  static constexpr double b_hat[stages] = {5179.0 / 57600,   0, 7571.0 / 16695, 393.0 / 640,
                                           -92097.0 / 339200, 187.0 / 2100, 1.0 / 40};

  // w_i(theta) = sum_k P_ik theta^(k+1), Horner form.
  template <class T>
  KOKKOS_INLINE_FUNCTION static constexpr void dense_weights(T x, T* w) {
    w[0] = x * (T(1) + x * (T(-8048581381.0 / 2820520608) +
                            x * (T(8663915743.0 / 2820520608) + x * T(-12715105075.0 / 11282082432))));
    w[1] = T(0);
    w[2] = x * x *
           (T(131558114200.0 / 32700410799) + x * (T(-68118460800.0 / 10900136933) + x * T(87487479700.0 / 32700410799)));
    w[3] = x * x *
           (T(-1754552775.0 / 470086768) + x * (T(14199869525.0 / 1410260304) + x * T(-10690763975.0 / 1880347072)));
    w[4] = x * x *
           (T(127303824393.0 / 49829197408) +
            x * (T(-318862633887.0 / 49829197408) + x * T(701980252875.0 / 199316789632)));
    w[5] = x * x * (T(-282668133.0 / 205662961) + x * (T(2019193451.0 / 616988883) + x * T(-1453857185.0 / 822651844)));
    w[6] = x * x * (T(40617522.0 / 29380423) + x * (T(-110615467.0 / 29380423) + x * T(69997945.0 / 29380423)));
  }
};

// Tsitouras 5(4) (2011), FSAL, with its fourth-order dense output.
struct Tsit5 {
  static constexpr const char* name = "tsit5";
  static constexpr int stages = 7, order = 5, embedded_order = 4;
  static constexpr bool fsal = true, has_dense_output = true;
  static constexpr double c[stages] = {0, 0.161, 0.327, 0.9, 0.98002554090450968572981028628702459549, 1, 1};
  static constexpr double a[stages][stages] = {
      {0, 0, 0, 0, 0, 0, 0},
      {0.161, 0, 0, 0, 0, 0, 0},
      {-0.0084806554923569885444268742502307746751, 0.33548065549235698854442687425023077468, 0, 0, 0, 0, 0},
      {2.8971530571054934321304325941929387649, -6.3594484899750748431481599123838256260,
       4.3622954328695814110177273181908868610, 0, 0, 0, 0},
      {5.3258648284392566044288779208405113178, -11.748883564062827877747170339785772962,
       7.4955393428898362083046047845643581557, -0.092495066361755249256502079332071916113, 0, 0, 0},
      {5.8614554429464200286592514869826478904, -12.920969317847109291706118681783359395,
       8.1593678985761586431804007945392534852, -0.071584973281400997224530542525829738691,
       -0.028269050394068382909003057212712241467, 0, 0},
      {0.096460766818065229518167313165128763337, 0.01, 0.47988965041449957477524953229059651991,
       1.3790085741037418931922748218568727708, -3.2900695154360806799010475857113638501,
       2.3247105240997739824153559183987657961, 0}};
  static constexpr double b[stages] = {0.096460766818065229518167313165128763337, 0.01,
                                       0.47988965041449957477524953229059651991, 1.3790085741037418931922748218568727708,
                                       -3.2900695154360806799010475857113638501, 2.3247105240997739824153559183987657961,
                                       0};
  static constexpr double b_hat[stages] = {0.094680755765839458074788762557589228561,
                                           0.0091835655403432530967763639366453137598,
                                           0.48777052842476157078556425996312282415,
                                           1.2342975669304789856551096738842376540,
                                           -2.7077123499835254548811099750593216707,
                                           1.8666284181705870357537193995662114987,
                                           1.0 / 66};

  template <class T>
  KOKKOS_INLINE_FUNCTION static constexpr void dense_weights(T x, T* w) {
    const T x2 = x * x;
    w[0] = T(-1.0530884977290216) * x * (x - T(1.3299890189751412)) *
           (x2 - T(1.4364028541716351) * x + T(0.7139816917074209));
    w[1] = T(0.1017) * x2 * (x2 - T(2.1966568338249754) * x + T(1.2949852507374631));
    w[2] = T(2.490627285651252793) * x2 * (x2 - T(2.38535645472061657) * x + T(1.57803468208092486));
    w[3] = T(-16.54810288924490272) * (x - T(1.21712927295533244)) * (x - T(0.61620406037800089)) * x2;
    w[4] = T(47.37952196281928122) * (x - T(1.203071208372362603)) * (x - T(0.658047292653547382)) * x2;
    w[5] = T(-34.87065786149660974) * (x - T(1.2)) * (x - T(0.666666666666666667)) * x2;
    w[6] = T(2.5) * (x - T(1)) * (x - T(0.6)) * x2;
  }
};

template <class M>
inline constexpr bool is_method_v = false;
template <>
inline constexpr bool is_method_v<Euler> = true;
template <>
inline constexpr bool is_method_v<Heun> = true;
template <>
inline constexpr bool is_method_v<RK4> = true;
template <>
inline constexpr bool is_method_v<BogackiShampine3> = true;
template <>
inline constexpr bool is_method_v<DormandPrince5> = true;
template <>
inline constexpr bool is_method_v<Tsit5> = true;

// Methods that can take adaptive steps: an embedded error estimate and dense output.
template <class M>
inline constexpr bool is_adaptive_method_v = M::embedded_order > 0 && M::has_dense_output;

namespace detail::tableau_checks {

// Decimal tableaus (Tsit5) hold their identities to about 1e-15; exact ones to rounding.
inline constexpr double tolerance = 1e-12;

constexpr bool near(double x, double y) { return (x > y ? x - y : y - x) <= tolerance; }

template <class M>
consteval bool strictly_lower_triangular() {
  for (int i = 0; i < M::stages; ++i)
    for (int j = i; j < M::stages; ++j)
      if (M::a[i][j] != 0) return false;
  return true;
}

template <class M>
consteval bool rows_sum_to_c() {
  for (int i = 0; i < M::stages; ++i) {
    double sum = 0;
    for (int j = 0; j < M::stages; ++j) sum += M::a[i][j];
    if (!near(sum, M::c[i])) return false;
  }
  return M::c[0] == 0;
}

// The eight rooted-tree conditions up to order 4 for weights w, checked up to `order`.
template <class M>
consteval bool order_conditions(const double (&w)[M::stages], int order) {
  constexpr int s = M::stages;
  double ac[s] = {}, ac2[s] = {}, aac[s] = {};
  for (int i = 0; i < s; ++i)
    for (int j = 0; j < s; ++j) {
      ac[i] += M::a[i][j] * M::c[j];
      ac2[i] += M::a[i][j] * M::c[j] * M::c[j];
    }
  for (int i = 0; i < s; ++i)
    for (int j = 0; j < s; ++j) aac[i] += M::a[i][j] * ac[j];
  double sums[8] = {};
  for (int i = 0; i < s; ++i) {
    const double c = M::c[i];
    const double terms[8] = {1, c, c * c, ac[i], c * c * c, c * ac[i], ac2[i], aac[i]};
    for (int k = 0; k < 8; ++k) sums[k] += w[i] * terms[k];
  }
  constexpr double expected[8] = {1, 1.0 / 2, 1.0 / 3, 1.0 / 6, 1.0 / 4, 1.0 / 8, 1.0 / 12, 1.0 / 24};
  constexpr int needed_order[8] = {1, 2, 3, 3, 4, 4, 4, 4};
  for (int k = 0; k < 8; ++k)
    if (needed_order[k] <= order && !near(sums[k], expected[k])) return false;
  return true;
}

template <class M>
consteval bool fsal_conditions() {
  if constexpr (!M::fsal) return true;
  else {
    constexpr int last = M::stages - 1;
    for (int j = 0; j < M::stages; ++j)
      if (M::a[last][j] != M::b[j]) return false;
    return M::c[last] == 1 && M::b[last] == 0;
  }
}

template <class M>
consteval bool dense_output_interpolates() {
  if constexpr (!M::has_dense_output) return true;
  else {
    double at_zero[M::stages] = {}, at_one[M::stages] = {};
    M::dense_weights(0.0, at_zero);
    M::dense_weights(1.0, at_one);
    for (int i = 0; i < M::stages; ++i)
      if (!near(at_zero[i], 0) || !near(at_one[i], M::b[i])) return false;
    return true;
  }
}

template <class M>
consteval bool valid() {
  return strictly_lower_triangular<M>() && rows_sum_to_c<M>() && order_conditions<M>(M::b, M::order) &&
         (M::embedded_order == 0 || order_conditions<M>(M::b_hat, M::embedded_order)) && fsal_conditions<M>() &&
         dense_output_interpolates<M>();
}

} // namespace detail::tableau_checks

static_assert(detail::tableau_checks::valid<Euler>(), "paraseq::ode::Euler: inconsistent tableau");
static_assert(detail::tableau_checks::valid<Heun>(), "paraseq::ode::Heun: inconsistent tableau");
static_assert(detail::tableau_checks::valid<RK4>(), "paraseq::ode::RK4: inconsistent tableau");
static_assert(detail::tableau_checks::valid<BogackiShampine3>(), "paraseq::ode::BogackiShampine3: inconsistent tableau");
static_assert(detail::tableau_checks::valid<DormandPrince5>(), "paraseq::ode::DormandPrince5: inconsistent tableau");
static_assert(detail::tableau_checks::valid<Tsit5>(), "paraseq::ode::Tsit5: inconsistent tableau");

} // namespace paraseq::ode
