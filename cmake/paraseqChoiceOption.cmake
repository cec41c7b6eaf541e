# paraseq_choice_option(<name> <default> <doc> <choice>...)
# A cache string that takes one of a fixed set of values; any other value stops the configure with
# the value given and the values expected, so a typo is never read as a silent default.
function(paraseq_choice_option name default doc)
  set(choices ${ARGN})
  set(${name} ${default} CACHE STRING "${doc}")
  set_property(CACHE ${name} PROPERTY STRINGS ${choices})
  if(NOT ${name} IN_LIST choices)
    list(JOIN choices ", " expected)
    message(FATAL_ERROR "${name} is '${${name}}'; expected one of: ${expected}")
  endif()
endfunction()
