// The ordered linear-recurrence scan against the sequential float64 reference, on every enabled
// execution space and across the decompositions the planner can choose (the block and dense
// structures: test_linear_scan_structures.cpp; float Views accumulated in double, which are not
// compiled instances: test_linear_scan_float.cpp).

#include <paraseq/core/linear_scan.hpp>
#include <paraseq/core/sequential_reference.hpp>

#include "linear_scan_checks.hpp"
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

TYPED_TEST(LinearScan, DiagonalMatchesSequentialReferenceInDouble) {
  using Space = TypeParam;
  View3<double, Space> A("A", 3, 1000, 37);
  fill_uniform(A, 0.97, 1.0, 1);
  expect_matches_reference<Space, double>(Diagonal{}, A, 3, 1000, 37, 1e-12, decompositions<Space>());
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

// More than 32 sub-chunks per team, where the space allows such teams (the sub-chunk maps are then
// scanned, scan_sub_chunks): one group per team and four (one of them past the last group), team
// sizes that are not a multiple of a GPU warp, in one pass, in two and in one time chunk;
// repeatable bit for bit.
TYPED_TEST(LinearScan, ManySubChunksPerTeamMatchTheReference) {
  using Space = TypeParam;
  const int team_max = team_size_limit<Space>();
  constexpr auto two = TimeSplit::two_pass, one = TimeSplit::single_pass;
  for (int channels : {1, 3}) {
    SCOPED_TRACE("channels=" + std::to_string(channels));
    const int lanes = channels == 1 ? 1 : 4; // a device plan's groups per team
    std::vector<ScanConfig> configs{ScanConfig{}};
    for (const ScanConfig& config : {ScanConfig{40, 5, 4, one}, ScanConfig{36, 4, 3, two}, ScanConfig{64, 3, 1}})
      if (config.team_chunks * lanes <= team_max) configs.push_back(config);
    View3<double, Space> A("A", 2, 7000, channels);
    fill_uniform(A, 0.97, 1.0, 41);
    expect_matches_reference<Space, double>(Diagonal{}, A, 2, 7000, channels, 1e-12, configs);
    View3<double, Space> b("b", 2, 7000, channels), h1("h1", 2, 7000, channels), h2("h2", 2, 7000, channels);
    fill_uniform(b, -1, 1, 42);
    for (const ScanConfig& config : configs) {
      linear_scan(Space{}, Diagonal{}, A, b, h1, config);
      linear_scan(Space{}, Diagonal{}, A, b, h2, config);
      EXPECT_TRUE(bitwise_equal(h1, h2)) << describe(config);
    }
  }
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
