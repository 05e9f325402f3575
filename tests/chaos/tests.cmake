# Chaos tests (tests/chaos/chaos.py), label "chaos": 20 SIGKILLs at random moments of a run
# under `kiln run`, in one process and of one rank of two under mpirun, each ending with the
# uninterrupted run's weights byte for byte; 12 random damages of checkpoint files (truncated,
# a bit flipped, deleted, `latest` elsewhere) detected, with the resumed runs ending the same;
# every checkpoint damaged refused. On the cli tests' fixture; more kills: the same script
# with --kills N (bench/README.md).
include(${CMAKE_SOURCE_DIR}/tests/dist/mpirun.cmake)
set(KILN_CHAOS ${CMAKE_SOURCE_DIR}/tests/chaos/chaos.py)
set(KILN_CHAOS_ENV "KILN_BIN=${CMAKE_BINARY_DIR}/kiln;KILN_CLI_WORK=${CMAKE_BINARY_DIR}/cli-work;KILN_MPIRUN=${KILN_MPIRUN};OMP_NUM_THREADS=1;OMP_WAIT_POLICY=passive")
add_test(NAME chaos.kills COMMAND /usr/bin/python3 ${KILN_CHAOS} kills --kills 20 --seed 1)
add_test(NAME chaos.kills_mpi COMMAND /usr/bin/python3 ${KILN_CHAOS} kills --np 2 --kills 20 --seed 2)
add_test(NAME chaos.damage COMMAND /usr/bin/python3 ${KILN_CHAOS} damage --damages 12 --seed 3)
set_tests_properties(chaos.kills chaos.kills_mpi chaos.damage PROPERTIES
  LABELS chaos FIXTURES_REQUIRED cli_fixture TIMEOUT 600 SKIP_RETURN_CODE 77
  ENVIRONMENT "${KILN_CHAOS_ENV}")
