//! Tokenizers built from a GGUF file's own metadata (`tokenizer.ggml.*`), or read from a
//! `tokenizer.json`, matching llama.cpp's tokenization of the same file.

use std::collections::BTreeSet;
use std::path::Path;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::prepend::Prepend;
use tokenizers::normalizers::replace::Replace;
use tokenizers::normalizers::unicode::NFC;
use tokenizers::normalizers::{NormalizerWrapper, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use crate::error::{Error, Result};
use crate::gguf::GgufFile;

const REGEX_QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const REGEX_LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Token kinds stored in `tokenizer.ggml.token_type`, as llama.cpp numbers them.
const TOKEN_TYPE_UNKNOWN: i64 = 2;
const TOKEN_TYPE_CONTROL: i64 = 3;
const TOKEN_TYPE_USER_DEFINED: i64 = 4;
const TOKEN_TYPE_BYTE: i64 = 6;

/// Texts that end a turn in the chat formats we know; any that the vocabulary holds stop
/// generation, beside the file's own eos/eot ids.
const END_OF_TURN_TEXTS: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|end_of_text|>",
    "<|endoftext|>",
    "<end_of_turn>",
    "<|end|>",
];

/// A tokenizer plus the ids that matter for chat generation.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    bos: Option<(u32, String)>,
    eos: Option<(u32, String)>,
    stop_ids: BTreeSet<u32>,
    add_bos: bool,
}

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF file's metadata.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Self> {
        let kind = gguf.string("tokenizer.ggml.model")?;
        if kind != "gpt2" && kind != "llama" {
            return Err(Error::Tokenizer(format!(
                "{}: tokenizer model `{kind}` is not supported (byte-level BPE, `gpt2`, and \
                 SentencePiece, `llama`, are); pass a tokenizer.json with --tokenizer",
                gguf.path().display()
            )));
        }
        let spm = kind == "llama";
        let tokens = gguf.string_array("tokenizer.ggml.tokens")?;
        let types = gguf.opt_int_array("tokenizer.ggml.token_type")?;
        if let Some(types) = &types {
            if types.len() != tokens.len() {
                return Err(Error::Tokenizer(format!(
                    "{}: tokenizer.ggml.token_type has {} items but tokenizer.ggml.tokens has {}",
                    gguf.path().display(),
                    types.len(),
                    tokens.len()
                )));
            }
        }
        let pre = gguf.opt_string("tokenizer.ggml.pre")?.unwrap_or("default");
        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.to_string(), i as u32))
            .collect();
        let mut inner = if spm {
            sentencepiece(gguf, &tokens, types.as_deref(), vocab)?
        } else {
            let merges = gguf
                .string_array("tokenizer.ggml.merges")?
                .into_iter()
                .enumerate()
                .map(|(i, m)| {
                    m.split_once(' ')
                        .map(|(a, b)| (a.to_string(), b.to_string()))
                        .ok_or_else(|| {
                            Error::Tokenizer(format!(
                                "{}: tokenizer.ggml.merges item {i} `{m}` is not two tokens separated by a space",
                                gguf.path().display()
                            ))
                        })
                })
                .collect::<Result<Vec<_>>>()?;
            let bpe = BPE::builder()
                .vocab_and_merges(vocab, merges)
                // Llama 3: a word found whole in the vocabulary is one token, merges or not.
                .ignore_merges(pre == "llama-bpe" || pre == "llama3")
                .build()
                .map_err(|e| Error::Tokenizer(format!("building BPE: {e}")))?;
            let mut inner = tokenizers::Tokenizer::new(bpe);
            inner.with_pre_tokenizer(Some(pre_tokenizer(pre)?));
            if pre == "qwen2" {
                inner
                    .with_normalizer(Some(NFC))
                    .map_err(|e| Error::Tokenizer(e.to_string()))?;
            }
            inner.with_decoder(Some(ByteLevelDecoder::default()));
            inner
        };

        // Control tokens (chat markers, eos) are special: matched whole in text, left out of
        // decoded text. User-defined tokens are matched whole but decode as text.
        let mut special = Vec::new();
        let mut added = Vec::new();
        for (id, text) in tokens.iter().enumerate() {
            match types.as_ref().map(|t| t[id]) {
                Some(TOKEN_TYPE_CONTROL) | Some(TOKEN_TYPE_UNKNOWN) => {
                    special.push(AddedToken::from(text.to_string(), true))
                }
                Some(TOKEN_TYPE_USER_DEFINED) => {
                    added.push(AddedToken::from(text.to_string(), false).normalized(false))
                }
                _ => {}
            }
        }
        inner
            .add_special_tokens(special.clone())
            .map_err(|e| Error::Tokenizer(format!("adding special tokens: {e}")))?;
        inner
            .add_tokens(added)
            .map_err(|e| Error::Tokenizer(format!("adding user-defined tokens: {e}")))?;

        let token_of = |key: &str| -> Result<Option<(u32, String)>> {
            Ok(match gguf.opt_usize(key)? {
                Some(id) if id < tokens.len() => Some((id as u32, tokens[id].to_string())),
                _ => None,
            })
        };
        let bos = token_of("tokenizer.ggml.bos_token_id")?;
        let eos = token_of("tokenizer.ggml.eos_token_id")?;
        let eot = token_of("tokenizer.ggml.eot_token_id")?;
        let mut stop_ids: BTreeSet<u32> = eos.iter().chain(eot.iter()).map(|t| t.0).collect();
        for text in END_OF_TURN_TEXTS {
            if let Some(id) = inner.token_to_id(text) {
                if special.iter().any(|t| t.content == *text) {
                    stop_ids.insert(id);
                }
            }
        }
        let add_bos = gguf
            .opt_bool("tokenizer.ggml.add_bos_token")?
            .unwrap_or(false);
        Ok(Self {
            inner,
            bos,
            eos,
            stop_ids,
            add_bos,
        })
    }

    /// The tokenizer of a GGUF model file (read from its metadata, without the weights)
    /// or of a Hugging Face `tokenizer.json`, told apart by the file's magic bytes.
    pub fn from_file(path: &Path) -> Result<Self> {
        let mut magic = [0u8; 4];
        let is_gguf = std::fs::File::open(path)
            .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
            .map(|()| &magic == b"GGUF")
            .unwrap_or(false);
        if is_gguf {
            Self::from_gguf(&crate::gguf::GgufFile::open(path)?)
        } else {
            Self::from_json_file(path)
        }
    }

    /// Reads a Hugging Face `tokenizer.json`.
    pub fn from_json_file(path: &Path) -> Result<Self> {
        let inner = tokenizers::Tokenizer::from_file(path)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))?;
        let find = |texts: &[&str]| {
            texts
                .iter()
                .find_map(|t| inner.token_to_id(t).map(|id| (id, t.to_string())))
        };
        let stop_ids = END_OF_TURN_TEXTS
            .iter()
            .filter_map(|t| inner.token_to_id(t))
            .collect();
        let bos = find(&["<|begin_of_text|>", "<s>", "<|im_start|>"]);
        let eos = find(&["<|im_end|>", "<|eot_id|>", "</s>", "<|endoftext|>"]);
        Ok(Self {
            inner,
            bos,
            eos,
            stop_ids,
            add_bos: false,
        })
    }

    /// Writes the tokenizer as a Hugging Face `tokenizer.json`.
    pub fn save_json(&self, path: &Path) -> Result<()> {
        self.inner
            .save(path, false)
            .map_err(|e| Error::Tokenizer(format!("{}: {e}", path.display())))
    }

    /// Token ids of `text`. Special-token texts (such as `<|im_start|>`) become their ids.
    /// A BOS token is prepended only when `add_bos` is set and the model asks for one.
    pub fn encode(&self, text: &str, add_bos: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(|e| Error::Tokenizer(format!("encoding: {e}")))?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if add_bos && self.add_bos {
            if let Some((id, _)) = &self.bos {
                ids.push(*id);
            }
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// Text of `ids`, without special tokens.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner
            .decode(ids, true)
            .map_err(|e| Error::Tokenizer(format!("decoding: {e}")))
    }

    /// The vocabulary string of one id, as stored (byte-level form for BPE).
    pub fn token_text(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos.as_ref().map(|t| t.1.as_str())
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos.as_ref().map(|t| t.1.as_str())
    }

    /// Ids that end generation.
    pub fn stop_ids(&self) -> &BTreeSet<u32> {
        &self.stop_ids
    }
}

