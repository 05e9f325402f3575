// tokenizers.js (npm @huggingface/tokenizers) as a whole command, for bench_tokenizer_hf.sh:
//   node bench_tokenizer_hf_js.js ROOT TOKENIZER_JSON TEXT_FILE  > ids
// loads the tokenizer.json (special added tokens left out: kiln encodes their text as
// ordinary text), encodes the file as one text and prints the ids on one line, as
// `kiln tokenizer encode` does.
'use strict';
const fs = require('fs');
const path = require('path');
const [root, file, textFile] = process.argv.slice(2);
const { Tokenizer } = require(path.join(root, 'deps', 'npm', 'node_modules', '@huggingface',
  'tokenizers', 'dist', 'tokenizers.cjs'));
const json = JSON.parse(fs.readFileSync(file, 'utf8'));
json.added_tokens = json.added_tokens.filter((t) => !t.special);
const tok = new Tokenizer(json, {});
const ids = tok.encode(fs.readFileSync(textFile, 'utf8'), { add_special_tokens: false }).ids;
process.stdout.write(ids.join(' ') + '\n');
