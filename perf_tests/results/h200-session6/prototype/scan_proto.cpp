// Prototype (not part of paraseq): a one-pass diagonal scan of few long sequences with wide tiles:
// TPB threads x I steps per tile, a deterministic in-team Hillis-Steele scan of the thread maps,
// and a team-wide look-back that loads predecessor aggregates in parallel and applies them one by
// one from the nearest published state (bitwise reproducible). Compared in one run with the copy
// kernel and paraseq::linear_scan (two passes).
#include <paraseq/core/linear_scan.hpp>
#include <Kokkos_Core.hpp>
#include <cstdio>
#include <cmath>
#include <random>
#include <vector>
#include <algorithm>

using Space = Kokkos::DefaultExecutionSpace;
using Mem = Space::memory_space;
using V1 = Kokkos::View<float*, Mem>;
using V3 = Kokkos::View<float***, Kokkos::LayoutRight, Mem>;

template <int TPB, int I, int MinBlocks>
struct OnePass {
  V1 a, b, h;
  Kokkos::View<float*, Mem> agg;      // [C][2]
  Kokkos::View<float*, Mem> state;    // [C]
  Kokkos::View<int*, Mem> status;     // [1 + C]
  Kokkos::View<long*, Mem> stats;     // sum of look-back distances, max distance, polling rounds
  long T;
  int C;
  using policy_t = Kokkos::TeamPolicy<Space, Kokkos::LaunchBounds<TPB, MinBlocks>>;
  using member = typename policy_t::member_type;
  static constexpr int Tile = TPB * I;
  static constexpr int team_threads = TPB;
  KOKKOS_INLINE_FUNCTION static int pad(int i) { return i + i / 32; }
  static std::size_t scratch_bytes() { return sizeof(float) * (2 * (Tile + Tile / 32) + 4 * TPB + 2 * TPB + 4); }

