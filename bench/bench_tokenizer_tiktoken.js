#!/usr/bin/env node
// tiktoken's side of bench/bench_tokenizer.sh: writes the Brown corpus documents (tags
// stripped) to --docs, then times tiktoken's gpt2 encode_ordinary on them with one thread
// and with one worker thread per core. Prints lines like bench_tokenizer's:
//   tiktoken <case> <threads> <MB> <seconds> <MB/s> <tokens>
'use strict';
const fs = require('fs');
const os = require('os');
const path = require('path');
const { Worker, isMainThread, parentPort, workerData } = require('worker_threads');

function encoder(root) {
  const { get_encoding } = require(path.join(root, 'deps', 'npm', 'node_modules', 'tiktoken'));
  return get_encoding('gpt2');
}

if (!isMainThread) { // a worker: encode the documents it is given when told to start
  const enc = encoder(workerData.root);
  const docs = workerData.files.map((f) => fs.readFileSync(f, 'utf8'));
  enc.encode_ordinary('warm up');
  parentPort.on('message', () => {
    let tokens = 0;
    for (const d of docs) tokens += enc.encode_ordinary(d).length;
    parentPort.postMessage(tokens);
  });
  parentPort.postMessage('ready');
} else {
  const args = {};
  for (let i = 2; i < process.argv.length; i += 2) args[process.argv[i].slice(2)] = process.argv[i + 1];
  const repeat = Number(args.repeat || 5);
  const { brownDocuments } = require(path.join(args.root, 'tests', 'tok', 'brown.js'));
  const docs = brownDocuments(args.root);
  if (!docs.length) {
    console.error('the Brown corpus is not in deps/npm: run scripts/setup.sh');
    process.exit(1);
  }
  fs.mkdirSync(args.docs, { recursive: true });
  const files = docs.map((d, i) => {
    const f = path.join(args.docs, String(i).padStart(3, '0') + '.txt');
    fs.writeFileSync(f, d);
    return f;
  });
  const mb = docs.reduce((n, d) => n + Buffer.byteLength(d), 0) / 1e6;
  const enc = encoder(args.root);
  enc.encode_ordinary(docs[0]); // warm up
  let best = Infinity, tokens = 0;
  for (let r = 0; r < repeat; r++) {
    const t0 = process.hrtime.bigint();
    tokens = 0;
    for (const d of docs) tokens += enc.encode_ordinary(d).length;
    best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
  }
  console.log(`tiktoken documents-1-thread 1 ${mb.toFixed(3)} ${best.toFixed(4)} ` +
              `${(mb / best).toFixed(2)} ${tokens}`);
  enc.free();

  const n = Number(args.threads || os.cpus().length);
  const workers = [];
  for (let w = 0; w < n; w++) {
    workers.push(new Worker(__filename, {
      workerData: { root: args.root, files: files.filter((_, i) => i % n === w) },
    }));
  }
  const once = (w) => new Promise((resolve) => w.once('message', resolve));
  (async () => {
    await Promise.all(workers.map(once)); // all ready
    let bestAll = Infinity, tokensAll = 0;
    for (let r = 0; r < repeat; r++) {
      const t0 = process.hrtime.bigint();
      const done = workers.map(once);
      workers.forEach((w) => w.postMessage('go'));
      tokensAll = (await Promise.all(done)).reduce((a, b) => a + b, 0);
      bestAll = Math.min(bestAll, Number(process.hrtime.bigint() - t0) / 1e9);
    }
    console.log(`tiktoken workers ${n} ${mb.toFixed(3)} ${bestAll.toFixed(4)} ` +
                `${(mb / bestAll).toFixed(2)} ${tokensAll}`);
    await Promise.all(workers.map((w) => w.terminate()));
  })();
}
