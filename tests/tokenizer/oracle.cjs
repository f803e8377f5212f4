#!/usr/bin/env node
// tests/tokenizer/oracle.cjs — expected token ids for kl's tokenizer parity test.
//
// Oracle: OpenAI's tiktoken core (npm tiktoken@1.0.22, the Rust core in WASM, via tiktoken/lite)
// with Kimi's pat_str verbatim (its `&&` class intersections included), the o200k ranks of
// npm gpt-tokenizer@4.0.0 (data/o200k_base.tiktoken, already tiktoken.model format) and 256
// special ids after the last rank laid out as Kimi lays them out (tokenizer-and-api.md A1).
// Around tiktoken's encode(piece, "all") sits Kimi's own wrapper from tokenization_kimi.py:
// 400,000-code-point chunks, then cuts where a whitespace or non-whitespace run (Python
// str.isspace) would exceed 25,000 code points.
//
// usage: node oracle.cjs OUTDIR
//        node oracle.cjs --compare OUTDIR GOT    (lists the cases whose ids differ; exit 1 if any)
//   writes OUTDIR/tok/{tiktoken.model,tokenizer_config.json}, OUTDIR/in/NNNNN.txt (one input per
//   case), OUTDIR/names.txt (one description per case) and OUTDIR/expected.txt (one line of
//   space-separated ids per case, the format of `kl tokenize`); prints the oracle's encode
//   throughput on the 1 MB mixed-script text to stderr.
'use strict';
const fs = require('fs');
const path = require('path');
const { Tiktoken } = require('tiktoken/lite');

// ---- vocabulary -------------------------------------------------------------------------------

const RANKS_FILE = require.resolve('gpt-tokenizer/data/o200k_base.tiktoken');

// Kimi's pat_str, verbatim (tokenization_kimi.py).
const KIMI_PAT = [
  "[\\p{Han}]+",
  "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
  "[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}&&[^\\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
  "\\p{N}{1,3}",
  " ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*",
  "\\s*[\\r\\n]+",
  "\\s+(?!\\S)",
  "\\s+",
].join('|');

// Kimi's named specials at their offsets from the first special id; the rest are reserved.
const KIMI_NAMED = [
  [0, '[BOS]', true], [1, '[EOS]', true], [2, '<|im_end|>', true], [3, '<|im_user|>', true],
  [4, '<|im_assistant|>', true], [6, '<|start_header_id|>', true],
  [7, '<|end_header_id|>', true], [9, '[EOT]', true], [10, '<|im_system|>', true],
  [11, '<|tool_calls_section_begin|>', false], [12, '<|tool_calls_section_end|>', false],
  [13, '<|tool_call_begin|>', false], [14, '<|tool_call_argument_begin|>', false],
  [15, '<|tool_call_end|>', false], [17, '<|im_middle|>', true], [254, '[UNK]', true],
  [255, '[PAD]', true],
];
const N_SPECIAL = 256;

function loadVocab() {
  const text = fs.readFileSync(RANKS_FILE, 'utf8');
  const nRanks = text.split('\n').filter((l) => l.length > 0).length;
  const specials = {};
  const decoder = {};
  const named = new Map(KIMI_NAMED.map(([k, name, sp]) => [k, [name, sp]]));
  for (let k = 0; k < N_SPECIAL; k++) {
    const id = nRanks + k;
    const [name, special] = named.get(k) || [`<|reserved_token_${id}|>`, true];
    specials[name] = id;
    // Only the named ids are listed: kl must fill in the reserved names itself, as Kimi does.
    if (named.has(k))
      decoder[String(id)] = { content: name, lstrip: false, normalized: false, rstrip: false,
                              single_word: false, special };
  }
  const config = { added_tokens_decoder: decoder, bos_token: '[BOS]', eos_token: '<|im_end|>',
                   pad_token: '[PAD]', unk_token: '[UNK]', tokenizer_class: 'TikTokenTokenizer' };
  return { text, nRanks, specials, config };
}

// ---- Kimi's encode wrapper ----------------------------------------------------------------------

