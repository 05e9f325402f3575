#!/bin/sh
# Llama models through the kiln command: a preset and a Hugging Face config.json train and
# lower the loss; the weights carry Hugging Face Llama names and sample back; a run killed
# after a checkpoint and resumed ends with the same bytes as one never interrupted; bf16 and
# fp16 train, with recomputation, distillation and pruning; what is built for GPT-2 only (quantization, structured pruning,
# low-rank) says so by name; configurations kiln cannot run are refused before anything is
# written.
. "$(dirname "$0")/lib.sh"

LLAMA="--model llama-d4 --layers 2 --embd 64 --heads 4 --context 32 --peak-gflops 100"
TRAIN="train $LLAMA --seq 16 --batch 4 --threads 1 --data $DATA"

# hf_config FILE KEY-VALUES...: a Hugging Face Llama config.json of a small model, with more
# keys (JSON text) at its end.
hf_config() {
    _f=$1
    shift
    printf '{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
 "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
 "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 10000.0,
 "tie_word_embeddings": false, "max_position_embeddings": 32, "hidden_act": "silu"%s}\n' \
        "$*" >"$_f"
}

# first_loss / last_loss: the loss of the first and the last step in the run's metrics.
first_loss() { sed -n 's/.*"loss": *\([0-9.]*\).*/\1/p' "$1" | head -n 1; }
last_loss() { sed -n 's/.*"loss": *\([0-9.]*\).*/\1/p' "$1" | tail -n 1; }
lower() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a + 0 < b - 0.5) }'; }

case_preset_trains_and_samples() {
    need_fixture
    run $TRAIN --steps 60 --lr 3e-3 --metrics m.jsonl --save l.safetensors
    expect_ok
    expect_out_re 'model: llama: 2 key/value heads, RMSNorm eps 1e-05, rotary base 10000'
    check "the loss fell by half a nat at least ($(first_loss m.jsonl) to $(last_loss m.jsonl))" \
        lower "$(last_loss m.jsonl)" "$(first_loss m.jsonl)"
    check "the weights have Hugging Face Llama names" \
        grep -aq 'model.layers.1.self_attn.k_proj.weight' l.safetensors
    check "and no GPT-2 ones" sh -c "! grep -aq 'wte.weight' l.safetensors"
    run sample --weights l.safetensors --tokenizer bytes --tokens 20 --seed 3
    expect_ok
    cp "$W/stdout" s1
    run sample --weights l.safetensors --tokenizer bytes --tokens 20 --seed 3 \
        --no-cache
    expect_ok
    check "sampling with the cache and without gives the same text" same_file s1 "$W/stdout"
}

case_hf_config_json() {
    need_fixture
    hf_config config.json
    run train --model config.json --seq 16 --batch 4 --threads 1 --data "$DATA" --steps 20 \
        --save hf.safetensors --peak-gflops 100
    expect_ok
    expect_out_re 'model: llama: 2 key/value heads, RMSNorm eps 1e-06'
    check "an untied head is saved as lm_head.weight" grep -aq 'lm_head.weight' hf.safetensors
    # past the 32 positions generation goes on with the cache (rotary positions slide)
    run sample --weights hf.safetensors --tokenizer bytes --tokens 90 --seed 5
    expect_ok
    cp "$W/stdout" long1
    check "90 tokens sampled past the 32 positions ($(wc -c <long1) bytes)" \
        test "$(wc -c <long1)" -ge 90
    run sample --weights hf.safetensors --tokenizer bytes --tokens 90 --seed 5
    check "and the same again" same_file long1 "$W/stdout"
    # what changes the math and is not supported is refused by name, and nothing written
    for kv in '"rope_scaling": {"type": "linear", "factor": 4.0}' '"attention_bias": true' \
        '"hidden_act": "gelu"' '"mlp_bias": true'; do
        hf_config bad.json ", $kv"
        sed -i 's/"hidden_act": "silu", "hidden_act"/"hidden_act"/' bad.json
        rm -f bad.safetensors
        run train --model bad.json --seq 16 --batch 4 --threads 1 --data "$DATA" --steps 2 \
            --save bad.safetensors
        expect_fail
        expect_err "$(echo "$kv" | sed 's/^"\([a-z_]*\)".*/\1/')"
        check "nothing saved for $kv" test ! -e bad.safetensors
    done
    hf_config bad.json ', "num_key_value_heads": 3'
    sed -i 's/"num_key_value_heads": 2, //' bad.json
    run train --model bad.json --seq 16 --batch 4 --threads 1 --data "$DATA" --steps 2
    expect_fail
    expect_err "n_kv_head 3 does not divide n_head 4"
    printf '{"model_type": "qwen2", "hidden_size": 64}\n' >q.json
    run train --model q.json --seq 16 --batch 4 --threads 1 --data "$DATA" --steps 2
    expect_fail
    expect_err 'model_type "qwen2" is not one kiln builds'
}

