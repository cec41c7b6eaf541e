# paraseq_kokkos_sources(<target>): compile the target's C++ sources the way the Kokkos install needs.
# A CUDA Kokkos built with Kokkos_ENABLE_COMPILE_AS_CMAKE_LANGUAGE expects its users' sources to be
# compiled as CUDA (otherwise Kokkos_Setup_Cuda.hpp stops: "__CUDACC__" undefined). A Kokkos built
# with nvcc_wrapper instead expects CMAKE_CXX_COMPILER to be that wrapper, and needs nothing here.
function(paraseq_kokkos_sources target)
  if(Kokkos_ENABLE_CUDA AND Kokkos_COMPILE_LANGUAGE STREQUAL "CUDA")
    enable_language(CUDA)
    get_target_property(sources ${target} SOURCES)
    foreach(source IN LISTS sources)
      if(source MATCHES "\\.(cpp|cc|cxx)$")
        set_source_files_properties(${source} TARGET_DIRECTORY ${target} PROPERTIES LANGUAGE CUDA)
      endif()
    endforeach()
    set_target_properties(${target} PROPERTIES CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON)
  endif()
endfunction()