const TIKTOKEN_MAX_ENCODE_CHARS = 400000;
const MAX_NO_WHITESPACES_CHARS = 25000;

// Python's str.isspace() (Unicode 14/15).
function pyIsSpace(cp) {
  return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp === 0x85 ||
         cp === 0xa0 || cp === 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp === 0x2028 ||
         cp === 0x2029 || cp === 0x202f || cp === 0x205f || cp === 0x3000;
}

// _split_whitespaces_or_nonwhitespaces over an array of code-point strings.
function splitRuns(chars, maxLen) {
  const out = [];
  let curLen = 0;
  let curSpace = chars.length > 0 ? pyIsSpace(chars[0].codePointAt(0)) : false;
  let start = 0;
  for (let i = 0; i < chars.length; i++) {
    const sp = pyIsSpace(chars[i].codePointAt(0));
    if (curSpace !== sp) {
      curLen = 1;
      curSpace = sp;
    } else {
      curLen++;
      if (curLen > maxLen) {
        out.push(chars.slice(start, i).join(''));
        start = i;
        curLen = 1;
      }
    }
  }
  out.push(chars.slice(start).join(''));
  return out;
}

function kimiEncode(enc, text) {
  const chars = Array.from(text);      // code points, like Python's str indexing
  const ids = [];
  for (let i = 0; i < Math.max(chars.length, 1); i += TIKTOKEN_MAX_ENCODE_CHARS)
    for (const sub of splitRuns(chars.slice(i, i + TIKTOKEN_MAX_ENCODE_CHARS),
                                MAX_NO_WHITESPACES_CHARS))
      for (const id of enc.encode(sub, 'all'))
        ids.push(id);
  return ids;
}

// ---- deterministic text ----------------------------------------------------------------------

function rng(seed) {                   // mulberry32
  let a = seed >>> 0;
  const next = () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
  return {
    next,
    int: (n) => Math.floor(next() * n),
    pick: (arr) => arr[Math.floor(next() * arr.length)],
  };
}

const cp = (c) => String.fromCodePoint(c);
const range = (lo, hi) => { const r = []; for (let c = lo; c <= hi; c++) r.push(cp(c)); return r; };

// Blocks assigned long before Unicode 14 (PCRE2 10.42's tables), so the Rust oracle and PCRE2
// agree on every property.
const SCRIPTS = {
  han: range(0x4e00, 0x9fa5),
  hira: range(0x3041, 0x3096),
  kata: range(0x30a1, 0x30fa),
  hangul: range(0xac00, 0xd7a3),
  cyr: range(0x0430, 0x044f),
  CYR: range(0x0410, 0x042f),
  greek: range(0x03b1, 0x03c9),
  arabic: range(0x0621, 0x064a),
  hebrew: range(0x05d0, 0x05ea),
  deva: range(0x0915, 0x0939),
  devaMarks: range(0x093e, 0x094c),
  thai: range(0x0e01, 0x0e2e),
  thaiMarks: [cp(0x0e31), ...range(0x0e34, 0x0e3a), ...range(0x0e47, 0x0e4e)],
  latinExt: range(0x00e0, 0x00ff).filter((c) => c !== '\u00f7'),
  combining: range(0x0300, 0x036f),
  emoji: range(0x1f600, 0x1f64f),
};
const CJK_PUNCT = ['。', '，', '、', '「', '」', '！', '？', '：', '；', '（', '）', '《', '》', '…', '—'];
const EN_WORDS = ('the of and to in is was for on that with as by at from his her it an were are ' +
  'which this be or has had not but have they one all new first been their who also after two ' +
  'its more other into time years when over most only some such than world would these about ' +
  'tokenizer merge rank regex unicode kernel model weight expert layer attention state').split(' ');
const CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve",
                      "'vE", "'M", "'LL", "'lL", "'D", "'ſ", "’s"];
const SPACES = [' ', ' ', ' ', '  ', '\t', '\n', '\r\n', '\n\n', ' \n', '\u00a0', '\u3000',
                '\u2009', '\u0085', '\u000b', '\u000c', '   \n  '];