  KOKKOS_FUNCTION void operator()(const member& team) const {
    const int tid = team.team_rank();
    int ticket = 0;
    if (tid == 0) ticket = Kokkos::atomic_fetch_add(&status(0), 1);
    team.team_broadcast(ticket, 0);
    const int tile = ticket;
    const long base = long(tile) * Tile;
    float* sa = (float*)team.team_shmem().get_shmem(sizeof(float) * (Tile + Tile / 32));
    float* sb = (float*)team.team_shmem().get_shmem(sizeof(float) * (Tile + Tile / 32));
    float* scan = (float*)team.team_shmem().get_shmem(sizeof(float) * 4 * TPB); // [2 buffers][TPB][2]
    float* look = (float*)team.team_shmem().get_shmem(sizeof(float) * 2 * TPB);
    float* shared = (float*)team.team_shmem().get_shmem(sizeof(float) * 4);
    // Coalesced loads; past the end the identity map.
    for (int k = 0; k < I; ++k) {
      const int i = k * TPB + tid;
      const long t = base + i;
      sa[pad(i)] = t < T ? a(t) : 1.f;
      sb[pad(i)] = t < T ? b(t) : 0.f;
    }
    team.team_barrier();
    float A = 1.f, B = 0.f;
    for (int k = 0; k < I; ++k) {
      const float ak = sa[pad(tid * I + k)], bk = sb[pad(tid * I + k)];
      A = ak * A;
      B = ak * B + bk;
    }
    // Inclusive in-team scan of the thread maps (fixed tree: deterministic).
    int cur = 0;
    scan[2 * tid] = A; scan[2 * tid + 1] = B;
    team.team_barrier();
    for (int off = 1; off < TPB; off *= 2) {
      const float* in = scan + cur * 2 * TPB;
      float* out = scan + (1 - cur) * 2 * TPB;
      float nA = in[2 * tid], nB = in[2 * tid + 1];
      if (tid >= off) {
        const float pA = in[2 * (tid - off)], pB = in[2 * (tid - off) + 1];
        nB = nA * pB + nB;
        nA = nA * pA;
      }
      out[2 * tid] = nA; out[2 * tid + 1] = nB;
      cur = 1 - cur;
      team.team_barrier();
    }
    const float* inc = scan + cur * 2 * TPB;
    const float aggA = inc[2 * (TPB - 1)], aggB = inc[2 * (TPB - 1) + 1];
    const bool followed = tile + 1 < C;
    if (tid == 0 && tile > 0 && followed) {
      agg(2 * tile) = aggA; agg(2 * tile + 1) = aggB;
      Kokkos::memory_fence();
      Kokkos::atomic_store(&status(1 + tile), 1);
    }
    // Look-back: the nearest earlier tile with a published leaving state.
    float entering = 0.f;
    if (tile > 0) {
      int known = -1, rounds = 0;
      for (int newest = tile - 1; known < 0; newest -= TPB) {
        ++rounds;
        int found = -1;
        const int polled = newest - tid;
        if (polled >= 0) {
          const volatile int* s = &status(1 + polled);
          int seen;
          while ((seen = *s) == 0) {}
          if (seen == 2) found = polled;
        } else found = -2; // before tile 0: the initial state
        team.team_reduce(Kokkos::Max<int>(found));
        known = found;
        if (known == -2) { known = -1; break; }
        if (known >= 0) break;
      }
      if (tid == 0) {
        Kokkos::atomic_add(&stats(0), long(tile - known));
        Kokkos::atomic_max(&stats(1), long(tile - known));
        Kokkos::atomic_add(&stats(2), long(rounds));
      }
      Kokkos::memory_fence();
      float x = known >= 0 ? ((volatile float*)state.data())[known] : 0.f;
      // Maps of tiles known+1 .. tile-1, TPB at a time, applied in order by thread 0.
      for (int first = known + 1; first < tile; first += TPB) {
        const int j = first + tid;
        if (j < tile) {
          look[2 * tid] = ((volatile float*)agg.data())[2 * j];
          look[2 * tid + 1] = ((volatile float*)agg.data())[2 * j + 1];
        }
        team.team_barrier();
        if (tid == 0) {
          // Loads issued ahead of the dependent chain; guarded slots keep x (a select).
          const int n = Kokkos::min(TPB, tile - first);
          for (int q0 = 0; q0 < n; q0 += 16) {
            float la[16], lb[16];
#pragma unroll
            for (int j = 0; j < 16; ++j) { const int q = Kokkos::min(q0 + j, TPB - 1); la[j] = look[2 * q]; lb[j] = look[2 * q + 1]; }
#pragma unroll
            for (int j = 0; j < 16; ++j) { const float y = la[j] * x + lb[j]; x = q0 + j < n ? y : x; }
          }
        }
        team.team_barrier();
      }
      if (tid == 0) shared[0] = x;
      team.team_barrier();
      entering = shared[0];
    }
    if (tid == 0 && followed) {
      state(tile) = aggA * entering + aggB;
      Kokkos::memory_fence();
      Kokkos::atomic_store(&status(1 + tile), 2);
    }
    // Re-run the thread's steps from its entering state (exclusive prefix applied).
    float x = entering;
    if (tid > 0) x = inc[2 * (tid - 1)] * entering + inc[2 * (tid - 1) + 1];
    for (int k = 0; k < I; ++k) {
      x = sa[pad(tid * I + k)] * x + sb[pad(tid * I + k)];
      sa[pad(tid * I + k)] = x;
    }
    team.team_barrier();
    for (int k = 0; k < I; ++k) {
      const int i = k * TPB + tid;
      const long t = base + i;
      if (t < T) h(t) = sa[pad(i)];
    }
  }

  void run(const Space& space) {
    Kokkos::deep_copy(space, status, 0);
    policy_t policy(space, C, TPB);
    Kokkos::parallel_for("proto_one_pass", policy.set_scratch_size(0, Kokkos::PerTeam(scratch_bytes())), *this);
  }
};

template <int TPB, int I, int MB>
OnePass<TPB, I, MB> make(V1 a, V1 b, V1 h, long T) {
  OnePass<TPB, I, MB> op;
  op.a = a; op.b = b; op.h = h; op.T = T;
  op.C = int((T + OnePass<TPB, I, MB>::Tile - 1) / OnePass<TPB, I, MB>::Tile);
  op.agg = Kokkos::View<float*, Mem>("agg", 2 * op.C);
  op.state = Kokkos::View<float*, Mem>("state", op.C);
  op.status = Kokkos::View<int*, Mem>("status", op.C + 1);
  op.stats = Kokkos::View<long*, Mem>("stats", 3);
  return op;
}


