#pragma once
// paraseq: parallel solvers for sequential computations on Kokkos.

#include <paraseq/core/linear_scan.hpp>
#include <paraseq/core/ordered_scan.hpp>
#include <paraseq/core/structure.hpp>
#include <paraseq/core/workspace.hpp>
#include <paraseq/solvers/cell_step.hpp>
#include <paraseq/solvers/cells.hpp>
#include <paraseq/solvers/input_projection.hpp>
#include <paraseq/solvers/newton.hpp>
#include <paraseq/solvers/newton_backward.hpp>
#include <paraseq/loops/fields.hpp>
#include <paraseq/loops/integrate.hpp>

// paraseq::mpi, the scans and the Newton solver over MPI ranks, when paraseq was built with MPI
// (PARASEQ_ENABLE_MPI).
#include <paraseq/config.hpp>
#if PARASEQ_HAVE_MPI
#include <paraseq/core/mpi_scan.hpp>
#include <paraseq/solvers/mpi_newton.hpp>
#endif