const SPECIAL_TEXT = ['<|im_end|>', '<|im_user|>', '<|im_middle|>', '[BOS]', '[EOS]',
                      '<|tool_call_begin|>', '<|reserved_token_200050|>', '<|im_end|',
                      '<|im_start|>', '[PAD]'];

function word(r) {
  const w = r.pick(EN_WORDS);
  switch (r.int(8)) {
  case 0: return w[0].toUpperCase() + w.slice(1);
  case 1: return w.toUpperCase();
  case 2: return w + r.pick(EN_WORDS)[0].toUpperCase() + r.pick(EN_WORDS).slice(1); // camelCase
  case 3: return w + r.pick(CONTRACTIONS);
  default: return w;
  }
}

function run(r, alphabet, lo, hi) {
  let s = '';
  for (let n = lo + r.int(hi - lo + 1); n > 0; n--) s += r.pick(alphabet);
  return s;
}

function segment(r) {
  switch (r.int(16)) {
  case 0: case 1: case 2: {                                    // English sentence
    let s = '';
    for (let n = 3 + r.int(12); n > 0; n--) s += (s ? ' ' : '') + word(r);
    return s + r.pick(['.', ',', '!', '?', ';', ':', ' —', '...', '."\n']);
  }
  case 3: case 4: {                                            // Chinese with punctuation
    let s = '';
    for (let n = 1 + r.int(4); n > 0; n--) s += run(r, SCRIPTS.han, 2, 12) + r.pick(CJK_PUNCT);
    return s;
  }
  case 5: return run(r, SCRIPTS.hira, 2, 8) + run(r, SCRIPTS.han, 1, 3) +
                 run(r, SCRIPTS.kata, 2, 6) + r.pick(['。', '、', 'ー', '々', '〇']);
  case 6: return run(r, SCRIPTS.hangul, 2, 6) + ' ' + run(r, SCRIPTS.hangul, 1, 5) + '.';
  case 7: return run(r, SCRIPTS.CYR, 0, 1) + run(r, SCRIPTS.cyr, 3, 10) + ' ' +
                 run(r, SCRIPTS.greek, 3, 8) + ',';
  case 8: return run(r, SCRIPTS.arabic, 3, 8) + ' ' + run(r, SCRIPTS.hebrew, 3, 8);
  case 9: {                                                    // Devanagari / Thai with marks
    let s = '';
    for (let n = 2 + r.int(6); n > 0; n--)
      s += r.pick(SCRIPTS.deva) + (r.int(2) ? r.pick(SCRIPTS.devaMarks) : '');
    s += ' ';
    for (let n = 2 + r.int(6); n > 0; n--)
      s += r.pick(SCRIPTS.thai) + (r.int(3) ? '' : r.pick(SCRIPTS.thaiMarks));
    return s;
  }
  case 10: {                                                   // Latin with combining marks
    let s = '';
    for (let n = 3 + r.int(8); n > 0; n--) {
      s += r.int(3) ? String.fromCharCode(97 + r.int(26)) : r.pick(SCRIPTS.latinExt);
      if (!r.int(4)) s += r.pick(SCRIPTS.combining);
    }
    return s;
  }
  case 11: {                                                   // digits and numbers
    const d = () => String(r.int(10 ** (1 + r.int(9))));
    return r.pick([d(), d() + '.' + d(), d() + ',' + d() + ',' + d(), '$' + d(),
                   d() + '%', run(r, range(0x30, 0x39), 4, 40), '٣٤٥' + d(), '１２３' + d()]);
  }
  case 12: {                                                   // code
    const id = word(r) + r.pick(['', '_' + word(r), word(r)[0].toUpperCase() + 'Name']);
    return r.pick([`function ${id}(a, b) {\n    return a + b;\n}\n`,
                   `if (x->${id} != NULL && y[${r.int(100)}] >= 0x${r.int(65536).toString(16)})`,
                   `    ${id} = getUserName(req.body["${word(r)}"]);  // TODO`,
                   `<div class="${id}">${word(r)}</div>`, `\t${id}: [1, 2, 3],\r\n`]);
  }
  case 13: return r.pick(SCRIPTS.emoji) + r.pick(['', r.pick(SCRIPTS.emoji), '\u200d',
                                                  '\ufe0f']);
  case 14: return r.pick(SPECIAL_TEXT);
  default: return r.pick(['\u00bf', '\u00a1', '\u2014', '\u201c', '\u201d', '\u00ab', '\u00bb',
                          '\ufeff', '\u00ad', '\u2060', '\u200b', '\u180e', '&&', '\'', '"',
                          '\u0085', '\u2028', '...', '---', '***', '!!!', '???', '(', ')']);
  }
}