// Two-level look-back: groups of W tiles. The last tile of group g folds the group's tile maps
// (fixed order) into G_g and, once it knows the state entering its group, publishes the state
// leaving it, E_{g+1} = G_g(E_g). Tile c enters with M_{c-1}(...M_{gW}(E_g)), maps applied one by
// one; E_g comes from the nearest published group state through the group maps one by one. Every
// value has one recipe, so the result does not depend on how far a tile looked back.
template <int TPB, int I, int MinBlocks, int W, bool Fuse = false>
struct OnePassGrouped {
  V1 a, b, h;
  Kokkos::View<float*, Mem> tile_maps;  // [C][2]
  Kokkos::View<float*, Mem> group_maps; // [groups][2]
  Kokkos::View<float*, Mem> group_out;  // [groups]: the state leaving group g
  Kokkos::View<int*, Mem> tile_status;  // [1 + C]: [0] is the ticket
  Kokkos::View<int*, Mem> group_status; // [groups]: 1 map, 2 leaving state
  Kokkos::View<long*, Mem> stats;
  long T;
  int C;
  using policy_t = Kokkos::TeamPolicy<Space, Kokkos::LaunchBounds<TPB, MinBlocks>>;
  using member = typename policy_t::member_type;
  static constexpr int Tile = TPB * I;
  static constexpr int team_threads = TPB;
  KOKKOS_INLINE_FUNCTION static int pad(int i) { return i + i / 32; }
  static std::size_t scratch_bytes() { return sizeof(float) * (2 * (Tile + Tile / 32) + 4 * TPB + 2 * TPB + 4); }

  // x <- maps[first..last) applied one by one (maps in team scratch `look`, loaded TPB at a time
  // from `src` after waiting for `status` >= 1 where given).
  KOKKOS_FUNCTION float apply_in_order(const member& team, float x, const float* src, int first, int last,
                                       float* look, float* shared) const {
    const int tid = team.team_rank();
    for (int q0 = first; q0 < last; q0 += TPB) {
      const int j = q0 + tid;
      if (j < last) {
        look[2 * tid] = ((volatile const float*)src)[2 * j];
        look[2 * tid + 1] = ((volatile const float*)src)[2 * j + 1];
      }
      team.team_barrier();
      if (tid == 0) {
        const int n = Kokkos::min(TPB, last - q0);
        for (int r0 = 0; r0 < n; r0 += 16) {
          float la[16], lb[16];
#pragma unroll
          for (int k = 0; k < 16; ++k) { const int q = Kokkos::min(r0 + k, TPB - 1); la[k] = look[2 * q]; lb[k] = look[2 * q + 1]; }
#pragma unroll
          for (int k = 0; k < 16; ++k) { const float y = la[k] * x + lb[k]; x = r0 + k < n ? y : x; }
        }
        shared[0] = x;
      }
      team.team_barrier();
      x = shared[0];
      team.team_barrier();
    }
    return x;
  }

