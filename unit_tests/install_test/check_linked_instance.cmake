# cmake -DNM=nm -DOBJECTS=a.o -P check_linked_instance.cmake: the objects call paraseq's compiled
# Diagonal double scan (an undefined symbol) and instantiate none of the scan engine themselves.
execute_process(COMMAND ${NM} -C ${OBJECTS} OUTPUT_VARIABLE symbols COMMAND_ERROR_IS_FATAL ANY)
string(REGEX MATCH "[^\n]* U paraseq::detail::compiled_linear_scan\\([^\n]*paraseq::Diagonal, [^\n]*double[^\n]*" call "${symbols}")
if(NOT call)
  message(FATAL_ERROR "the consumer does not call the compiled Diagonal double linear_scan:\n${symbols}")
endif()
string(REGEX MATCHALL "[^\n]*paraseq::detail::OrderedScan<[^\n]*" engine "${symbols}")
if(engine)
  list(GET engine 0 first)
  message(FATAL_ERROR "the consumer instantiates the scan engine itself: ${first}")
endif()
message(STATUS "the consumer links the compiled instance: ${call}")
