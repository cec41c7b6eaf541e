# cmake -DNM=nm -DOBJECTS=a.o -P check_linked_instance.cmake: the objects call paraseq's compiled
# Diagonal double scan and RK4 loop of the damped oscillator (undefined symbols) and instantiate none
# of the scan engine or the loop kernels themselves.
execute_process(COMMAND ${NM} -C ${OBJECTS} OUTPUT_VARIABLE symbols COMMAND_ERROR_IS_FATAL ANY)

# Sets `out` to the undefined symbol that `pattern` matches from its start (nm -C shows a function's
# return type first); fails naming `what` when there is none.
function(expect_called out pattern what)
  string(REGEX MATCH "[^\n]* U ${pattern}[^\n]*" call "${symbols}")
  if(NOT call)
    message(FATAL_ERROR "the consumer does not call the compiled ${what}:\n${symbols}")
  endif()
  set(${out} "${call}" PARENT_SCOPE)
endfunction()

# Fails, naming `what` and the first match, when any symbol matches `pattern`.
function(expect_not_instantiated pattern what)
  string(REGEX MATCHALL "[^\n]*${pattern}[^\n]*" found "${symbols}")
  if(found)
    list(GET found 0 first)
    message(FATAL_ERROR "the consumer instantiates ${what} itself: ${first}")
  endif()
endfunction()

expect_called(scan "paraseq::detail::compiled_linear_scan\\([^\n]*paraseq::Diagonal, [^\n]*double" "Diagonal double linear_scan")
expect_not_instantiated("paraseq::detail::OrderedScan<" "the scan engine")
expect_called(loop "[^\n]*paraseq::ode::detail::forward_pass<paraseq::ode::RK4, [^\n]*paraseq::ode::DampedOscillator, double"
              "RK4 loop of the damped oscillator")
expect_not_instantiated("paraseq::ode::detail::Forward<" "the loop kernels")
message(STATUS "the consumer links the compiled instances: ${scan}; ${loop}")