  KOKKOS_FUNCTION void operator()(const member& team) const {
    const int tid = team.team_rank();
    int ticket = 0;
    if (tid == 0) ticket = Kokkos::atomic_fetch_add(&tile_status(0), 1);
    team.team_broadcast(ticket, 0);
    const int tile = ticket, group = tile / W, group_first = group * W;
    const int groups = (C + W - 1) / W;
    const long base = long(tile) * Tile;
    float* sa = (float*)team.team_shmem().get_shmem(sizeof(float) * (Tile + Tile / 32));
    float* sb = (float*)team.team_shmem().get_shmem(sizeof(float) * (Tile + Tile / 32));
    float* scan = (float*)team.team_shmem().get_shmem(sizeof(float) * 4 * TPB);
    float* look = (float*)team.team_shmem().get_shmem(sizeof(float) * 2 * TPB);
    float* shared = (float*)team.team_shmem().get_shmem(sizeof(float) * 4);
    for (int k = 0; k < I; ++k) {
      const int i = k * TPB + tid;
      const long t = base + i;
      sa[pad(i)] = t < T ? a(t) : 1.f;
      sb[pad(i)] = t < T ? b(t) : 0.f;
    }
    team.team_barrier();
    float A = 1.f, B = 0.f;
    for (int k = 0; k < I; ++k) {
      const float ak = sa[pad(tid * I + k)], bk = sb[pad(tid * I + k)];
      A = ak * A;
      B = ak * B + bk;
    }
    int cur = 0;
    scan[2 * tid] = A; scan[2 * tid + 1] = B;
    team.team_barrier();
    for (int off = 1; off < TPB; off *= 2) {
      const float* in = scan + cur * 2 * TPB;
      float* out = scan + (1 - cur) * 2 * TPB;
      float nA = in[2 * tid], nB = in[2 * tid + 1];
      if (tid >= off) {
        const float pA = in[2 * (tid - off)], pB = in[2 * (tid - off) + 1];
        nB = nA * pB + nB;
        nA = nA * pA;
      }
      out[2 * tid] = nA; out[2 * tid + 1] = nB;
      cur = 1 - cur;
      team.team_barrier();
    }
    const float* inc = scan + cur * 2 * TPB;
    const float aggA = inc[2 * (TPB - 1)], aggB = inc[2 * (TPB - 1) + 1];
    const bool closes_group = tile % W == W - 1 && group + 1 < groups; // a later group needs G_g and E_{g+1}
    if (tid == 0 && tile + 1 < C) {
      tile_maps(2 * tile) = aggA; tile_maps(2 * tile + 1) = aggB;
      Kokkos::memory_fence();
      Kokkos::atomic_store(&tile_status(1 + tile), 1);
    }
    // Every tile map of the group before this tile (and, closing it, this one) is published.
    {
      const int q = group_first + tid;
      if (q < tile) {
        const volatile int* st = &tile_status(1 + q);
        while (*st == 0) {}
      }
      team.team_barrier();
      Kokkos::memory_fence();
    }
    float group_map_a = 1.f, group_map_b = 0.f;
    if (closes_group) {
      if (tid == 0) {
        float GA = 1.f, GB = 0.f;
        for (int q = group_first; q < tile; ++q) {
          const float mA = ((volatile float*)tile_maps.data())[2 * q], mB = ((volatile float*)tile_maps.data())[2 * q + 1];
          GB = mA * GB + mB;
          GA = mA * GA;
        }
        GB = aggA * GB + aggB;
        GA = aggA * GA;
        group_maps(2 * group) = GA; group_maps(2 * group + 1) = GB;
        Kokkos::memory_fence();
        Kokkos::atomic_store(&group_status(group), 1);
        shared[1] = GA; shared[2] = GB;
      }
      team.team_barrier();
      group_map_a = shared[1]; group_map_b = shared[2];
    }
    // E_g: the nearest earlier group with a published leaving state, then the group maps after it.
    float entering_group = 0.f, fused_entering = 0.f;
    bool fused = false;
    if (group > 0) {
      int known = -1, rounds = 0;
      for (int newest = group - 1;; newest -= TPB) {
        ++rounds;
        int found = -1;
        const int polled = newest - tid;
        if (polled >= 0) {
          const volatile int* st = &group_status(polled);
          int seen;
          while ((seen = *st) == 0) {}
          if (seen == 2) found = polled;
        } else found = -2;
        team.team_reduce(Kokkos::Max<int>(found));
        if (found != -1) { known = found; break; }
      }
      Kokkos::memory_fence();
      float x = known >= 0 ? ((volatile float*)group_out.data())[known] : 0.f;
      const int from = known >= 0 ? known + 1 : 0;
      if (tid == 0) {
        Kokkos::atomic_add(&stats(0), long(group - from));
        Kokkos::atomic_max(&stats(1), long(group - from));
        Kokkos::atomic_add(&stats(2), long(rounds));
      }
      if (Fuse && (group - from) + (tile - group_first) <= TPB) {
        // One load round: the group maps, then this group's tile maps; applied in that order.
        const int ng = group - from, nt = tile - group_first;
        if (tid < ng) {
          look[2 * tid] = ((volatile const float*)group_maps.data())[2 * (from + tid)];
          look[2 * tid + 1] = ((volatile const float*)group_maps.data())[2 * (from + tid) + 1];
        } else if (tid < ng + nt) {
          const int q = group_first + tid - ng;
          look[2 * tid] = ((volatile const float*)tile_maps.data())[2 * q];
          look[2 * tid + 1] = ((volatile const float*)tile_maps.data())[2 * q + 1];
        }
        team.team_barrier();
        if (tid == 0) {
          for (int q = 0; q < ng; ++q) x = look[2 * q] * x + look[2 * q + 1];
          shared[0] = x;
          for (int q = ng; q < ng + nt; ++q) x = look[2 * q] * x + look[2 * q + 1];
          shared[3] = x;
        }
        team.team_barrier();
        entering_group = shared[0];
        fused_entering = shared[3];
        fused = true;
        team.team_barrier();
      } else
        entering_group = apply_in_order(team, x, group_maps.data(), from, group, look, shared);
    }
    if (closes_group && tid == 0) {
      group_out(group) = group_map_a * entering_group + group_map_b;
      Kokkos::memory_fence();
      Kokkos::atomic_store(&group_status(group), 2);
    }
    const float entering = fused ? fused_entering : apply_in_order(team, entering_group, tile_maps.data(), group_first, tile, look, shared);
    float x = entering;
    if (tid > 0) x = inc[2 * (tid - 1)] * entering + inc[2 * (tid - 1) + 1];
    for (int k = 0; k < I; ++k) {
      x = sa[pad(tid * I + k)] * x + sb[pad(tid * I + k)];
      sa[pad(tid * I + k)] = x;
    }
    team.team_barrier();
    for (int k = 0; k < I; ++k) {
      const int i = k * TPB + tid;
      const long t = base + i;
      if (t < T) h(t) = sa[pad(i)];
    }
  }

