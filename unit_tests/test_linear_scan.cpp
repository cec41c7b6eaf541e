// The ordered linear-recurrence scan against the sequential float64 reference, on every enabled
// execution space and across the decompositions the planner can choose.

#include <paraseq/core/linear_scan.hpp>
#include <paraseq/core/sequential_reference.hpp>

#include "test_support.hpp"

#include <gmock/gmock.h>

#include <vector>

namespace {

using namespace paraseq;
using namespace paraseq::test;
using ::testing::AllOf;
using ::testing::HasSubstr;

template <class Space>
class LinearScan : public ::testing::Test {};
TYPED_TEST_SUITE(LinearScan, ExecutionSpaces, SpaceName);

// Decompositions to cover: the automatic plan, the sequential loop, time chunks with one thread per
// team, windows of several sub-chunks (where the space allows teams of more than one thread), and
// time chunks found in two passes and in one (chunks of one window, chained by the look-back; with
// chunks of a few steps, hundreds of chunks in dozens of segments).
// At most `max_team_chunks` sub-chunks: a Dense map (up to 32 x 33 values, 8.4 KiB in double) per
// sub-chunk leaves room for 3 in OpenMP's 32 KiB of team scratch.
template <class Space>
std::vector<ScanConfig> decompositions(int max_team_chunks = 4) {
  const int team = std::min(max_team_chunks, Kokkos::TeamPolicy<Space>(Space{}, 1, 1).team_size_max(
                                   KOKKOS_LAMBDA(const typename Kokkos::TeamPolicy<Space>::member_type&) {}, Kokkos::ParallelForTag{}));
  constexpr auto two = TimeSplit::two_pass, one = TimeSplit::single_pass;
  std::vector<ScanConfig> configs{ScanConfig{},          sequential_scan_config, ScanConfig{1, 5, 7, two},
                                  ScanConfig{1, 3, 2, two}, ScanConfig{1, 5, 7, one}, ScanConfig{1, 64, 2, one}};
  for (int p = 2; p <= team; p *= 2) {
    configs.push_back(ScanConfig{p, 3, 1});
    configs.push_back(ScanConfig{p, 4, 3, two});
    configs.push_back(ScanConfig{p, 4, 3, one});
  }
  if (team >= 3) { // the scan of the sub-chunk maps with a count that is not a power of two
    configs.push_back(ScanConfig{3, 5, 1});
    configs.push_back(ScanConfig{3, 2, 4, one});
  }
  return configs;
}

std::string describe(const ScanConfig& c) {
  return "team_chunks=" + std::to_string(c.team_chunks) + " chunk_length=" + std::to_string(c.chunk_length) +
         " time_chunks=" + std::to_string(c.time_chunks) + " time_split=" + std::to_string(int(c.time_split));
}

// Random A with long memory and order-dependent products: (1 - rho) I plus off-diagonal noise,
// with every row's absolute sum below 1 so the recurrence is contractive.
template <class View>
void fill_contractive(const View& A, int group, unsigned seed, double rho = 0.05) {
  fill_uniform(A, -rho / (2 * group), rho / (2 * group), seed);
  auto host = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, A);
  auto* data = host.data();
  const std::size_t block = std::size_t(group) * group;
  for (std::size_t e = 0; e < host.span(); e += block)
    for (int i = 0; i < group; ++i) data[e + i * group + i] += 1 - rho;
  Kokkos::deep_copy(A, host);
}

template <class Space, class T, class Structure, class AView>
void expect_matches_reference(Structure structure, const AView& A, int B, int T_steps, int N, double tolerance,
                              const std::vector<ScanConfig>& configs) {
  View3<T, Space> b("b", B, T_steps, N), h("h", B, T_steps, N), g("g", B, T_steps, N), lambda("lambda", B, T_steps, N);
  fill_uniform(b, -1, 1, 11);
  fill_uniform(g, -1, 1, 12);
  const auto A_host = to_host(A);
  const auto h_ref = reference::linear_recurrence(structure, A_host, to_host(b));
  const auto lambda_ref = reference::adjoint_recurrence(structure, A_host, to_host(g));
  for (const ScanConfig& config : configs) {
    SCOPED_TRACE(describe(config));
    Kokkos::deep_copy(h, T(NAN));
    linear_scan<double>(Space{}, structure, A, b, h, config);
    EXPECT_LE(max_relative_error(h, h_ref), tolerance);
    Kokkos::deep_copy(lambda, T(NAN));
    linear_scan_reverse<double>(Space{}, structure, A, g, lambda, config);
    EXPECT_LE(max_relative_error(lambda, lambda_ref), tolerance);
  }
}

