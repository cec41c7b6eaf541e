# cmake -DNM=nm -DOBJECTS=a.o -P check_linked_instance.cmake: the objects call
# paraseq::detail::run_linear_scan<paraseq::Diagonal, double, ...> and do not define it.
execute_process(COMMAND ${NM} -C ${OBJECTS} OUTPUT_VARIABLE symbols COMMAND_ERROR_IS_FATAL ANY)
string(REGEX MATCHALL "[^\n]*paraseq::detail::run_linear_scan<paraseq::Diagonal, double[^\n]*" lines "${symbols}")
if(NOT lines)
  message(FATAL_ERROR "the consumer does not call the compiled linear_scan instance:\n${symbols}")
endif()
foreach(line IN LISTS lines)
  if(NOT line MATCHES "^ +U ")
    message(FATAL_ERROR "the consumer defines the linear_scan instance itself (not extern): ${line}")
  endif()
endforeach()
message(STATUS "the consumer links the compiled instance: ${lines}")
