// Test texts for the tokenizer reference tests: hard cases, code points in context,
// seeded random texts, and byte strings that are not UTF-8.
'use strict';

// A small seeded generator (xorshift32), so that a failure can be run again.
function rng(seed) {
  let x = (seed >>> 0) || 0x9e3779b9;
  return {
    u32() { x ^= x << 13; x >>>= 0; x ^= x >>> 17; x ^= x << 5; x >>>= 0; return x; },
    below(n) { return this.u32() % n; },
    pick(a) { return a[this.below(a.length)]; },
  };
}

const cp = (c) => String.fromCodePoint(c);
const UNICODE_SPACES = [0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x20, 0x85, 0xa0, 0x1680, 0x2000, 0x2001,
  0x2002, 0x2003, 0x2004, 0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200a, 0x2028, 0x2029, 0x202f,
  0x205f, 0x3000].map(cp);
// Look like spaces but are not White_Space: Mongolian vowel separator, zero width space,
// byte order mark, and the "information separators" 0x1c-0x1f.
const NOT_SPACES = [0x180e, 0x200b, 0xfeff, 0x1c, 0x1d, 0x1e, 0x1f].map(cp);

function hardCases() {
  const c = [
    '', 'a', ' ', '  ', '\n', 'Hello world', ' Hello', 'Hello  world', 'hello\n\nworld',
    'tabs\t\tand\t', 'x   ', '   ', 'line\r\nline\r\n', '\u000b\u000c', ' \n \n ', '\n  \n',
    'a\n\n\nb', 'x \t\n y', 'end with spaces  ', 'end with newline\n', '\n\n\n\n',
    // contractions, lower and upper case, and things that look like them
    "it's", "IT'S", "I'LL", "we're", "WE'RE", "they've", "THEY'VE", "I'm", "I'M", "he'd",
    "HE'D", "'s", "'S", "'ll", "'LL", "can't", "CAN'T", "don't", "'tis", "''", "'''s",
    "rock 'n' roll", "x'sy", " 's", "it\u2019s", "o'clock", "'", "' ", "''ll", "'ve'", "'re'd",
    // numbers of many scripts
    '123', '1234567890', '3.14159', '1,000,000', ' 42', 'x2', '2x', '\u0663\u0664\u0665',
    '\u00b2\u00b3', '\u00bd', '\u216b', '\u2460', cp(0x1d7d8) + cp(0x1d7d9), '\u07c0',
    '\uff11\uff12\uff13', ' \u0969\u096a', '\u3007', cp(0x10107), '12\u00b2', '1\u0301',
    // every kind of white space, alone, in runs and between words
    ...UNICODE_SPACES, ...UNICODE_SPACES.map((s) => 'a' + s + 'b'),
    ...UNICODE_SPACES.map((s) => 'a ' + s + s + ' b'), UNICODE_SPACES.join(''),
    UNICODE_SPACES.join('') + 'x', ...NOT_SPACES.map((s) => 'a ' + s + ' b'),
    ...NOT_SPACES.map((s) => ' ' + s + s), '\u00a0\u00a0x', ' \u3000 x',
    // control characters, NUL included
    '\u0000', 'a\u0000b', '\u0000\u0000 \u0000', '\u0001\u0002\u001f\u007f', '\u0080\u009f',
    ' \u0000x', '\u0007bell',
    // emoji: skin tones, joiners, flags, keycaps, variation selectors
    '\u{1f600}', '\u{1f44d}\u{1f3fd}', '\u{1f468}\u200d\u{1f469}\u200d\u{1f467}\u200d\u{1f466}',
    '\u{1f1fa}\u{1f1f8}\u{1f1eb}\u{1f1f7}', '\u2764\ufe0f', '\u{1f3f3}\ufe0f\u200d\u{1f308}',
    ' \u{1f600}\u{1f600} \u{1f600}', 'a\u{1f600}b', '1\ufe0f\u20e3', '\u{1f9d1}\u{1f3ff}\u200d\u{1f4bb}',
    // CJK and other scripts
    '\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8', '\u4e2d\u6587\u5b57\u7b26',
    '\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8', 'Tokyo\u6771\u4eac2020\u5e74', '\u3001\u3002',
    '\u0928\u092e\u0938\u094d\u0924\u0947', '\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35',
    '\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645',
    '\u05e9\u05b8\u05c1\u05dc\u05d5\u05b9\u05dd', '\ufdfa', '\u03a9mega \u03b1\u03b2\u03b3',
    '\u00dcn\u00efc\u00f6d\u00e9', '\u01c5', '\u00df', '\u0130stanbul', '\u1e9e',
    // combining marks
    'e\u0301', 'a\u0300\u0301\u0302', '\u0301', ' \u0301', 'x\u20dd',
    'Z\u0324\u0354\u0367\u0311\u0313a\u0308\u0356\u032dl\u036e\u0312\u036bg\u030c\u0317\u035a',
    // one character of each plane, and edges
    cp(0x10000), cp(0x1f600), cp(0x20000), cp(0x30000), cp(0xe0001), cp(0xf0000), cp(0x10ffff),
    '\ufffd', '\uffff', '\ufdd0', cp(0x50000) + cp(0x60000), cp(0xe0041) + cp(0xe007f),
    // letters and numbers new in Unicode 15 and 16 (an apostrophe after them starts "'s")
    ...[0x1c89, 0xa7cb, 0x105c0, 0x10d4a, 0x11380, 0x11bc0, 0x11f04, 0x13460, 0x16100, 0x16d40,
      0x1e4d0, 0x1e5d0, 0x2ebf0, 0x2ecb0, 0x31350, 0x10d40, 0x116d0, 0x1ccf0, 0x1e5f1]
      .map((c) => `x${cp(c)}'s ${cp(c)}'LL 1${cp(c)}.`),
    // special-token text is ordinary text
    '<|endoftext|>', 'a<|endoftext|>b', '<|endoftext|><|endoftext|>', ' <|endoftext|>\n',
    '<|fim_prefix|>', '<|endoftext',
    // code, markup, addresses
    'def f(x):\n    return x**2\n', 'if (a && b) { c++; }\n\t\treturn;',
    'http://example.com/path?q=1&b=2#frag', 'user@example.com', '{"a": [1, 2.5e-3, null]}',
    '<p class="x">Hi</p>', '    indented\n        more\n', '$ ls -la | grep "^d"',
    // long runs
    'a'.repeat(1000), ' '.repeat(1000), 'ab'.repeat(500), '\n'.repeat(300), '1'.repeat(500),
    '!'.repeat(700), '\u00e9'.repeat(300), '\u{1f600}'.repeat(200), 'word '.repeat(200),
    ' '.repeat(50) + 'x', 'x' + ' '.repeat(50),
    // pieces that are single tokens longer than 64 bytes (GPT-2's longest is 128)
    ' ' + '='.repeat(65), ' ' + '-'.repeat(64), '\u00c3\u00c2'.repeat(32), '\u00c3'.repeat(64),
    '\t'.repeat(40) + '\n', '-='.repeat(300),
    'The quick brown fox jumps over the lazy dog. '.repeat(30),
  ];
  return c;
}

