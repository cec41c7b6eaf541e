// Not compiled: the input of the test paraseq_source_rules_catch_violations, which expects
// cmake/CheckSourceRules.cmake to reject both lines below.
Kokkos::parallel_for("example", policy, KOKKOS_LAMBDA(int i) { y(i) = x(i); });
Kokkos::parallel_scan("example", policy, functor);