TYPED_TEST(LinearScan, DiagonalMatchesSequentialReferenceInDouble) {
  using Space = TypeParam;
  View3<double, Space> A("A", 3, 1000, 37);
  fill_uniform(A, 0.97, 1.0, 1);
  expect_matches_reference<Space, double>(Diagonal{}, A, 3, 1000, 37, 1e-12, decompositions<Space>());
}

TYPED_TEST(LinearScan, BlockDiagonalMatchesSequentialReferenceInDouble) {
  using Space = TypeParam;
  View5<double, Space> A2("A2", 2, 777, 5, 2, 2);
  fill_contractive(A2, 2, 2);
  expect_matches_reference<Space, double>(BlockDiagonal<2>{}, A2, 2, 777, 10, 1e-12, decompositions<Space>());
  View5<double, Space> A3("A3", 2, 500, 2, 3, 3);
  fill_contractive(A3, 3, 3);
  expect_matches_reference<Space, double>(BlockDiagonal<3>{}, A3, 2, 500, 6, 1e-12, decompositions<Space>());
  View5<double, Space> A4("A4", 1, 613, 3, 4, 4);
  fill_contractive(A4, 4, 4);
  expect_matches_reference<Space, double>(BlockDiagonal<4>{}, A4, 1, 613, 12, 1e-12, decompositions<Space>());
}

TYPED_TEST(LinearScan, DenseMatchesSequentialReferenceInDouble) {
  using Space = TypeParam;
  View4<double, Space> A("A", 2, 300, 8, 8);
  fill_contractive(A, 8, 5);
  expect_matches_reference<Space, double>(Dense{}, A, 2, 300, 8, 1e-12, decompositions<Space>(3));
  View4<double, Space> A32("A32", 1, 64, 32, 32);
  fill_contractive(A32, 32, 6);
  expect_matches_reference<Space, double>(Dense{}, A32, 1, 64, 32, 1e-12, {ScanConfig{}, ScanConfig{1, 5, 4}});
}

// A dense A whose bound is declared smaller than 32: the same recurrence with maps sized for it,
// and a wider state is an error that names the bound.
TYPED_TEST(LinearScan, DenseUpToABoundMatchesSequentialReference) {
  using Space = TypeParam;
  for (int N : {3, 5}) {
    SCOPED_TRACE("N=" + std::to_string(N));
    View4<double, Space> A("A", 2, 200, N, N);
    fill_contractive(A, N, 20 + N);
    expect_matches_reference<Space, double>(DenseUpTo<5>{}, A, 2, 200, N, 1e-12, decompositions<Space>(2));
  }
  View4<double, Space> A6("A6", 1, 4, 6, 6);
  View3<double, Space> b6("b6", 1, 4, 6), h6("h6", 1, 4, 6);
  EXPECT_THAT(thrown_message([&] { linear_scan(Space{}, DenseUpTo<5>{}, A6, b6, h6); }),
              HasSubstr("a state size N <= 5 for a DenseUpTo<5> A"));
}

