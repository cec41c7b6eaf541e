# How sources that include Kokkos must be compiled. A CUDA Kokkos built with
# Kokkos_ENABLE_COMPILE_AS_CMAKE_LANGUAGE expects its users' sources to be compiled as CUDA
# (otherwise Kokkos_Setup_Cuda.hpp stops: "__CUDACC__" undefined); a Kokkos built with nvcc_wrapper
# instead expects CMAKE_CXX_COMPILER to be that wrapper, and needs nothing here.
# Included at directory scope (the top-level CMakeLists.txt, or find_package(paraseq)), because
# CMake enables languages only there.
if(Kokkos_ENABLE_CUDA AND Kokkos_COMPILE_LANGUAGE STREQUAL "CUDA")
  enable_language(CUDA)
endif()

# paraseq_kokkos_sources(<target>): mark the target's C++ sources for the compiler Kokkos needs.
function(paraseq_kokkos_sources target)
  if(Kokkos_ENABLE_CUDA AND Kokkos_COMPILE_LANGUAGE STREQUAL "CUDA")
    get_target_property(sources ${target} SOURCES)
    foreach(source IN LISTS sources)
      if(source MATCHES "\\.(cpp|cc|cxx)$")
        set_source_files_properties(${source} TARGET_DIRECTORY ${target} PROPERTIES LANGUAGE CUDA)
      endif()
    endforeach()
    # A CMake older than the nvcc cannot name its C++20 flag; then CMAKE_CUDA_FLAGS=-std=c++20 does.
    if(NOT CMAKE_CUDA_FLAGS MATCHES "-std=")
      set_target_properties(${target} PROPERTIES CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON)
    endif()
  endif()
endfunction()
