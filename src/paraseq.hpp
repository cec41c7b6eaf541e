#pragma once
// paraseq: parallel solvers for sequential computations on Kokkos.

#include <paraseq/core/linear_scan.hpp>
#include <paraseq/core/ordered_scan.hpp>
#include <paraseq/core/structure.hpp>
