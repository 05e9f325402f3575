# Reference tests, label "ref": kiln's GPT-2 tokenizer against tiktoken (the npm package,
# gpt2 encoding), through `kiln tokenizer encode/decode`. tests/tok/ref_tiktoken.js:
#   ref.tok_hard         generated hard cases (each alone, then all as one text)
#   ref.tok_unicode      every code point of planes 0-3 and 14 (the rest sampled) in contexts
#   ref.tok_shakespeare  tinyshakespeare from ../shared/data (or $KILN_SHARED_DATA), one and
#                        two threads
#   ref.tok_brown        the Brown corpus, whole and per document
#   ref.tok_fuzz_N       seeded random texts, a differential test (seed N, 3000 texts)
#   ref.tok_bytes        input that is not UTF-8 must round-trip
# tiktoken and the Brown corpus come from scripts/setup.sh (deps/npm), tinyshakespeare from
# the shared test data. A test whose input (or node) is absent says so and exits 77, which
# CTest reports as skipped; one that compared nothing fails.
find_program(KILN_NODE node)
set(tok_script ${CMAKE_SOURCE_DIR}/tests/tok/ref_tiktoken.js)
foreach(mode hard unicode shakespeare brown fuzz_1 fuzz_2 bytes)
  string(REGEX REPLACE "_[0-9]+$" "" tok_mode ${mode})
  set(tok_extra "")
  if(mode MATCHES "^fuzz_([0-9]+)$")
    set(tok_extra --seed ${CMAKE_MATCH_1} --count 3000)
  endif()
  if(KILN_NODE)
    add_test(NAME ref.tok_${mode}
      COMMAND ${KILN_NODE} ${tok_script} ${tok_mode} --kiln $<TARGET_FILE:kiln_cli>
              --root ${CMAKE_SOURCE_DIR} --work ${CMAKE_BINARY_DIR}/ref/tok_${mode} ${tok_extra})
  else()
    add_test(NAME ref.tok_${mode}
      COMMAND sh -c "echo 'SKIP: the tokenizer reference tests need node (scripts/setup.sh installs it)' >&2; exit 77")
  endif()
  set_tests_properties(ref.tok_${mode} PROPERTIES LABELS ref TIMEOUT 300 SKIP_RETURN_CODE 77
    ENVIRONMENT "KILN_GPT2_DIR=${CMAKE_SOURCE_DIR}/deps/gpt2;OMP_NUM_THREADS=2")
endforeach()

# Hugging Face tokenizer.json against tokenizers.js (npm @huggingface/tokenizers), label "ref":
# tests/tok/ref_hf.js on the files of @lenml/tokenizer-{llama3,qwen2_5,llama2,gemma}:
#   ref.hf_MODEL_hard     hard cases, each alone and all as one text
#   ref.hf_MODEL_unicode  every code point of planes 0-3 and 14 (the rest sampled) in contexts
#   ref.hf_MODEL_brown    the Brown corpus as one text, and a long mixed-script text
#   ref.hf_MODEL_fuzz     2000 seeded random texts
# tokenizers.js takes minutes on the whole corpus with Llama 2's and Gemma's tokenizers (it
# runs BPE over the whole text as one word), hence the longer timeout.
set(hf_script ${CMAKE_SOURCE_DIR}/tests/tok/ref_hf.js)
foreach(model llama3 qwen2_5 llama2 gemma)
  foreach(mode hard unicode brown fuzz)
    set(name ref.hf_${model}_${mode})
    if(KILN_NODE)
      add_test(NAME ${name}
        COMMAND ${KILN_NODE} ${hf_script} ${model} ${mode} --kiln $<TARGET_FILE:kiln_cli>
                --root ${CMAKE_SOURCE_DIR} --work ${CMAKE_BINARY_DIR}/ref/hf_${model}_${mode})
    else()
      add_test(NAME ${name}
        COMMAND sh -c "echo 'SKIP: the tokenizer reference tests need node (scripts/setup.sh installs it)' >&2; exit 77")
    endif()
    set_tests_properties(${name} PROPERTIES LABELS ref TIMEOUT 600 SKIP_RETURN_CODE 77)
  endforeach()
endforeach()