function mixedText(seed, minBytes) {
  const r = rng(seed);
  const parts = [];
  let bytes = 0;
  while (bytes < minBytes) {
    const s = segment(r) + r.pick(SPACES);
    parts.push(s);
    bytes += Buffer.byteLength(s, 'utf8');
  }
  return parts.join('');
}

// Characters where regex engines tend to disagree (tokenizer-and-api.md A6).
const POOL = [
  'a', 'b', 'Z', 'Q', ' ', ' ', '\n', '\r', '\t', "'", 's', 't', 'S', 'T', 'r', 'e', 'v', 'l',
  'm', 'd', 'L', 'M', 'D', 'R', 'E', 'V', '0', '7', '9', '.', ',', '!', '(', '/', '<', '|', '>',
  '世', '界', '中', '々', '〇', '〆', '⺀', '⽇', '。', '、', '「', '」', '，', 'あ', 'ア', 'ー',
  '한', '글', 'ǅ', 'ʰ', 'ſ', 'ß', 'İ', 'ı', 'é', 'e\u0301', '\u0301', '\u0308', 'क', '\u093f',
  'ก', '\u0e31', 'α', 'Ω', 'я', 'Я', 'ب', '\u0085', '\u00a0', '\u3000', '\ufeff', '\u2028',
  '\u000b', '\u001c', '\u180e', '\u2060', '\u00ad', '\u200b', '😀', '１', '٣', 'Ⅻ', '½', '²',
  '[', ']', 'B', 'O', '_', '-', '@',
];

function randomStrings(seed, n) {
  const r = rng(seed);
  const out = [];
  for (let i = 0; i < n; i++) {
    let s = '';
    for (let k = 1 + r.int(40); k > 0; k--) s += r.pick(POOL);
    out.push(s);
  }
  return out;
}

