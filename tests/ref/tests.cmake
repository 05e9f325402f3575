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
# c: T = 1 (a single position); d: heads narrower than n_embd / n_head and an MLP of no
# multiple of n_embd (a structurally pruned model's shape).
# la, lb, lc: Llamas (tests/ref/llama_model.py): one key/value head and a tied head; 2 of 6
# with heads of 10, an untied head and V = 1001; 4 of 4 with heads of 10 and T = 9.
foreach(case a b c d la lb lc)
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

# bf16 training against PyTorch's CPU bf16 autocast (fp32 master weights) and float64, for
# the first AdamW steps: ref.bf16_gen runs tests/ref/gpt_ref_bf16.py into <build>/ref/bf16,
# ref.bf16 the C driver on it (ref.bf16_llama_mqa and ref.bf16_llama_mha: the Llamas); all
# skip (77) without PyTorch, as above.
add_executable(test_ref_bf16 ${CMAKE_SOURCE_DIR}/tests/ref/test_ref_bf16.c)
target_include_directories(test_ref_bf16 PRIVATE ${CMAKE_SOURCE_DIR}/tests/unit)
target_link_libraries(test_ref_bf16 PRIVATE kiln)
set_target_properties(test_ref_bf16 PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
foreach(case gpt2 llama_mqa llama_mha)
  if(case STREQUAL "gpt2")
    set(name bf16)
  else()
    set(name bf16_${case})
  endif()
  set(dir ${CMAKE_BINARY_DIR}/ref/${name})
  if(EXISTS ${KILN_TORCH_PYTHON})
    add_test(NAME ref.${name}_gen
      COMMAND ${KILN_TORCH_PYTHON} ${CMAKE_SOURCE_DIR}/tests/ref/gpt_ref_bf16.py --case ${case}
              --out ${dir})
  else()
    set(msg "reference tests need PyTorch: ${KILN_TORCH_PYTHON} does not exist")
    set(msg "${msg} (set KILN_TORCH_PYTHON, or apt-get install python3-torch)")
    add_test(NAME ref.${name}_gen
      COMMAND sh -c "rm -f '${dir}/manifest.txt'; echo 'SKIP: ${msg}' >&2; exit 77")
  endif()
  set_tests_properties(ref.${name}_gen PROPERTIES
    LABELS ref FIXTURES_SETUP ref_${name} TIMEOUT 120 SKIP_RETURN_CODE 77
    ENVIRONMENT "OMP_NUM_THREADS=2")
  add_test(NAME ref.${name} COMMAND test_ref_bf16 ${dir} WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
  set_tests_properties(ref.${name} PROPERTIES
    LABELS ref FIXTURES_REQUIRED ref_${name} TIMEOUT 120 SKIP_RETURN_CODE 77
    ENVIRONMENT "OMP_NUM_THREADS=2")
endforeach()
