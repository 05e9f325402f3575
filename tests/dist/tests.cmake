# Multi-process tests of kiln_comm, label "dist": tests/dist/test_comm_mpi.c under mpirun
# (tests/dist/run_mpi.sh) with 2, 3 and 4 ranks (more ranks than cores: oversubscribed),
# and jobs whose rank 1 dies mid-allreduce (it exits, is killed, calls kiln_comm_abort),
# which must end at once with a non-zero status rather than hang. Skipped (exit 77) when kiln is built without MPI
# or no mpirun is found.
add_executable(test_comm_mpi ${CMAKE_SOURCE_DIR}/tests/dist/test_comm_mpi.c)
target_include_directories(test_comm_mpi PRIVATE ${CMAKE_SOURCE_DIR}/src ${CMAKE_SOURCE_DIR}/tests/unit)
target_link_libraries(test_comm_mpi PRIVATE kiln)
set_target_properties(test_comm_mpi PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)

include(${CMAKE_SOURCE_DIR}/tests/dist/mpirun.cmake)

# LeakSanitizer (KILN_SANITIZE) counts what Open MPI keeps until exit as leaks.
set(KILN_DIST_ENV "KILN_MPIRUN=${KILN_MPIRUN}" "OMP_NUM_THREADS=1" "ASAN_OPTIONS=detect_leaks=0")
set(KILN_DIST_RUN sh ${CMAKE_SOURCE_DIR}/tests/dist/run_mpi.sh)
foreach(np 2 3 4)
  add_test(NAME dist.comm_np${np} COMMAND ${KILN_DIST_RUN} ${np} ok $<TARGET_FILE:test_comm_mpi>)
endforeach()
# Ranks on several machines, simulated (KILN_COMM_NODE_RANKS: machines of that many ranks):
# shared memory on each machine and MPI between them give what one machine gives.
add_test(NAME dist.comm_np4_machines2 COMMAND ${KILN_DIST_RUN} 4 ok $<TARGET_FILE:test_comm_mpi>)
add_test(NAME dist.comm_np6_machines3 COMMAND ${KILN_DIST_RUN} 6 ok $<TARGET_FILE:test_comm_mpi>)
set_tests_properties(dist.comm_np4_machines2 PROPERTIES LABELS dist TIMEOUT 120 SKIP_RETURN_CODE 77
  ENVIRONMENT "${KILN_DIST_ENV};KILN_COMM_NODE_RANKS=2")
set_tests_properties(dist.comm_np6_machines3 PROPERTIES LABELS dist TIMEOUT 120 SKIP_RETURN_CODE 77
  ENVIRONMENT "${KILN_DIST_ENV};KILN_COMM_NODE_RANKS=3")
add_test(NAME dist.comm_dead_exit COMMAND ${KILN_DIST_RUN} 4 dead:3 $<TARGET_FILE:test_comm_mpi> dead-exit)
add_test(NAME dist.comm_dead_kill COMMAND ${KILN_DIST_RUN} 4 dead:137 $<TARGET_FILE:test_comm_mpi> dead-kill)
add_test(NAME dist.comm_abort COMMAND ${KILN_DIST_RUN} 4 dead:6 $<TARGET_FILE:test_comm_mpi> abort)
# Without mpirun but with srun's variables: an MPI that cannot see the launch must be refused.
add_test(NAME dist.comm_srun_singleton COMMAND $<TARGET_FILE:test_comm_mpi> srun-singleton)
set_tests_properties(dist.comm_srun_singleton PROPERTIES LABELS dist TIMEOUT 60 SKIP_RETURN_CODE 77
  ENVIRONMENT "SLURM_NTASKS=2;SLURM_PROCID=1;OMP_NUM_THREADS=1;ASAN_OPTIONS=detect_leaks=0")
set_tests_properties(dist.comm_np2 dist.comm_np3 dist.comm_np4 dist.comm_dead_exit dist.comm_dead_kill
  dist.comm_abort
  PROPERTIES LABELS dist TIMEOUT 120 SKIP_RETURN_CODE 77 ENVIRONMENT "${KILN_DIST_ENV}")

# Data-parallel training end to end: each case_<name> of tests/dist/test_train_dp.sh is one
# CTest test, dist.train.<name>; of test_elastic.sh (resuming on another number of ranks or
# ZeRO stage), dist.elastic.<name>; of test_watchdog_dp.sh (stragglers and hangs on 2 ranks),
# dist.watchdog.<name>. All on the cli tests' fixture.
set(KILN_DIST_CASE_ENV "KILN_BIN=${CMAKE_BINARY_DIR}/kiln" "KILN_SOURCE_DIR=${CMAKE_SOURCE_DIR}"
  "KILN_CLI_WORK=${CMAKE_BINARY_DIR}/cli-work" "KILN_MPIRUN=${KILN_MPIRUN}" "OMP_NUM_THREADS=1"
  "ASAN_OPTIONS=detect_leaks=0")
kiln_add_case_tests(${CMAKE_SOURCE_DIR}/tests/dist/test_train_dp.sh dist.train dist 300
  "${KILN_DIST_CASE_ENV}")
kiln_add_case_tests(${CMAKE_SOURCE_DIR}/tests/dist/test_elastic.sh dist.elastic dist 300
  "${KILN_DIST_CASE_ENV}")
kiln_add_case_tests(${CMAKE_SOURCE_DIR}/tests/dist/test_watchdog_dp.sh dist.watchdog dist 120
  "${KILN_DIST_CASE_ENV}")