// Each code point in contexts (after a letter, before a letter, doubled, around digits,
// spaces and punctuation, before "'s", after an apostrophe), one line each; every line
// starts with "X".
// Planes 0-3 and 14 in full, the others (unassigned or private use) every 97th.
function codePointLines() {
  const lines = [];
  for (let c = 0; c <= 0x10ffff; c++) {
    if (c >= 0xd800 && c <= 0xdfff) continue;
    const plane = c >> 16;
    const full = plane <= 3 || plane === 14;
    if (!full && c % 97 !== 0 && (c & 0xffff) !== 0xffff) continue;
    const s = cp(c);
    lines.push(`X${s}a${s}${s}1${s} ${s}.  ${s}'s${s}'${s}\n`);
  }
  return lines;
}

function randomCodePoint(r) {
  for (;;) {
    const plane = r.below(10) < 7 ? 0 : r.pick([1, 1, 2, 3, 14, 15, 16, 5]);
    const c = (plane << 16) | r.below(0x10000);
    if (c < 0xd800 || c > 0xdfff) return cp(c);
  }
}

// Texts made of random atoms: ASCII words and symbols, white space of every kind,
// contractions, digits, random code points of any plane, emoji, marks, special-token text.
function randomTexts(seed, count) {
  const r = rng(seed);
  const words = ['the', 'The', 'a', 'of', 'and', 'to', 'in', 'is', 'Hello', 'WORLD', 'x', 'ing',
    'tion', 'q', 'Zz', '\u00e9t\u00e9', '\u4e2d\u6587', '\u043f\u0440\u0438\u0432\u0435\u0442'];
  const conts = ["'s", "'S", "'t", "'T", "'re", "'RE", "'ve", "'VE", "'m", "'M", "'ll", "'LL",
    "'d", "'D", "'", "''"];
  const atoms = [
    () => r.pick(words), () => ' ' + r.pick(words), () => r.pick(conts),
    () => r.pick(UNICODE_SPACES), () => r.pick(NOT_SPACES), () => ' '.repeat(1 + r.below(6)),
    () => '\n'.repeat(1 + r.below(3)), () => String(r.u32() % 100000), () => ' ' + r.below(1000),
    () => r.pick(['.', ',', '!', '?', '-', '--', '...', '"', '(', ')', '#', '@', '$', '%', '_']),
    () => String.fromCharCode(r.below(128)), () => randomCodePoint(r), () => randomCodePoint(r),
    () => cp(0x1f300 + r.below(0x300)), () => cp(0x300 + r.below(0x70)),
    () => cp(0x4e00 + r.below(0x5000)), () => '<|endoftext|>', () => '\u00b2\u00bd',
  ];
  const texts = [];
  for (let i = 0; i < count; i++) {
    const n = r.below(i % 10 === 0 ? 200 : 40);
    let t = '';
    for (let k = 0; k < n; k++) t += r.pick(atoms)();
    texts.push(t);
  }
  return texts;
}