  void run(const Space& space) {
    Kokkos::deep_copy(space, tile_status, 0);
    Kokkos::deep_copy(space, group_status, 0);
    policy_t policy(space, C, TPB);
    Kokkos::parallel_for("proto_one_pass_grouped", policy.set_scratch_size(0, Kokkos::PerTeam(scratch_bytes())), *this);
  }
};

template <int TPB, int I, int MB, int W, bool Fuse = false>
OnePassGrouped<TPB, I, MB, W, Fuse> make_grouped(V1 a, V1 b, V1 h, long T) {
  OnePassGrouped<TPB, I, MB, W, Fuse> op;
  op.a = a; op.b = b; op.h = h; op.T = T;
  op.C = int((T + op.Tile - 1) / op.Tile);
  const int groups = (op.C + W - 1) / W;
  op.tile_maps = Kokkos::View<float*, Mem>("tile_maps", 2 * op.C);
  op.group_maps = Kokkos::View<float*, Mem>("group_maps", 2 * groups);
  op.group_out = Kokkos::View<float*, Mem>("group_out", groups);
  op.tile_status = Kokkos::View<int*, Mem>("tile_status", op.C + 1);
  op.group_status = Kokkos::View<int*, Mem>("group_status", groups);
  op.stats = Kokkos::View<long*, Mem>("stats", 3);
  return op;
}

template <class F>
double time_ms(F&& f, int reps = 20) {
  f(); Kokkos::fence();
  std::vector<double> s;
  for (int r = 0; r < reps; ++r) {
    Kokkos::Timer timer;
    f(); Kokkos::fence();
    s.push_back(timer.seconds() * 1e3);
  }
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

template <class Op>
void check_and_time(Op op, long T, V1 h, const std::vector<double>& ref, double copy_ms, const char* label) {
  constexpr int TPB = Op::team_threads;
  {
    typename decltype(op)::policy_t policy(Space{}, op.C, Kokkos::AUTO);
    policy.set_scratch_size(0, Kokkos::PerTeam(op.scratch_bytes()));
    const int max = policy.team_size_max(op, Kokkos::ParallelForTag{});
    if (TPB > max) { printf("%-28s skipped: team size max %d\n", label, max); return; }
  }
  op.run(Space{}); Kokkos::fence();
  auto h1 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, h);
  op.run(Space{}); Kokkos::fence();
  auto h2 = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, h);
  double err = 0, scale = 0; bool same = true;
  for (long t = 0; t < T; ++t) {
    err = std::max(err, std::abs(h1(t) - ref[t])); scale = std::max(scale, std::abs(ref[t]));
    same = same && (h1(t) == h2(t));
  }
  Kokkos::deep_copy(op.stats, 0);
  op.run(Space{}); Kokkos::fence();
  auto st = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, op.stats);
  const double ms = time_ms([&] { op.run(Space{}); });
  printf("    look-back: mean distance %.1f, max %ld, mean polling rounds %.2f\n", double(st(0)) / op.C, st(1), double(st(2)) / op.C);
  printf("%-28s T=%ld tiles=%d: %.3f ms  %.0f GB/s  %.0f%% of copy  max err %.2e (scale %.2e)  bitwise repeat %s\n",
         label, T, op.C, ms, 12.0 * T / ms / 1e6, 100 * copy_ms / ms, err, scale, same ? "yes" : "NO");
}