TYPED_TEST(LinearScan, FloatWithContractiveOperatorsMatchesToSinglePrecision) {
  using Space = TypeParam;
  const int T_steps = 10000;
  View3<float, Space> A("A", 2, T_steps, 5);
  fill_uniform(A, 0.9f, 0.999f, 7);
  expect_matches_reference<Space, float>(Diagonal{}, A, 2, T_steps, 5, 1e-5, decompositions<Space>());
  View5<float, Space> A4("A4", 1, T_steps, 2, 4, 4);
  fill_contractive(A4, 4, 8);
  expect_matches_reference<Space, float>(BlockDiagonal<4>{}, A4, 1, T_steps, 8, 1e-5, {ScanConfig{}, ScanConfig{1, 64, 9}});
  View4<float, Space> A8("A8", 1, 2000, 8, 8);
  fill_contractive(A8, 8, 9);
  // Accumulated in double, a float scan is not a compiled instance: a bound of 8 keeps its kernels small.
  expect_matches_reference<Space, float>(DenseUpTo<8>{}, A8, 1, 2000, 8, 1e-5, {ScanConfig{}, ScanConfig{1, 16, 5}});
}

TYPED_TEST(LinearScan, EdgeShapes) {
  using Space = TypeParam;
  for (int T_steps : {1, 2, 31, 33, 257}) { // one step, and lengths not a multiple of any chunk
    SCOPED_TRACE("T=" + std::to_string(T_steps));
    View5<double, Space> A("A", 2, T_steps, 3, 2, 2);
    fill_contractive(A, 2, 21);
    expect_matches_reference<Space, double>(BlockDiagonal<2>{}, A, 2, T_steps, 6, 1e-12, decompositions<Space>());
  }
  View3<double, Space> A1("A1", 1, 50, 1); // B = 1, N = 1
  fill_uniform(A1, -1, 1, 22);
  expect_matches_reference<Space, double>(Diagonal{}, A1, 1, 50, 1, 1e-12, decompositions<Space>());
}

TYPED_TEST(LinearScan, MillionStepDiagonal) {
  using Space = TypeParam;
  const int T_steps = 1000000;
  View3<double, Space> A("A", 1, T_steps, 2);
  fill_uniform(A, 0.999, 1.0, 31);
  expect_matches_reference<Space, double>(Diagonal{}, A, 1, T_steps, 2, 1e-12,
                                          {ScanConfig{}, ScanConfig{1, 0, 16}, ScanConfig{0, 0, 16, TimeSplit::single_pass}});
}

// The documented choice between two passes and one: one pass only where time is split, and then
// where asked for, or by default on devices whose windows are staged through team scratch (fewer
// than 8 groups per team); its chunks are then windows of P x L steps.
TYPED_TEST(LinearScan, TimeSplitFollowsTheDocumentedRule) {
  using Space = TypeParam;
  constexpr auto one = TimeSplit::single_pass, two = TimeSplit::two_pass;
  const ScanShape long_sequence{1, 1 << 20, 1, 1}, many_channels{1, 1 << 18, 256, 1};
  const ScanPlan automatic = plan_scan<Diagonal, float>(Space{}, long_sequence);
  const bool staged = paraseq::detail::stages_windows<Diagonal, Space>(automatic);
  EXPECT_EQ(automatic.single_pass, automatic.time_chunks > 1 && !runs_on_host<Space> && staged);
  EXPECT_FALSE((plan_scan<Diagonal, float>(Space{}, many_channels).single_pass));
  EXPECT_FALSE((plan_scan<Diagonal, float>(Space{}, long_sequence, ScanConfig{0, 0, 4, two}).single_pass));
  EXPECT_FALSE((plan_scan<Diagonal, float>(Space{}, long_sequence, ScanConfig{0, 0, 1, one}).single_pass));
  for (const ScanConfig config : {ScanConfig{0, 0, 0, one}, ScanConfig{2, 8, 3, one}}) {
    const ScanPlan plan = plan_scan<Diagonal, float>(Space{}, long_sequence, config);
    ASSERT_EQ(plan.single_pass, config.time_chunks > 1 || automatic.time_chunks > 1);
    if (!plan.single_pass) continue;
    EXPECT_EQ(plan.chunk_steps, plan.team_chunks * plan.chunk_length);
    EXPECT_EQ(plan.time_chunks, (long_sequence.steps + plan.chunk_steps - 1) / plan.chunk_steps);
  }
}

