# Explicit template instantiation (ETI) of the built-in structures and cells, as Kokkos Kernels
# does: every instance is one generated translation unit of the paraseq library, and generated
# headers declare each one `extern template`, so that consumers (the operator library, the tests,
# an application) link them instead of compiling them again. The instances take the Views of
# src/core/views.hpp. This file is the one list of them.
#
#   paraseq_generate_instances(<sources variable>)
#
# writes ${PARASEQ_GENERATED_INCLUDE_DIR}/paraseq/config.hpp (always) and, with PARASEQ_ETI, the
# instance headers under paraseq/eti/ and one .cpp per instance under ${PROJECT_BINARY_DIR}/eti.

set(PARASEQ_ETI_TYPES float double)
set(PARASEQ_ETI_STRUCTURES Diagonal "BlockDiagonal<2>" "BlockDiagonal<3>" "BlockDiagonal<4>" Dense)
set(PARASEQ_ETI_CELLS ParaGRU ParaGRUHeads ParaLSTM ParaSLSTM)
# The built-in fields of loops/fields.hpp, each as name|type|parameters|state size (parameters own:
# [N, P] rows, whose gradient the instances compute, or shared: [Q]; state size fixed at compile
# time or runtime), and the methods, compiled for the fused loops of ode::solve and
# ode::solve_with_gradient (the operators' paraseq::odeint and odeint_backward).
set(PARASEQ_ETI_FIELDS
  "DampedOscillator|paraseq::ode::DampedOscillator|own|fixed"
  "LotkaVolterra|paraseq::ode::LotkaVolterra|own|fixed"
  "SIR|paraseq::ode::SIR|own|fixed"
  "LinearShared|paraseq::ode::Linear<paraseq::ode::Sharing::shared, paraseq::ode::Sharing::shared>|shared|runtime"
  "LinearOwn|paraseq::ode::Linear<paraseq::ode::Sharing::own, paraseq::ode::Sharing::own>|own|runtime"
  "Mlp|paraseq::ode::Mlp|shared|runtime")
set(PARASEQ_ETI_FIXED_METHODS Euler RK4)
set(PARASEQ_ETI_ADAPTIVE_METHODS Heun DormandPrince5)

# The execution spaces of this Kokkos that paraseq compiles for; others take the header path.
function(paraseq_instance_spaces out)
  set(spaces)
  foreach(device IN ITEMS SERIAL OPENMP CUDA)
    if(Kokkos_ENABLE_${device} OR device IN_LIST Kokkos_DEVICES)
      string(REPLACE SERIAL Kokkos::Serial space ${device})
      string(REPLACE OPENMP Kokkos::OpenMP space ${space})
      string(REPLACE CUDA Kokkos::Cuda space ${space})
      list(APPEND spaces ${space})
    endif()
  endforeach()
  set(${out} ${spaces} PARENT_SCOPE)
endfunction()

# The kernels of an ordered scan (src/core/ordered_scan.hpp's ScanKernel) that get translation units
# of their own on devices, where each takes tens of seconds to compile: a Newton scan's unit would
# otherwise hold them all. Host kernels compile in seconds and stay in their scan's unit. The
# generated extensions of cells of your own split theirs alike (libparaseq_torch.build.json names them).
set(PARASEQ_ETI_DEVICE_SCAN_KERNELS ApplyTag ChainedTag)