/// SentencePiece's whitespace mark, which stands for a space inside tokens.
const SPACE_MARK: &str = "\u{2581}";

/// A SentencePiece (`llama`) vocabulary as llama.cpp tokenizes it: spaces become
/// [`SPACE_MARK`] (a leading one only where `tokenizer.ggml.add_space_prefix` asks), then
/// adjacent pieces merge, always the pair whose joined text is the vocabulary entry of
/// highest score first, and characters the vocabulary lacks fall back to byte tokens
/// (`<0x41>`). That is byte-pair encoding with one merge per way of splitting each entry in
/// two entries, ranked by the joined entry's score, which is how Hugging Face stores the
/// same vocabularies; the GGUF file keeps only the scores.
fn sentencepiece(
    gguf: &GgufFile,
    tokens: &[&str],
    types: Option<&[i64]>,
    vocab: Vocab,
) -> Result<tokenizers::Tokenizer> {
    let scores = gguf
        .opt_f32_array("tokenizer.ggml.scores")?
        .ok_or_else(|| {
            Error::Tokenizer(format!(
                "{}: a SentencePiece vocabulary needs tokenizer.ggml.scores",
                gguf.path().display()
            ))
        })?;
    if scores.len() != tokens.len() {
        return Err(Error::Tokenizer(format!(
            "{}: tokenizer.ggml.scores has {} items but tokenizer.ggml.tokens has {}",
            gguf.path().display(),
            scores.len(),
            tokens.len()
        )));
    }
    let byte_token = |id: usize| types.is_some_and(|t| t[id] == TOKEN_TYPE_BYTE);
    let mut merges: Vec<(f32, u32, u32, u32)> = Vec::new();
    for (id, piece) in tokens.iter().enumerate() {
        if byte_token(id) {
            continue;
        }
        for (at, _) in piece.char_indices().skip(1) {
            let (left, right) = piece.split_at(at);
            if let (Some(&l), Some(&r)) = (vocab.get(left), vocab.get(right)) {
                if !byte_token(l as usize) && !byte_token(r as usize) {
                    merges.push((scores[id], id as u32, l, r));
                }
            }
        }
    }
    // Highest joined score first; ties in vocabulary order.
    merges.sort_by(|a, b| {
        b.0.total_cmp(&a.0)
            .then((a.1, a.2, a.3).cmp(&(b.1, b.2, b.3)))
    });
    let merges = merges
        .into_iter()
        .map(|(_, _, l, r)| {
            (
                tokens[l as usize].to_string(),
                tokens[r as usize].to_string(),
            )
        })
        .collect();
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .byte_fallback(true);
    if let Some(unk) = gguf.opt_usize("tokenizer.ggml.unknown_token_id")? {
        if let Some(text) = tokens.get(unk) {
            builder = builder.unk_token(text.to_string());
        }
    }
    let bpe = builder
        .build()
        .map_err(|e| Error::Tokenizer(format!("building the SentencePiece merges: {e}")))?;
    let mut inner = tokenizers::Tokenizer::new(bpe);
    let mut normalizers: Vec<NormalizerWrapper> = Vec::new();
    if gguf
        .opt_bool("tokenizer.ggml.add_space_prefix")?
        .unwrap_or(true)
    {
        normalizers.push(Prepend::new(SPACE_MARK.to_string()).into());
    }
    let replace = |from: &str, to: &str| {
        Replace::new(from, to).map_err(|e| Error::Tokenizer(format!("SentencePiece spaces: {e}")))
    };
    normalizers.push(replace(" ", SPACE_MARK)?.into());
    inner
        .with_normalizer(Some(NormalizerSequence::new(normalizers)))
        .map_err(|e| Error::Tokenizer(e.to_string()))?;
    inner.with_decoder(Some(DecoderSequence::new(vec![
        replace(SPACE_MARK, " ")?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ])));
    Ok(inner)
}

/// The pre-tokenizer llama.cpp applies for a `tokenizer.ggml.pre` value.
fn pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper> {
    let split = |regex: &str| -> Result<PreTokenizerWrapper> {
        let split = Split::new(
            SplitPattern::Regex(regex.to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| Error::Tokenizer(format!("pre-tokenizer regex: {e}")))?;
        Ok(Sequence::new(vec![
            split.into(),
            ByteLevel::new(false, false, false).into(),
        ])
        .into())
    };
    Ok(match pre {
        "qwen2" | "deepseek-r1-qwen" => split(REGEX_QWEN2)?,
        "llama-bpe" | "llama3" | "smaug-bpe" => split(REGEX_LLAMA3)?,
        // SmolLM: every digit on its own, then GPT-2's byte-level split, no prefix space.
        "smollm" => Sequence::new(vec![
            Digits::new(true).into(),
            ByteLevel::new(false, true, true).into(),
        ])
        .into(),
        _ => ByteLevel::new(false, true, true).into(),
    })
}
