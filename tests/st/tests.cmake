# safetensors cross-check with PyTorch, label "ref": files kiln writes (generic tensors and
# GPT-2 weights) are parsed by hand in Python (json + torch.frombuffer) and must hold what kiln
# meant; files written in Python (every F16 and BF16 bit pattern, Hugging Face-style GPT-2
# weights) must read and load into kiln with torch's values, bit for bit. Mixed precision: kiln
# stores fp32/bf16/fp16-held tensors as F32/BF16/F16 with torch's rounding and reads torch's
# F32/BF16/F16 as each of the three, refusing fp16 overflow and a dtype that disagrees with
# the file's declared one, the tensor named. Needs a Python
# with torch (Debian's python3-torch); without it the test says why and exits 77 (skipped).
set(KILN_TORCH_PYTHON /usr/bin/python3 CACHE FILEPATH
    "Python interpreter that can import torch, for the reference tests")

add_executable(st_tool ${CMAKE_SOURCE_DIR}/tests/st/st_tool.c)
target_link_libraries(st_tool PRIVATE kiln)
set_target_properties(st_tool PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)

if(EXISTS ${KILN_TORCH_PYTHON})
  add_test(NAME st.python_cross_check
    COMMAND ${KILN_TORCH_PYTHON} ${CMAKE_SOURCE_DIR}/tests/st/check_safetensors.py
      $<TARGET_FILE:st_tool> ${CMAKE_BINARY_DIR}/st_python)
else()
  add_test(NAME st.python_cross_check
    COMMAND sh -c "echo 'SKIP: this test needs PyTorch: ${KILN_TORCH_PYTHON} does not exist (set KILN_TORCH_PYTHON, or apt-get install python3-torch)' >&2; exit 77")
endif()
set_tests_properties(st.python_cross_check PROPERTIES LABELS ref TIMEOUT 120 SKIP_RETURN_CODE 77
  ENVIRONMENT "OMP_NUM_THREADS=2")
