# Optimizers against torch.optim (labelled "ref"): optim_ref.py writes the expected values,
# test_optim_ref checks both the reference and the CPU backend against them. Without torch
# the test is skipped (exit 77), and says so.
add_executable(test_optim_ref ${CMAKE_SOURCE_DIR}/tests/optim/test_optim_ref.c)
target_link_libraries(test_optim_ref PRIVATE kiln)
set_target_properties(test_optim_ref PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
add_test(NAME ref.optim
  COMMAND sh ${CMAKE_SOURCE_DIR}/tests/optim/run_ref.sh $<TARGET_FILE:test_optim_ref>
          ${CMAKE_BINARY_DIR}/tests/optim_ref.bin
  WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
set_tests_properties(ref.optim PROPERTIES LABELS ref TIMEOUT 120 SKIP_RETURN_CODE 77
  ENVIRONMENT "OMP_NUM_THREADS=2")