# One instance: its declaration (`declaration`) for the headers, its definition (`definition`) for
# its translation unit. The entry points (scan, scan_reverse, newton_solve, newton_backward) are
# plain overloads of detail::compiled_*: a consumer sees only their declarations, so no compiler can
# instantiate their kernels there. The pieces inside a solve (its fused kernel and scans) are
# explicit instantiations, declared `extern template`, so that each is a unit of its own.
# `scan`: the OrderedScan that a Newton scan instance runs ("" for the others).
function(paraseq_instance out_declaration out_definition out_scan kind type space subject)
  set(in3 "const paraseq::InView<${type}, 3, ${space}>&")
  set(in2 "const paraseq::InView<${type}, 2, ${space}>&")
  set(out3 "const paraseq::OutView<${type}, 3, ${space}>&")
  set(out2 "const paraseq::OutView<${type}, 2, ${space}>&")
  set(out1 "const paraseq::OutView<${type}, 1, ${space}>&")
  set(cell "paraseq::${subject}<${type}, ${space}::memory_space>")
  set(a "const paraseq::InView<${type}, paraseq::detail::a_rank<paraseq::${subject}>, ${space}>&")
  set(instantiation "")
  set(structure "")
  set(recurrence "")
  if(kind STREQUAL "scan")
    set(params "const ${space}& space, paraseq::${subject}, const paraseq::ScanShape& shape, ${a} A, ${in3} b, ${out3} h, ${in2} h0, const paraseq::ScanConfig& config")
    set(function compiled_linear_scan)
    set(body "run_linear_scan<paraseq::${subject}, ${type}>(space, shape, A, b, h, h0, config);")
  elseif(kind STREQUAL "scan_reverse")
    set(params "const ${space}& space, paraseq::${subject}, const paraseq::ScanShape& shape, ${a} A, ${in3} g, ${out3} lambda, const paraseq::ScanConfig& config")
    set(function compiled_linear_scan_reverse)
    set(body "run_linear_scan_reverse<paraseq::${subject}, ${type}>(space, shape, A, g, lambda, config);")
  elseif(kind STREQUAL "newton_solve")
    set(params "const ${space}& space, const ${cell}& cell, ${in3} u, ${out3} h, const paraseq::NewtonConfig& config, ${in2} h0, paraseq::NewtonStats<${space}::memory_space>* stats")
    set(function compiled_newton_solve)
    set(body "run_newton_solve<${type}>(space, cell, u, h, config, h0, stats);")
  elseif(kind STREQUAL "newton_backward")
    set(params "const ${space}& space, const ${cell}& cell, ${in3} u, ${in3} h, ${in3} g, ${out3} du, ${out1} dparams, ${in2} h0, ${out2} dh0, const paraseq::NewtonConfig& config")
    set(function compiled_newton_backward)
    set(body "run_newton_backward<${type}>(space, cell, u, h, g, du, dparams, h0, dh0, config);")
  elseif(kind STREQUAL "project_inputs")
    set(params "const ${space}& space, const paraseq::InView<${type}, 3, ${space}>& x, const paraseq::InView<${type}, 2, ${space}>& W, const paraseq::InView<${type}, 1, ${space}>& bias, ${out3} u")
    set(function compiled_project_inputs)
    set(body "run_project_inputs(space, x, W, bias, u);")
  elseif(kind STREQUAL "project_inputs_backward")
    set(params "const ${space}& space, ${in3} x, const paraseq::InView<${type}, 2, ${space}>& W, ${in3} du, ${out2} dW, ${out1} dbias, ${out3} dx")
    set(function compiled_project_inputs_backward)
    set(body "run_project_inputs_backward(space, x, W, du, dW, dbias, dx);")
  elseif(kind STREQUAL "newton_fused")
    set(instantiation "Kokkos::View<int, ${space}::memory_space> paraseq::detail::fused_newton<${type}, ${space}>(const ${space}&, const ${cell}&, ${in3}, ${out3}, ${in2}, const paraseq::NewtonConfig&, const paraseq::ScanShape&)")
  elseif(kind STREQUAL "newton_one_pass_adjoint")
    set(instantiation "Kokkos::View<${type}**, Kokkos::LayoutRight, ${space}::memory_space> paraseq::detail::one_pass_adjoint<${type}, ${space}>(const ${space}&, const ${cell}&, ${in3}, ${in3}, ${in2}, ${in3}, ${out3}, ${out2}, const paraseq::NewtonConfig&, const paraseq::ScanShape&)")
  elseif(kind MATCHES "^newton_scan")
    set(structure "${cell}::structure")
    set(quasi false)
    if(kind MATCHES "_quasi")
      set(structure "paraseq::Diagonal")
      set(quasi true)
    endif()
    set(recurrence "paraseq::detail::compiled_linearization_t<${type}, ${cell}, ${space}, ${quasi}>")
    set(instantiation "void paraseq::ordered_scan<${structure}, ${type}, ${space}, ${recurrence}>(const ${space}&, const paraseq::ScanShape&, const ${recurrence}&, const paraseq::ScanConfig&)")
  elseif(kind STREQUAL "newton_adjoint_scan")
    set(structure "${cell}::structure")
    set(recurrence "paraseq::detail::compiled_adjoint_t<${type}, ${cell}, ${space}>")
    set(instantiation "void paraseq::ordered_scan<${structure}, ${type}, ${space}, ${recurrence}>(const ${space}&, const paraseq::ScanShape&, const ${recurrence}&, const paraseq::ScanConfig&)")
  else()
    message(FATAL_ERROR "paraseq_instance: unknown kind ${kind}")
  endif()
  if(recurrence)
    set(${out_scan} "paraseq::detail::OrderedScan<${structure}, ${type}, ${space}, ${recurrence}>" PARENT_SCOPE)
  else()
    set(${out_scan} "" PARENT_SCOPE)
  endif()
  if(instantiation)
    set(${out_declaration} "extern template ${instantiation};" PARENT_SCOPE) # at global scope
    set(${out_definition} "template ${instantiation};" PARENT_SCOPE)
  else()
    set(${out_declaration} "void ${function}(${params});" PARENT_SCOPE) # in paraseq::detail
    set(${out_definition} "void paraseq::detail::${function}(${params}) {\n  ${body}\n}" PARENT_SCOPE)
  endif()
