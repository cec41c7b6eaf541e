# cmake -DSOURCE_DIR=<dir> -P CheckSourceRules.cmake: fails, naming file and line, where a source
# under SOURCE_DIR breaks a rule that the compilers of a host build cannot catch.
#  - No KOKKOS_LAMBDA or KOKKOS_CLASS_LAMBDA: nvcc turns them into extended lambdas whose host-side
#    helpers live in each translation unit's anonymous namespace, while the Kokkos templates that
#    launch them are merged across translation units by the linker. A library that instantiates the
#    same launch in two units (the PyTorch operators instantiate the loops once per field and
#    method) then calls another unit's never-set helper pointer: a jump to address 0 on CUDA only.
#    Kernels are named functors.
#  - No Kokkos::parallel_scan: its join order is unspecified and CUDA team scans only sum, while
#    paraseq's scans compose affine maps, which do not commute (core/ordered_scan.hpp).
if(NOT SOURCE_DIR)
  message(FATAL_ERROR "CheckSourceRules.cmake: pass -DSOURCE_DIR=<directory>")
endif()
file(GLOB_RECURSE sources "${SOURCE_DIR}/*.hpp" "${SOURCE_DIR}/*.cpp" "${SOURCE_DIR}/*.cpp.in")
set(violations "")
foreach(source IN LISTS sources)
  file(STRINGS "${source}" lines)
  set(number 0)
  foreach(line IN LISTS lines)
    math(EXPR number "${number} + 1")
    string(REGEX REPLACE "//.*$" "" code "${line}")
    if(code MATCHES "KOKKOS_(CLASS_)?LAMBDA")
      string(APPEND violations "\n  ${source}:${number}: KOKKOS_LAMBDA (write a named functor)")
    endif()
    if(code MATCHES "parallel_scan[ \t]*\\(")
      string(APPEND violations "\n  ${source}:${number}: Kokkos::parallel_scan (use paraseq's ordered scan)")
    endif()
  endforeach()
endforeach()
list(LENGTH sources count)
if(count EQUAL 0)
  message(FATAL_ERROR "CheckSourceRules.cmake: no sources under ${SOURCE_DIR}")
endif()
if(violations)
  message(FATAL_ERROR "paraseq source rules broken:${violations}")
endif()
message(STATUS "paraseq source rules: ${count} files under ${SOURCE_DIR} pass")
