// Hugging Face's tokenization of texts, as a reference for gale's imported tokenizers: runs a
// tokenizer.json (+ tokenizer_config.json) through @lenml/tokenizers, a dependency-free JavaScript
// port of transformers.js's tokenizers (the same normalizers, pre-tokenizers, BPE and added-token
// splitting as Hugging Face's library). Texts separated by "\n__ggml_vocab_test__\n" in INPUTS;
// one line of ids per text in OUT, without BOS/EOS (add_special_tokens false); added tokens' texts
// become those tokens, as Hugging Face does by default.
//
//   NODE_PATH=DIR/node_modules node tools/hf_tokenize.cjs TOKENIZER_DIR INPUTS OUT
const fs = require('fs');
const { TokenizerLoader } = require('@lenml/tokenizers');
const [dir, inputs, out] = process.argv.slice(2);
const tok = TokenizerLoader.fromPreTrained({
  tokenizerJSON: JSON.parse(fs.readFileSync(dir + '/tokenizer.json', 'utf8')),
  tokenizerConfig: JSON.parse(fs.readFileSync(dir + '/tokenizer_config.json', 'utf8')),
});
const texts = fs.readFileSync(inputs, 'utf8').split('\n__ggml_vocab_test__\n').slice(0, -1);
fs.writeFileSync(out, texts.map((t) => tok.encode(t, { add_special_tokens: false }).join(' ')).join('\n') + '\n');
