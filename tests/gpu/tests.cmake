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

# The NCCL communicator (tests/gpu/test_comm_nccl.c): one rank booted from the single
# communicator (gpu.comm_nccl), and two under mpirun (gpu.comm_nccl_np2, through
# tests/dist/run_mpi.sh), each rank on its own GPU. Skipped (77, "SKIP: ...") without a GPU per
# rank, without NCCL (in the build or libnccl.so.2 at run time), or without mpirun.
add_executable(test_comm_nccl ${CMAKE_SOURCE_DIR}/tests/gpu/test_comm_nccl.c)
target_include_directories(test_comm_nccl PRIVATE ${CMAKE_SOURCE_DIR}/src ${CMAKE_SOURCE_DIR}/tests/unit)
target_link_libraries(test_comm_nccl PRIVATE kiln)
if(KILN_CUDA)
  target_compile_definitions(test_comm_nccl PRIVATE KILN_TEST_CUDA=1) # each rank picks its GPU
endif()
set_target_properties(test_comm_nccl PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
include(${CMAKE_SOURCE_DIR}/tests/dist/mpirun.cmake)
add_test(NAME gpu.comm_nccl COMMAND test_comm_nccl)
add_test(NAME gpu.comm_nccl_np2
  COMMAND sh ${CMAKE_SOURCE_DIR}/tests/dist/run_mpi.sh 2 ok $<TARGET_FILE:test_comm_nccl>)
set_tests_properties(gpu.comm_nccl gpu.comm_nccl_np2 PROPERTIES LABELS gpu SKIP_RETURN_CODE 77
  TIMEOUT 300 ENVIRONMENT "KILN_MPIRUN=${KILN_MPIRUN};OMP_NUM_THREADS=1;ASAN_OPTIONS=detect_leaks=0")