const ADVERSARIAL = [
  '', ' ', '  ', '\n', '\r\n', 'a', 'Hello world', 'hello  world', 'hello\u00a0world',
  // CJK with punctuation
  '世界。你好，世界！', '「引用」と『二重』', '中文English混合123测试', '東京タワー、スカイツリー。',
  '世界。', '。世界', '々〇〆', '⺀⺁⽇⽉', '한국어 텍스트입니다.', '中文 English 中文',
  // combining marks
  'e\u0301te\u0301', 'Z\u0351\u036b\u0343\u036a\u0302\u036b\u033d\u034f\u0334alg\u0336o',
  '\u0301\u0301\u0301abc', 'नमस्ते दुनिया', 'สวัสดีครับ', 'ñandú n\u0303andu\u0301',
  // camelCase and case runs
  'getUserName', 'XMLHttpRequest', 'parseHTTPResponse2XX', 'iPhone', 'ǅungla ǈ ǋ', 'ʰello ʰʰ',
  'ALLCAPS words Mixed', 'aBcDeF', 'ABCdef', 'ΑΒΓδεζ', 'ЯблокоЯблоко',
  // contractions in any case
  "it's", "IT'S", "It'S", "don't DON'T Don'T", "we're WE'RE We'Re", "I've I'VE", "I'm I'M",
  "you'll YOU'LL You'lL", "he'd HE'D", "'s 'S 'T 'RE 'VE 'M 'LL 'D", "'ſ dogſ'ſ", "o'clock",
  "rock'n'roll", "’s don’t", "'''", "''s", "x'sy",
  // digit runs
  '1', '12', '123', '1234', '12345678901234567890', '3.14159', '1,000,000', '٣٤٥٦', '１２３４',
  '½²³ⅫⅧ', '0x1F600', 'v1.2.3-rc4', '2026-11-29T12:00:00Z',
  // whitespace runs
  '   ', '\t\t\t', '\n\n\n', 'a   b', 'a \n b', '  \n\n  ', ' \r\n \r\n', 'x\u3000\u3000y',
  'end   ', '   start', 'a\u2028b\u2029c', 'a\u000bb\u000cc', '\u001c\u001d\u001e\u001f',
  'tab\there', ' \t \n \u00a0 \u3000 x',
  // special-token text
  '<|im_end|>', '<|im_user|>user<|im_middle|>Hello<|im_end|><|im_assistant|>assistant<|im_middle|>',
  '[BOS]x[EOS]', '<|im_end|', '<|im_end|><|im_end|>', '<<|im_end|>>', '[PAD][UNK]',
  '<|reserved_token_200100|>', '<|reserved_token_0|>', 'a<|tool_call_begin|>functions.f:0' +
  '<|tool_call_argument_begin|>{"x": 1}<|tool_call_end|>', '  <|im_end|>  ', '\n<|im_end|>\n',
  '<|im_system|>system<|im_middle|>You are Kimi.<|im_end|>', '[EOT][EOT]', '<|start_header_id|>',
  // U+0085 and U+FEFF
  '\u0085', 'a\u0085b', '\u0085\u0085 x', '\ufeff', '\ufeffHello', 'a\ufeffb', ' \ufeff ',
  '\ufeff\u0085\ufeff', 'x \u0085 y', '\u0085\n',
  // misc
  '😀😃😄', '👍🏽', '👨‍👩‍👧', 'İstanbul ıi', 'Straße STRASSE', 'ſtraße', '\u00ad\u2060\u200b',
  '#!/bin/sh\nset -eu\n', '<div>Hello</div>', 'https://example.com/a?b=c&d=e#f',
  'a&&b [x&&[^y]]', '"quoted" «guillemets» „low“', '¿Qué? ¡Sí!',
];

function longCases() {
  const out = [];
  out.push(['30000 spaces', ' '.repeat(30000)]);
  out.push(['30000 letters a', 'a'.repeat(30000)]);
  out.push(['10000 hangul (Lo: backtracking in the case classes)', '한'.repeat(10000)]);
  out.push(['25000 and 25001 run boundaries', 'x'.repeat(25000) + ' ' + 'y'.repeat(25001) +
            '\n'.repeat(25001) + 'z']);
  out.push(['26000 digits', '7'.repeat(26000)]);
  out.push(['26000 newlines then text', '\n'.repeat(26000) + 'text']);
  out.push(['ideographic space run', '\u3000'.repeat(8000) + '世界']);
  out.push(['NEL run', '\u0085'.repeat(8000) + 'a']);
  // Python's isspace (the 25k cut) counts NEL, U+3000 and U+001C..U+001F; regex \s does not
  // count U+001C..U+001F
  out.push(['mixed whitespace run of 26000', 'x' +
            (' '.repeat(96) + '\u0085\u3000\t\u00a0').repeat(260) + 'y']);
  out.push(['unit separator run of 26000', 'a' + '\u001f'.repeat(26000) + 'b']);
  out.push(['60000 punctuation', '.,;'.repeat(20000)]);
  // special text across the 400,000-code-point cut: Kimi cuts it in two (no special id)
  out.push(['special across the 400k cut',
            'ab '.repeat(133331) + 'x<|im_end|>' + ' tail' + '<|im_end|>']);
  out.push(['CJK across the 400k cut', 'ab '.repeat(133333) + '世界中' + 'abc']);
  return out;
}

// ---- main -------------------------------------------------------------------------------------

