# kiln's preemption under a real Slurm on this machine (label "slurm"): munged, slurmctld and
# slurmd started under a temporary slurm.conf, a low-priority job preempted by a high-priority
# one, requeued and resumed to the same final weights as a run never stopped. It installs
# Debian's slurm-wlm and munge with apt-get when they are missing, and exits 77 (skipped, with
# the reason) where it cannot: not root, no apt-get, daemons that cannot run in a container.
add_test(NAME slurm.preemption COMMAND bash ${CMAKE_SOURCE_DIR}/tests/slurm/test_slurm.sh)
set_tests_properties(slurm.preemption PROPERTIES
  LABELS slurm TIMEOUT 900 SKIP_RETURN_CODE 77 RUN_SERIAL ON
  ENVIRONMENT "KILN_BIN=${CMAKE_BINARY_DIR}/kiln;KILN_SOURCE_DIR=${CMAKE_SOURCE_DIR};OMP_NUM_THREADS=1")
