# Reference tests, label "ref": kiln's whole GPT-2 (forward, backward, AdamW) against
# PyTorch, and a finite-difference check of kiln's gradients.
#
# For each case, ref.gpt_gen_<case> runs tests/ref/gpt_ref.py with a Python that has
# PyTorch (Debian's python3-torch) to write the weights and the expected values into
# <build>/ref/gpt_<case>; ref.gpt_<case> then runs the C driver on them. Without PyTorch
# the generator says why and exits 77, and the driver, finding no expected values, too:
# CTest shows both as skipped, never as passed.
set(KILN_TORCH_PYTHON /usr/bin/python3 CACHE FILEPATH
    "Python interpreter that can import torch, for the reference tests")

add_executable(test_ref_gpt ${CMAKE_SOURCE_DIR}/tests/ref/test_ref_gpt.c)
target_include_directories(test_ref_gpt PRIVATE ${CMAKE_SOURCE_DIR}/tests/unit)
target_link_libraries(test_ref_gpt PRIVATE kiln)
set_target_properties(test_ref_gpt PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)

# a: round sizes; b: head size 12, V = 1001 (no multiple of 128), T = 23 < maxT = 40;
# c: T = 1 (a single position).
foreach(case a b c)
  set(dir ${CMAKE_BINARY_DIR}/ref/gpt_${case})
  if(EXISTS ${KILN_TORCH_PYTHON})
    add_test(NAME ref.gpt_gen_${case}
      COMMAND ${KILN_TORCH_PYTHON} ${CMAKE_SOURCE_DIR}/tests/ref/gpt_ref.py
              --case ${case} --out ${dir})
  else()
    set(msg "reference tests need PyTorch: ${KILN_TORCH_PYTHON} does not exist")
    set(msg "${msg} (set KILN_TORCH_PYTHON, or apt-get install python3-torch)")
    add_test(NAME ref.gpt_gen_${case}
      COMMAND sh -c "rm -f '${dir}/manifest.txt'; echo 'SKIP: ${msg}' >&2; exit 77")
  endif()
  set_tests_properties(ref.gpt_gen_${case} PROPERTIES
    LABELS ref FIXTURES_SETUP ref_gpt_${case} TIMEOUT 120 SKIP_RETURN_CODE 77
    ENVIRONMENT "OMP_NUM_THREADS=2")
  add_test(NAME ref.gpt_${case} COMMAND test_ref_gpt ${dir} WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(ref.gpt_${case} PROPERTIES
    LABELS ref FIXTURES_REQUIRED ref_gpt_${case} TIMEOUT 120 SKIP_RETURN_CODE 77
    ENVIRONMENT "OMP_NUM_THREADS=2")
endforeach()

add_test(NAME ref.gpt_fd COMMAND test_ref_gpt --fd WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
set_tests_properties(ref.gpt_fd PROPERTIES LABELS ref TIMEOUT 120 ENVIRONMENT "OMP_NUM_THREADS=2")
