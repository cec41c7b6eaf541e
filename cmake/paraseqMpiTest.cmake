# paraseq_add_mpi_test(<name> <ranks> <executable> [<argument>...]): a CTest test that runs
# <executable> on <ranks> MPI ranks with FindMPI's launcher,
#   MPIEXEC_EXECUTABLE MPIEXEC_NUMPROC_FLAG <ranks> MPIEXEC_PREFLAGS <executable> MPIEXEC_POSTFLAGS <arguments>
# with one OpenMP thread per rank. Open MPI's launcher is also told to start more ranks than there
# are cores (--oversubscribe) and, through its environment variables OMPI_ALLOW_RUN_AS_ROOT and
# OMPI_ALLOW_RUN_AS_ROOT_CONFIRM, to run as root, as tests in containers and chroots do (for any
# other user the variables change nothing). Needs find_package(MPI); paraseq's package config
# provides the function when paraseq was built with MPI.
function(paraseq_add_mpi_test name ranks executable)
  # Asked once per launcher (a later MPIEXEC_EXECUTABLE is asked again).
  if(NOT PARASEQ_MPIEXEC_ASKED STREQUAL MPIEXEC_EXECUTABLE)
    execute_process(COMMAND "${MPIEXEC_EXECUTABLE}" --version OUTPUT_VARIABLE version ERROR_VARIABLE version TIMEOUT 60)
    set(is_open_mpi OFF)
    if(version MATCHES "Open MPI|OpenRTE")
      set(is_open_mpi ON)
    endif()
    set(PARASEQ_MPIEXEC_IS_OPEN_MPI ${is_open_mpi} CACHE INTERNAL "whether PARASEQ_MPIEXEC_ASKED is Open MPI's launcher")
    set(PARASEQ_MPIEXEC_ASKED "${MPIEXEC_EXECUTABLE}" CACHE INTERNAL "the launcher PARASEQ_MPIEXEC_IS_OPEN_MPI describes")
  endif()
  set(preflags ${MPIEXEC_PREFLAGS})
  set(environment OMP_NUM_THREADS=1)
  if(PARASEQ_MPIEXEC_IS_OPEN_MPI)
    list(APPEND preflags --oversubscribe)
    list(APPEND environment OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1)
  endif()
  add_test(NAME ${name}
           COMMAND ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${preflags} ${executable} ${MPIEXEC_POSTFLAGS} ${ARGN})
  # A rank left waiting in a collective would otherwise hang the suite until CTest's default timeout.
  set_tests_properties(${name} PROPERTIES ENVIRONMENT "${environment}" PROCESSORS ${ranks} TIMEOUT 300)
endfunction()