endfunction()

# One pass of a Runge-Kutta loop (loops/integrate.hpp) for a built-in field: `forward` (ode::solve's
# fused forward_pass) or `gradient` (solve_with_gradient's fused gradient_pass); `stepping` is
# FixedMesh or AdaptiveControl. Sets the explicit instantiation (without `template`/`extern template`).
function(paraseq_loop_instance out kind field_type parameters method type space stepping)
  set(ode paraseq::ode)
  set(mem "${space}::memory_space")
  set(stepping_type "${ode}::detail::${stepping}<${type}, ${mem}>")
  set(common "const std::string&, const ${space}&, const ${field_type}&, int, int, const ${ode}::detail::ForwardData<${type}>&, const ${stepping_type}&")
  if(kind STREQUAL "forward")
    set(${out} "${ode}::Report<${mem}> ${ode}::detail::forward_pass<${ode}::${method}, ${ode}::detail::Loop::fused, ${field_type}, ${type}, ${space}, ${stepping_type}, ${ode}::NoObserver>(${common}, const ${ode}::NoObserver&, bool, ${ode}::detail::Staging<${space}>&, ${ode}::detail::WorkspaceArena*)" PARENT_SCOPE)
  else()
    if(parameters STREQUAL "own")
      set(own true)
    else()
      set(own false)
    endif()
    set(${out} "${ode}::Report<${mem}> ${ode}::detail::gradient_pass<${ode}::${method}, ${ode}::detail::Loop::fused, ${own}, ${field_type}, ${type}, ${space}, ${stepping_type}>(${common}, const ${ode}::detail::GradientViews<${type}>&, const ${ode}::SolveOptions&, ${ode}::detail::Staging<${space}>&, const Kokkos::View<double*, ${mem}>&, ${ode}::detail::WorkspaceArena*)" PARENT_SCOPE)
  endif()
endfunction()

# The unit of a loop instance. Every unit pays for its own include of Kokkos (about ten seconds with
# nvcc, more than many instances' own code), so units hold several instances, up to about 40 s of
# compilation on the H200 machine (docs/performance.md, "Build cost"): on a host, one unit per field
# and kind; on a device, the forward loops of the fixed-size fields together, a fixed-size field's
# gradients, a run-time-size field's forward loops (each a kernel set per state capacity), and its
# gradients per type, of Euler and RK4 together, of Heun, and of DormandPrince5.
function(paraseq_loop_unit out kind field_name state_size method type space)
  string(REPLACE "Kokkos::" "" space_name ${space})
  set(host_space FALSE)
  if(space MATCHES "Serial|OpenMP|Threads")
    set(host_space TRUE)
  endif()
  # A forward loop compiles in less time than a unit's include of Kokkos on a host, and so does a
  # fixed-size field's on a device: their fields share units.
  if(kind STREQUAL "forward" AND (host_space OR state_size STREQUAL "fixed"))
    set(unit odeint_forward_${state_size}_size_fields_${space_name})
  elseif(host_space OR state_size STREQUAL "fixed" OR kind STREQUAL "forward")
    set(unit odeint_${kind}_${field_name}_${space_name})
  elseif(method IN_LIST PARASEQ_ETI_ADAPTIVE_METHODS)
    set(unit odeint_gradient_${field_name}_${method}_${type}_${space_name})
  else()
    set(unit odeint_gradient_${field_name}_fixed_methods_${type}_${space_name})
  endif()
  set(${out} ${unit} PARENT_SCOPE)
