# GPU tests, label "gpu": the CUDA backend's every op against the reference backend, and the
# model on it against the CPU model. They build in every configuration (without CUDA the
# backend's entry points say it is absent) and exit 77, which CTest shows as skipped, with
# "SKIP: no CUDA GPU (reason)" when no usable GPU is present. tests/gpu/run.sh runs them on
# a GPU machine, with the op timings and a short training run.
foreach(name test_cuda_ops test_cuda_model)
  add_executable(${name} ${CMAKE_SOURCE_DIR}/tests/gpu/${name}.c)
  target_link_libraries(${name} PRIVATE kiln)
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
endforeach()
add_test(NAME gpu.cuda_ops COMMAND test_cuda_ops)
add_test(NAME gpu.cuda_model COMMAND test_cuda_model)
set_tests_properties(gpu.cuda_ops gpu.cuda_model PROPERTIES LABELS gpu SKIP_RETURN_CODE 77
  TIMEOUT 600 ENVIRONMENT "OMP_NUM_THREADS=2;OMP_WAIT_POLICY=passive")