int main(int argc, char** argv) {
  Kokkos::ScopeGuard guard(argc, argv);
  setvbuf(stdout, nullptr, _IOLBF, 0);
  for (long T : {long(1) << 26, (long(1) << 26) - 123, long(1) << 22, 1000L}) {
    V1 a("a", T), b("b", T), h("h", T);
    auto ha = Kokkos::create_mirror_view(a); auto hb = Kokkos::create_mirror_view(b);
    std::mt19937 gen(7); std::uniform_real_distribution<float> ua(-0.95f, 0.95f), ub(-1.f, 1.f);
    std::vector<double> ref(T); double x = 0;
    for (long t = 0; t < T; ++t) { ha(t) = ua(gen); hb(t) = ub(gen); x = double(ha(t)) * x + hb(t); ref[t] = x; }
    Kokkos::deep_copy(a, ha); Kokkos::deep_copy(b, hb);
    const double copy_ms = time_ms([&] {
      Kokkos::parallel_for("copy", Kokkos::RangePolicy<Space>(0, T), KOKKOS_LAMBDA(long t) { h(t) = a(t) + b(t); });
    });
    printf("copy (read 2, write 1)      T=%ld: %.3f ms  %.0f GB/s\n", T, copy_ms, 12.0 * T / copy_ms / 1e6);
    const double copy1_ms = time_ms([&] {
      Kokkos::parallel_for("copy1", Kokkos::RangePolicy<Space>(0, T), KOKKOS_LAMBDA(long t) { h(t) = a(t); });
    });
    const double copy_rt_ms = time_ms([&] { Kokkos::deep_copy(Space{}, h, a); });
    printf("copy (read 1, write 1)      T=%ld: %.3f ms  %.0f GB/s;  runtime copy %.3f ms  %.0f GB/s\n", T, copy1_ms,
           8.0 * T / copy1_ms / 1e6, copy_rt_ms, 8.0 * T / copy_rt_ms / 1e6);
    V3 a3(a.data(), 1, T, 1), b3(b.data(), 1, T, 1), h3(h.data(), 1, T, 1);
    const double lib_ms = time_ms([&] { paraseq::linear_scan(Space{}, paraseq::Diagonal{}, a3, b3, h3); });
    {
      auto hh = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace{}, h);
      double err = 0; for (long t = 0; t < T; ++t) err = std::max(err, std::abs(hh(t) - ref[t]));
      printf("paraseq::linear_scan         T=%ld: %.3f ms  %.0f GB/s  %.0f%% of copy  max err %.2e\n", T, lib_ms,
             12.0 * T / lib_ms / 1e6, 100 * copy_ms / lib_ms, err);
    }
    check_and_time(make_grouped<256, 16, 4, 8>(a, b, h, T), T, h, ref, copy_ms, "grouped 256 x 16 (4/SM) W8");
    check_and_time(make_grouped<256, 16, 4, 8, true>(a, b, h, T), T, h, ref, copy_ms, "fused 256 x 16 (4/SM) W8");
    check_and_time(make_grouped<256, 16, 4, 4, true>(a, b, h, T), T, h, ref, copy_ms, "fused 256 x 16 (4/SM) W4");
    check_and_time(make_grouped<256, 16, 4, 16, true>(a, b, h, T), T, h, ref, copy_ms, "fused 256 x 16 (4/SM) W16");
    check_and_time(make_grouped<256, 16, 3, 8, true>(a, b, h, T), T, h, ref, copy_ms, "fused 256 x 16 (3/SM) W8");
    check_and_time(make_grouped<128, 32, 6, 8, true>(a, b, h, T), T, h, ref, copy_ms, "fused 128 x 32 (6/SM) W8");
    check_and_time(make_grouped<512, 8, 2, 8, true>(a, b, h, T), T, h, ref, copy_ms, "fused 512 x 8 (2/SM) W8");
  }
}