endfunction()

# Adds an instance's definition to a unit that holds several (written by paraseq_generate_instances),
# and its header to the unit's includes.
macro(paraseq_group_instance unit header definition)
  if(NOT "${unit}" IN_LIST grouped_units)
    list(APPEND grouped_units ${unit})
    set(unit_headers_${unit} "")
    set(unit_definitions_${unit} "")
  endif()
  if(NOT "${header}" IN_LIST unit_headers_${unit})
    list(APPEND unit_headers_${unit} ${header})
  endif()
  string(APPEND unit_definitions_${unit} "${definition}\n")
endmacro()

# Writes ${PROJECT_BINARY_DIR}/eti/<name>.cpp, which includes `headers`; an unchanged unit keeps its
# timestamp.
function(paraseq_write_unit name headers definition)
  set(unit ${PROJECT_BINARY_DIR}/eti/${name}.cpp)
  set(includes "")
  foreach(header IN LISTS headers)
    string(APPEND includes "#include <paraseq/${header}>\n")
  endforeach()
  set(content "// Generated by cmake/paraseqInstances.cmake: compiled instances of paraseq.\n${includes}\n${definition}\n")
  set(old_content "")
  if(EXISTS ${unit})
    file(READ ${unit} old_content)
  endif()
  if(NOT old_content STREQUAL content)
    file(WRITE ${unit} "${content}")
  endif()
endfunction()