// Byte strings that are not UTF-8.
function invalidUtf8(seed) {
  const r = rng(seed);
  const B = (...a) => Buffer.from(a);
  const text = (s) => Buffer.from(s, 'utf8');
  const blobs = [
    B(0xed, 0xa0, 0x80), B(0xed, 0xbf, 0xbf), // lone surrogates as WTF-8
    Buffer.concat([text('a '), B(0xed, 0xa0, 0xbd, 0xed, 0xb8, 0x80), text(' b')]), // CESU-8
    B(0xc3), Buffer.concat([text('caf'), B(0xc3)]),
    B(0xe2, 0x82), Buffer.concat([B(0xf0, 0x9f, 0x98), text(' x')]),
    B(0xc0, 0xaf), B(0xe0, 0x80, 0xaf), B(0xf0, 0x80, 0x80, 0xaf), // overlong
    B(0xf4, 0x90, 0x80, 0x80), B(0xf5, 0xf6, 0xfe, 0xff), // beyond U+10FFFF, never-valid bytes
    B(0x80, 0x81, 0xbf), Buffer.concat([text('  '), B(0x80), text('  x')]),
    B(0, 0, 0), Buffer.concat([text("it's"), B(0xff), text("'S "), B(0xfe)]),
    Buffer.alloc(100000, 0xff), Buffer.alloc(100000, 0),
  ];
  for (const n of [1, 7, 64, 1000, 100000, 1 << 20]) { // random binary
    const b = Buffer.alloc(n);
    for (let i = 0; i < n; i++) b[i] = r.below(4) ? r.below(256) : (i ? b[i - 1] : 0);
    blobs.push(b);
  }
  for (let k = 0; k < 50; k++) { // valid text with invalid bytes thrown in
    const t = text(randomTexts(seed + k, 1)[0] + ' tail');
    const b = Buffer.from(t);
    for (let j = 0; j < 1 + r.below(4) && b.length; j++) b[r.below(b.length)] = 0x80 + r.below(128);
    blobs.push(b);
  }
  return blobs;
}

module.exports = { hardCases, codePointLines, randomTexts, invalidUtf8 };
