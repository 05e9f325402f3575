// llama.cpp (through node-llama-cpp's prebuilt binary) on a GGUF file: the logits of the last
// of the given token ids, and optionally how llama.cpp tokenizes a text.
//   node llama_logits.mjs MODEL.gguf IDS [TEXT]
// prints {"logits": [...V numbers...], "tokens": [...ids of TEXT...]} on stdout.
import {getLlama} from "node-llama-cpp";

const [model_path, ids_text, text] = process.argv.slice(2);
const ids = ids_text.split(",").map(Number);
const llama = await getLlama({gpu: false, build: "never", logLevel: "error"});
const model = await llama.loadModel({modelPath: model_path});
const context = await model.createContext({contextSize: Math.max(ids.length + 1, 16), threads: 1});
const sequence = context.getSequence();
const items = ids.map((id, i) =>
    i === ids.length - 1 ? [id, {generateNext: {logits: true}}] : id);
const out = await sequence.controlledEvaluate(items);
const last = out[ids.length - 1];
const map = last.next.logits;
const v = [];
for (const [tok, val] of map) v[tok] = val;
const result = {logits: Array.from(v, x => x === undefined ? null : x)};
if (text !== undefined) result.tokens = model.tokenize(text, false);
process.stdout.write(JSON.stringify(result) + "\n");
await context.dispose();
await model.dispose();
await llama.dispose();