TYPED_TEST(LinearScan, EmptyBatchAndEmptySequenceWriteNothing) {
  using Space = TypeParam;
  View3<double, Space> A0("A", 0, 10, 4), b0("b", 0, 10, 4), h0("h", 0, 10, 4);
  EXPECT_NO_THROW(linear_scan(Space{}, Diagonal{}, A0, b0, h0));
  View3<double, Space> A("A", 2, 0, 4), b("b", 2, 0, 4), h("h", 2, 0, 4);
  EXPECT_NO_THROW(linear_scan_reverse(Space{}, Diagonal{}, A, b, h));
}

TYPED_TEST(LinearScan, InitialStateIsTheStateBeforeStepZero) {
  using Space = TypeParam;
  const int B = 3, T_steps = 400, N = 6;
  View5<double, Space> A("A", B, T_steps, N / 3, 3, 3);
  fill_contractive(A, 3, 41);
  View3<double, Space> b("b", B, T_steps, N), h("h", B, T_steps, N);
  View2<double, Space> start("h0", B, N);
  fill_uniform(b, -1, 1, 42);
  fill_uniform(start, -5, 5, 43);
  const auto ref = reference::linear_recurrence(BlockDiagonal<3>{}, to_host(A), to_host(b), to_host(start));
  for (const ScanConfig& config : decompositions<Space>()) {
    SCOPED_TRACE(describe(config));
    Kokkos::deep_copy(h, NAN);
    linear_scan(Space{}, BlockDiagonal<3>{}, A, b, h, start, config);
    EXPECT_LE(max_relative_error(h, ref), 1e-12);
  }
}

// <lambda, b> = <g, h>: the reverse scan is the transpose of the forward one.
TYPED_TEST(LinearScan, AdjointIdentity) {
  using Space = TypeParam;
  const int B = 2, T_steps = 999, N = 8;
  View4<double, Space> A("A", B, T_steps, N, N);
  fill_contractive(A, N, 51);
  View3<double, Space> b("b", B, T_steps, N), g("g", B, T_steps, N), h("h", B, T_steps, N), lambda("l", B, T_steps, N);
  fill_uniform(b, -1, 1, 52);
  fill_uniform(g, -1, 1, 53);
  for (const ScanConfig& config : decompositions<Space>(3)) {
    SCOPED_TRACE(describe(config));
    linear_scan(Space{}, Dense{}, A, b, h, config);
    linear_scan_reverse(Space{}, Dense{}, A, g, lambda, config);
    auto hb = to_host(b), hg = to_host(g), hh = to_host(h), hl = to_host(lambda);
    double lambda_b = 0, g_h = 0, scale = 0;
    for (std::size_t i = 0; i < hb.span(); ++i) {
      lambda_b += hl.data()[i] * hb.data()[i];
      g_h += hg.data()[i] * hh.data()[i];
      scale += std::fabs(hl.data()[i] * hb.data()[i]);
    }
    EXPECT_LE(std::fabs(lambda_b - g_h), 1e-12 * scale);
  }
}

TYPED_TEST(LinearScan, RepeatedRunsAreBitwiseEqual) {
  using Space = TypeParam;
  View3<float, Space> A("A", 4, 5000, 33), b("b", 4, 5000, 33), h1("h1", 4, 5000, 33), h2("h2", 4, 5000, 33);
  fill_uniform(A, -1, 1, 61);
  fill_uniform(b, -1, 1, 62);
  for (const ScanConfig& config : decompositions<Space>()) {
    linear_scan(Space{}, Diagonal{}, A, b, h1, config);
    linear_scan(Space{}, Diagonal{}, A, b, h2, config);
    EXPECT_TRUE(bitwise_equal(h1, h2)) << describe(config);
  }
}