case_resume_exact() {
    need_fixture
    CK="--checkpoint-dir ck --checkpoint-every 10"
    run $TRAIN --steps 40 --save ref.st
    expect_ok
    LAST="kiln $TRAIN --steps 40 $CK --save res.st (killed during the step-30 write)"
    KILN_TEST_CHECKPOINT_KILL=30 "$KILN" $TRAIN --steps 40 $CK --save res.st </dev/null \
        >"$W/stdout" 2>"$W/stderr"
    RC=$?
    check "the run was killed (status $RC)" test "$RC" -eq 137
    run $TRAIN --steps 40 $CK --save res.st --resume ck
    expect_ok
    expect_out_re 'resumed from ck/step_00000020: step 20 of 40'
    check "the resumed run's weights equal the uninterrupted run's" same_file ref.st res.st
    check "state.json names the family" grep -q '"family":[[:space:]]*"llama"' ck/step_00000040/state.json
    # a GPT-2 run does not take a Llama's checkpoint
    run train --layers 2 --heads 4 --embd 64 --context 32 --seq 16 --batch 4 --threads 1 \
        --data "$DATA" --steps 40 --resume ck --checkpoint-dir ck2 --checkpoint-every 10
    expect_fail
    expect_err "llama"
}

case_bf16_trains() {
    need_fixture
    run $TRAIN --steps 60 --lr 3e-3 --precision bf16 --metrics m.jsonl --save b.safetensors
    expect_ok
    check "bf16: the loss fell by half a nat at least ($(first_loss m.jsonl) to $(last_loss m.jsonl))" \
        lower "$(last_loss m.jsonl)" "$(first_loss m.jsonl)"
}

# fp16 with its loss scaler, recomputation, distillation from a Llama teacher, magnitude pruning
# and the memory plan run for a Llama as for GPT-2.
case_other_features() {
    need_fixture
    run $TRAIN --steps 40 --lr 3e-3 --precision fp16 --metrics f16.jsonl --save f16.st
    expect_ok
    check "fp16: the loss fell ($(first_loss f16.jsonl) to $(last_loss f16.jsonl))" \
        lower "$(last_loss f16.jsonl)" "$(first_loss f16.jsonl)"
    run $TRAIN --steps 10 --recompute block --precision bf16 --save r.st
    expect_ok
    run $TRAIN --steps 10 --teacher f16.st --save s.st
    expect_ok
    run $TRAIN --steps 10 --prune-sparsity 0.5 --save p.st
    expect_ok
    run $TRAIN --plan
    expect_ok
    expect_out_re 'memory plan: parameters'
}

case_gpt2_only_features_refused() {
    need_fixture
    run $TRAIN --steps 2 --save l.safetensors
    expect_ok
    run compress quantize --weights l.safetensors --out q.safetensors
    expect_fail
    expect_err "quantization is for gpt2 models"
    check "no quantized file written" test ! -e q.safetensors
    run train $LLAMA --seq 16 --batch 4 --threads 1 --data "$DATA" --steps 2 --qat 8
    expect_fail
    expect_err "quantization-aware training is for gpt2 models"
}
main "$@"