function compare(outDir, gotFile) {
  const lines = (f) => fs.readFileSync(f, 'utf8').split('\n');
  const exp = lines(path.join(outDir, 'expected.txt'));
  const names = lines(path.join(outDir, 'names.txt'));
  const got = lines(gotFile);
  let bad = 0;
  for (let i = 0; i < names.length - 1; i++) {
    if (got[i] === exp[i]) continue;
    if (++bad > 20) continue;
    const e = exp[i] ? exp[i].split(' ') : [], g = got[i] ? got[i].split(' ') : [];
    let k = 0;
    while (k < e.length && e[k] === g[k]) k++;
    console.error(`MISMATCH case ${i} (in/${String(i).padStart(5, '0')}.txt) ${names[i]}\n` +
                  `  first difference at id ${k}: expected ${e.slice(k, k + 8).join(' ')} ... ` +
                  `got ${g.slice(k, k + 8).join(' ')} ... (${e.length} vs ${g.length} ids)`);
  }
  console.error(`parity: ${names.length - 1 - bad} of ${names.length - 1} cases identical`);
  return bad ? 1 : 0;
}

function main() {
  if (process.argv[2] === '--compare') process.exit(compare(process.argv[3], process.argv[4]));
  const outDir = process.argv[2];
  if (!outDir) {
    console.error('usage: node oracle.cjs OUTDIR');
    process.exit(2);
  }
  const vocab = loadVocab();
  const tokDir = path.join(outDir, 'tok');
  const inDir = path.join(outDir, 'in');
  fs.mkdirSync(tokDir, { recursive: true });
  fs.mkdirSync(inDir, { recursive: true });
  fs.writeFileSync(path.join(tokDir, 'tiktoken.model'), vocab.text);
  fs.writeFileSync(path.join(tokDir, 'tokenizer_config.json'),
                   JSON.stringify(vocab.config, null, 2) + '\n');
  const enc = new Tiktoken(vocab.text, vocab.specials, KIMI_PAT);

  const big = mixedText(20261129, 1 << 20);
  const cases = [['1 MB mixed-script text', big]];
  ADVERSARIAL.forEach((s, i) => cases.push([`adversarial ${i}: ${JSON.stringify(s)}`, s]));
  longCases().forEach((c) => cases.push(c));
  randomStrings(7, 3000).forEach((s, i) => cases.push([`random ${i}: ${JSON.stringify(s)}`, s]));
  // more mixed paragraphs encoded on their own (short-text paths, no 400k cut)
  for (let i = 0; i < 200; i++) {
    const s = mixedText(1000 + i, 200 + (i * 37) % 2000);
    cases.push([`paragraph ${i}`, s]);
  }

  const names = [];
  const expected = [];
  cases.forEach(([name, text], i) => {
    const file = path.join(inDir, String(i).padStart(5, '0') + '.txt');
    fs.writeFileSync(file, text, 'utf8');
    names.push(name.length > 200 ? name.slice(0, 200) + '…' : name);
    expected.push(kimiEncode(enc, text).join(' '));
  });
  fs.writeFileSync(path.join(outDir, 'names.txt'), names.join('\n') + '\n');
  fs.writeFileSync(path.join(outDir, 'expected.txt'), expected.join('\n') + '\n');

  // throughput of the oracle on the 1 MB text (best of 3, construction excluded)
  const bytes = Buffer.byteLength(big, 'utf8');
  let best = Infinity, n = 0;
  for (let k = 0; k < 3; k++) {
    const t0 = process.hrtime.bigint();
    n = kimiEncode(enc, big).length;
    const s = Number(process.hrtime.bigint() - t0) / 1e9;
    best = Math.min(best, s);
  }
  console.error(`oracle: tiktoken@1.0.22 (WASM) encode ${bytes} bytes, ${Array.from(big).length} ` +
                `code points -> ${n} tokens in ${best.toFixed(3)} s ` +
                `(${(bytes / best / 1e6).toFixed(2)} MB/s, ${(n / best).toFixed(0)} tokens/s)`);
  console.error(`oracle: ${cases.length} cases written to ${outDir}`);
  enc.free();
}

main();
