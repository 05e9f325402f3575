# KILN_MPIRUN: the mpirun of the MPI kiln links (empty: none, or kiln built without MPI).
include_guard(GLOBAL)
set(KILN_MPIRUN "")
if(KILN_MPI AND MPI_C_FOUND)
  # FindMPI's mpiexec belongs to the MPI kiln links; another MPI's would start singletons.
  if(MPIEXEC_EXECUTABLE)
    set(KILN_MPIRUN ${MPIEXEC_EXECUTABLE})
  else()
    find_program(KILN_MPIRUN_PROGRAM NAMES mpirun mpiexec)
    if(KILN_MPIRUN_PROGRAM)
      set(KILN_MPIRUN ${KILN_MPIRUN_PROGRAM})
    endif()
  endif()
endif()
if(NOT KILN_MPIRUN)
  message(STATUS "dist tests: no MPI or no mpirun, they will be skipped")
endif()