TYPED_TEST(LinearScan, NonFiniteInputsOnlyReachDependentOutputs) {
  using Space = TypeParam;
  const int B = 2, T_steps = 600, N = 4, bad_t = 350;
  View5<double, Space> A("A", B, T_steps, N / 2, 2, 2);
  fill_contractive(A, 2, 71);
  View3<double, Space> b("b", B, T_steps, N), h("h", B, T_steps, N);
  fill_uniform(b, -1, 1, 72);
  auto hb = to_host(b);
  hb(1, bad_t, 3) = NAN; // batch 1, second block
  Kokkos::deep_copy(b, hb);
  for (const ScanConfig& config : decompositions<Space>()) {
    SCOPED_TRACE(describe(config));
    linear_scan(Space{}, BlockDiagonal<2>{}, A, b, h, config);
    auto out = to_host(h);
    for (int batch = 0; batch < B; ++batch)
      for (int t = 0; t < T_steps; ++t)
        for (int n = 0; n < N; ++n) {
          // Channel 3 is hit at bad_t; channel 2 of the same block reads it one step later.
          const bool depends = batch == 1 && ((n == 3 && t >= bad_t) || (n == 2 && t > bad_t));
          ASSERT_EQ(std::isfinite(out(batch, t, n)), !depends) << "batch " << batch << " t " << t << " n " << n;
        }
  }
}

template <class Fn>
std::string thrown_message(Fn&& fn) {
  try {
    fn();
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  return "(nothing thrown)";
}

TYPED_TEST(LinearScan, BadShapesNameTheArgumentAndTheShapes) {
  using Space = TypeParam;
  View3<double, Space> A("A", 2, 10, 4), b("b", 2, 10, 4), h("h", 2, 10, 4), h_short("h", 2, 9, 4);
  EXPECT_THAT(thrown_message([&] { linear_scan(Space{}, Diagonal{}, A, b, h_short); }),
              AllOf(HasSubstr("'h'"), HasSubstr("[2, 9, 4]"), HasSubstr("[2, 10, 4]")));
  View3<double, Space> A_wrong("A", 2, 10, 5);
  EXPECT_THAT(thrown_message([&] { linear_scan(Space{}, Diagonal{}, A_wrong, b, h); }),
              AllOf(HasSubstr("'A'"), HasSubstr("[2, 10, 5]"), HasSubstr("[2, 10, 4]")));
  View2<double, Space> h0_wrong("h0", 3, 4);
  EXPECT_THAT(thrown_message([&] { linear_scan(Space{}, Diagonal{}, A, b, h, h0_wrong); }),
              AllOf(HasSubstr("'h0'"), HasSubstr("[3, 4]"), HasSubstr("[2, 4]")));

  View3<double, Space> b5("b", 2, 10, 5), h5("h", 2, 10, 5);
  View5<double, Space> A_block("A", 2, 10, 2, 2, 2);
  EXPECT_THAT(thrown_message([&] { linear_scan(Space{}, BlockDiagonal<2>{}, A_block, b5, h5); }),
              AllOf(HasSubstr("'b'"), HasSubstr("[2, 10, 5]"), HasSubstr("divisible by the block size K = 2")));

  View3<double, Space> b33("b", 1, 3, 33), h33("h", 1, 3, 33);
  View4<double, Space> A33("A", 1, 3, 33, 33);
  EXPECT_THAT(thrown_message([&] { linear_scan(Space{}, Dense{}, A33, b33, h33); }),
              AllOf(HasSubstr("'b'"), HasSubstr("[1, 3, 33]"), HasSubstr("N <= 32")));
  View4<double, Space> A_dense("A", 2, 10, 4, 3);
  EXPECT_THAT(thrown_message([&] { linear_scan_reverse(Space{}, Dense{}, A_dense, b, h); }),
              AllOf(HasSubstr("linear_scan_reverse"), HasSubstr("'A'"), HasSubstr("[2, 10, 4, 3]")));
}

// A requested P whose maps do not fit the space's team scratch (64 Dense maps in double: 540 KiB,
// beyond every backend) is an error that says so, not a failed launch.
TYPED_TEST(LinearScan, SubChunksBeyondTheTeamScratchAreAnError) {
  using Space = TypeParam;
  View4<double, Space> A("A", 1, 64, 32, 32);
  View3<double, Space> b("b", 1, 64, 32), h("h", 1, 64, 32);
  EXPECT_THAT(thrown_message([&] { linear_scan(Space{}, Dense{}, A, b, h, ScanConfig{64, 0, 1}); }),
              AllOf(HasSubstr("ScanConfig::team_chunks = 64"), HasSubstr("bytes of team scratch")));
}

} // namespace