function(paraseq_generate_instances sources_var)
  set(generated ${PARASEQ_GENERATED_INCLUDE_DIR}/paraseq)
  if(PARASEQ_ETI)
    set(PARASEQ_ETI_VALUE 1)
  else()
    set(PARASEQ_ETI_VALUE 0)
  endif()
  if(PARASEQ_ETI_ONLY)
    set(PARASEQ_ETI_ONLY_VALUE 1)
  else()
    set(PARASEQ_ETI_ONLY_VALUE 0)
  endif()
  if(PARASEQ_HAVE_MPI)
    set(PARASEQ_HAVE_MPI_VALUE 1)
  else()
    set(PARASEQ_HAVE_MPI_VALUE 0)
  endif()
  configure_file(${PROJECT_SOURCE_DIR}/cmake/config.hpp.in ${generated}/config.hpp @ONLY)
  set(sources)
  if(NOT PARASEQ_ETI)
    set(${sources_var} "" PARENT_SCOPE)
    return()
  endif()
  paraseq_instance_spaces(spaces)
  # kind -> the header that declares it, and the subjects it is instantiated for.
  set(header_scan core/linear_scan.hpp)
  set(header_newton solvers/newton.hpp)
  set(header_backward solvers/newton_backward.hpp)
  set(header_projection solvers/input_projection.hpp)
  set(includes_scan "")
  set(includes_projection "")
  set(includes_newton "#include <paraseq/solvers/cells.hpp>\n\n")
  set(includes_backward "#include <paraseq/solvers/cells.hpp>\n\n")
  foreach(group IN ITEMS scan newton backward projection)
    set(overloads_${group} "")
    set(externs_${group} "")
  endforeach()
  set(grouped_units "")
  foreach(space IN LISTS spaces)
    string(REPLACE "Kokkos::" "" space_name ${space})
    foreach(type IN LISTS PARASEQ_ETI_TYPES)
      set(entries "")
      foreach(structure IN LISTS PARASEQ_ETI_STRUCTURES)
        list(APPEND entries "scan|scan|${structure}" "scan|scan_reverse|${structure}")
      endforeach()
      foreach(cell IN LISTS PARASEQ_ETI_CELLS)
        list(APPEND entries "newton|newton_solve|${cell}" "newton|newton_fused|${cell}" "newton|newton_scan|${cell}"
             "backward|newton_backward|${cell}" "backward|newton_adjoint_scan|${cell}"
             "backward|newton_one_pass_adjoint|${cell}")
        # A diagonal cell's quasi Jacobian is its exact one.
        if(NOT cell STREQUAL "ParaGRU")
          list(APPEND entries "newton|newton_scan_quasi|${cell}")
        endif()
      endforeach()
      list(APPEND entries "projection|project_inputs|" "projection|project_inputs_backward|")
      foreach(entry IN LISTS entries)
        string(REPLACE "|" ";" parts "${entry}")
        list(GET parts 0 group)
        list(GET parts 1 kind)
        list(GET parts 2 subject)
        paraseq_instance(declaration definition scan ${kind} ${type} ${space} "${subject}")
        if(declaration MATCHES "^extern template")
          string(APPEND externs_${group} "${declaration}\n")
        else()
          string(APPEND overloads_${group} "${declaration}\n")
        endif()
        string(REGEX REPLACE "[^A-Za-z0-9]+" "_" subject_name "${subject}")
        string(REGEX REPLACE "_$" "" subject_name "${subject_name}")
        set(name ${kind}_${subject_name}_${type}_${space_name})
        # Most instances compile in less time than a unit's own include of Kokkos (about 9 s under
        # nvcc, for host instances too), so a unit holds several: on a host, a type's scans of every
        # structure in both directions, or a cell's solve and backward pieces; on a device, where each
        # piece takes longer, a direction's scans of the diagonal and block structures, Dense's in
        # both directions, or a cell's solve and backward pieces together. The head GRU's fused
        # kernel and solve (dense maps of up to 32 x 32) have units of their own, its scans' and
        # backward's entry pieces one together, its one-pass adjoint one. The kernels of a device
        # scan that take tens of seconds each have units of their own (below); the other cells'
        # one-pass adjoints join the kernels of their adjoint's scan.
        if(group STREQUAL "projection") # three small GEMMs and two reductions
          set(unit projection_${space_name})
        elseif(space MATCHES "Serial|OpenMP|Threads")
          if(group STREQUAL "scan")
            set(unit scan_${type}_${space_name})
          else()
            set(unit newton_${subject_name}_${type}_${space_name})
          endif()
        elseif(group STREQUAL "scan")
          if(subject STREQUAL "Dense")
            set(unit scan_Dense_${type}_${space_name})
          else()
            set(unit ${kind}_Diagonal_BlockDiagonal_${type}_${space_name})
          endif()
        elseif(kind STREQUAL "newton_one_pass_adjoint" AND subject STREQUAL "ParaGRUHeads")
          set(unit ${name})
        elseif(kind STREQUAL "newton_one_pass_adjoint")
          set(unit newton_adjoint_pieces_${subject_name}_${type}_${space_name})
        elseif(subject STREQUAL "ParaGRUHeads")
          if(kind MATCHES "^newton_(solve|fused)$")
            set(unit ${name})
          else()
            set(unit newton_pieces_${subject_name}_${type}_${space_name})
          endif()
        else()
          set(unit newton_${subject_name}_${type}_${space_name})
        endif()
        paraseq_group_instance(${unit} ${header_${group}} "${definition}")
        if(scan AND NOT space MATCHES "Serial|OpenMP|Threads")
          foreach(tag IN LISTS PARASEQ_ETI_DEVICE_SCAN_KERNELS)
            set(kernel "struct paraseq::detail::ScanKernel<${scan}, paraseq::detail::${tag}>")
            string(APPEND externs_${group} "extern template ${kernel};\n")
            # A head GRU scan's two kernels compile in about 20 s, ParaSLSTM's (diagonal maps) in
            # about 5 s each: its forward scans' four share a unit, its adjoint's two join its
            # one-pass adjoint, as does the Apply kernel of the other cells' adjoint scans.
            if(subject STREQUAL "ParaGRUHeads")
              set(kernel_unit ${name}_kernels)
            elseif(subject STREQUAL "ParaSLSTM" AND group STREQUAL "newton")
              set(kernel_unit newton_scan_kernels_${subject_name}_${type}_${space_name})
            elseif(group STREQUAL "backward" AND (subject STREQUAL "ParaSLSTM" OR tag STREQUAL "ApplyTag"))
              set(kernel_unit newton_adjoint_pieces_${subject_name}_${type}_${space_name})
            else()
              string(REPLACE "Tag" "" tag_name ${tag})
              set(kernel_unit ${name}_${tag_name})
            endif()
            paraseq_group_instance(${kernel_unit} ${header_${group}} "template ${kernel};")
          endforeach()
        endif()
      endforeach()
    endforeach()
  endforeach()
  set(externs_loops "")
  foreach(space IN LISTS spaces)
    foreach(field IN LISTS PARASEQ_ETI_FIELDS)
      string(REPLACE "|" ";" parts "${field}")
      list(GET parts 0 field_name)
      list(GET parts 1 field_type)
      list(GET parts 2 parameters)
      list(GET parts 3 state_size)
      foreach(kind IN ITEMS forward gradient)
        foreach(type IN LISTS PARASEQ_ETI_TYPES)
          foreach(method IN LISTS PARASEQ_ETI_FIXED_METHODS PARASEQ_ETI_ADAPTIVE_METHODS)
            set(steppings FixedMesh)
            if(method IN_LIST PARASEQ_ETI_ADAPTIVE_METHODS)
              list(APPEND steppings AdaptiveControl)
            endif()
            foreach(stepping IN LISTS steppings)
              paraseq_loop_instance(instance ${kind} "${field_type}" ${parameters} ${method} ${type} ${space} ${stepping})
              string(APPEND externs_loops "extern template ${instance};\n")
              paraseq_loop_unit(unit ${kind} ${field_name} ${state_size} ${method} ${type} ${space})
              paraseq_group_instance(${unit} loops/integrate.hpp "template ${instance};")
            endforeach()
          endforeach()
        endforeach()
      endforeach()
    endforeach()
  endforeach()
  # The device units first, the loops' (the longest) before the others: Ninja starts units in the
  # order of the sources, so a parallel build ends with the short ones, not waiting for a long one.
  set(host_units ${grouped_units})
  list(FILTER host_units INCLUDE REGEX "_(Serial|OpenMP|Threads)$")
  set(device_units ${grouped_units})
  list(FILTER device_units EXCLUDE REGEX "_(Serial|OpenMP|Threads)$")
  set(device_loop_units ${device_units})
  list(FILTER device_loop_units INCLUDE REGEX "^odeint_")
  list(FILTER device_units EXCLUDE REGEX "^odeint_")
  foreach(unit IN LISTS device_loop_units device_units host_units)
    paraseq_write_unit(${unit} "${unit_headers_${unit}}" "${unit_definitions_${unit}}")
    list(APPEND sources ${PROJECT_BINARY_DIR}/eti/${unit}.cpp)
  endforeach()
  set(intro "// Generated by cmake/paraseqInstances.cmake: the compiled instances of paraseq, declared so that\n// the code that includes this does not instantiate them again. Included by the public header.\n")
  foreach(group IN ITEMS scan newton backward projection)
    set(content_${group} "#pragma once\n${intro}\n${includes_${group}}namespace paraseq::detail {\n${overloads_${group}}} // namespace paraseq::detail\n\n${externs_${group}}")
  endforeach()
  file(CONFIGURE OUTPUT ${generated}/eti/linear_scan_instances.hpp CONTENT "${content_scan}" @ONLY)
  file(CONFIGURE OUTPUT ${generated}/eti/newton_instances.hpp CONTENT "${content_newton}" @ONLY)
  file(CONFIGURE OUTPUT ${generated}/eti/newton_backward_instances.hpp CONTENT "${content_backward}" @ONLY)
  file(CONFIGURE OUTPUT ${generated}/eti/input_projection_instances.hpp CONTENT "${content_projection}" @ONLY)
  file(CONFIGURE OUTPUT ${generated}/eti/integrate_instances.hpp
       CONTENT "#pragma once\n${intro}\n#include <paraseq/loops/fields.hpp>\n\n${externs_loops}" @ONLY)
  set(${sources_var} ${sources} PARENT_SCOPE)
endfunction()
