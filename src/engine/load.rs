//! Loading a model with its tokenizer, chat template and end-of-sequence tokens, from a
//! GGUF file or a Hugging Face directory.

use std::path::Path;

use candle_core::Device;
use candle_core::quantized::gguf_file;

use super::Engine;
use crate::chat::ChatTemplate;
use crate::model::forward::{Model, ModelError, WeightFormat};
use crate::model::tokenizer::ModelTokenizer;

/// Control tokens that end a chat turn in the families suffixd loads.
const TURN_ENDS: [&str; 3] = ["<end_of_turn>", "<|eot_id|>", "<|im_end|>"];

impl Engine {
    /// Load a model: a GGUF file of a supported family ([`crate::model::arch`]), or a Hugging Face directory (`config.json`,
    /// `tokenizer.json`, safetensors weights, and `tokenizer_config.json` for the chat
    /// template).
    pub fn load(
        path: &Path,
        format: WeightFormat,
        max_context: usize,
        device: &Device,
    ) -> Result<Self, ModelError> {
        if !device.is_cpu() && !matches!(format, WeightFormat::F32 | WeightFormat::Bf16) {
            tracing::warn!(
                "{format:?} weights on a GPU: candle's quantized kernels give logits that \
                 depend on the batch, so speculative output can differ from plain \
                 decoding; use --weights bf16 or f32 for exact output"
            );
        }
        if path.is_dir() {
            Self::load_hf_dir(path, format, max_context, device)
        } else {
            Self::load_gguf(path, format, max_context, device)
        }
    }

    fn load_gguf(
        path: &Path,
        format: WeightFormat,
        max_context: usize,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let fmt = |message: String| ModelError::Format {
            path: path.into(),
            message,
        };
        let mut f = crate::files::open_regular(path, "GGUF model file").map_err(|source| {
            ModelError::Io {
                path: path.into(),
                source,
            }
        })?;
        let content = gguf_file::Content::read(&mut f).map_err(|e| {
            fmt(format!(
                "not a readable GGUF file (or a model directory): {e}"
            ))
        })?;
        let model = Model::load_gguf(path, &content, format, max_context, device)?;
        Self::with_gguf_vocabulary(model, path, &content)
    }

    /// A model of a real architecture with seeded random weights, made on `device`
    /// ([`crate::model::load::synthetic`]), served with the tokenizer, chat template and
    /// end tokens of the GGUF file `vocabulary` (its vocabulary padded to the shape's).
    pub fn synthetic(
        name: &str,
        seed: u64,
        vocabulary: &Path,
        format: WeightFormat,
        max_context: usize,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let shape = crate::model::synthetic::shape(name)?;
        let mut f =
            crate::files::open_regular(vocabulary, "GGUF model file").map_err(|source| {
                ModelError::Io {
                    path: vocabulary.into(),
                    source,
                }
            })?;
        let content = gguf_file::Content::read(&mut f).map_err(|e| ModelError::Format {
            path: vocabulary.into(),
            message: format!("not a readable GGUF file: {e}"),
        })?;
        let words = ModelTokenizer::from_gguf(&content)
            .map_err(|e| ModelError::Format {
                path: vocabulary.into(),
                message: e.to_string(),
            })?
            .vocab_size();
        let model = Model::synthetic(&shape, words, seed, format, max_context, device)?;
        Self::with_gguf_vocabulary(model, vocabulary, &content)
    }

    /// The engine of `model` with the tokenizer, chat template and end tokens of the
    /// GGUF file at `path` (read as `content`).
    fn with_gguf_vocabulary(
        model: Model,
        path: &Path,
        content: &gguf_file::Content,
    ) -> Result<Self, ModelError> {
        let fmt = |message: String| ModelError::Format {
            path: path.into(),
            message,
        };
        let tokenizer = ModelTokenizer::from_gguf(content).map_err(|e| fmt(e.to_string()))?;
        let md_tok = |key: &str| content.metadata.get(key).and_then(|v| v.to_u32().ok());
        let name = |id: Option<u32>| {
            id.and_then(|i| tokenizer.decode(&[i], false).ok())
                .unwrap_or_default()
        };
        let template = match content
            .metadata
            .get("tokenizer.chat_template")
            .and_then(|v| v.to_string().ok())
        {
            Some(src) => Some(
                ChatTemplate::new(
                    src,
                    &name(md_tok("tokenizer.ggml.bos_token_id")),
                    &name(md_tok("tokenizer.ggml.eos_token_id")),
                )
                .map_err(|e| fmt(e.to_string()))?,
            ),
            None => None,
        };
        // Generation ends at the end of the sequence, and at the end of a chat turn where
        // the metadata or the vocabulary names one (Gemma's <end_of_turn>, Llama 3's
        // <|eot_id|>), as llama.cpp ends it.
        let mut eos: Vec<u32> = ["eos", "eot", "eom"]
            .iter()
            .filter_map(|k| md_tok(&format!("tokenizer.ggml.{k}_token_id")))
            .collect();
        eos.extend(
            TURN_ENDS
                .iter()
                .filter_map(|t| tokenizer.token_id(t))
                .filter(|id| tokenizer.is_control(*id)),
        );
        eos.sort_unstable();
        eos.dedup();
        Ok(Self::new(model, tokenizer, template, eos))
    }

    fn load_hf_dir(
        dir: &Path,
        format: WeightFormat,
        max_context: usize,
        device: &Device,
    ) -> Result<Self, ModelError> {
        let tokenizer_json = dir.join("tokenizer.json");
        crate::files::check_regular(&tokenizer_json, "tokenizer.json").map_err(|source| {
            ModelError::Io {
                path: tokenizer_json.clone(),
                source,
            }
        })?;
        let tokenizer =
            ModelTokenizer::from_file(&tokenizer_json).map_err(|e| ModelError::Format {
                path: dir.into(),
                message: e.to_string(),
            })?;
        let model = Model::load_safetensors(dir, format, max_context, device)?;
        // A file of the directory that may be absent: its text, or None.
        let optional = |path: &Path, what: &str| -> Result<Option<String>, ModelError> {
            match crate::files::read_regular_to_string(path, what) {
                Ok(text) => Ok(Some(text)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                Err(source) => Err(ModelError::Io {
                    path: path.into(),
                    source,
                }),
            }
        };
        let json = |name: &str| -> Result<serde_json::Value, ModelError> {
            let path = dir.join(name);
            match optional(&path, "JSON file")? {
                Some(text) => serde_json::from_str(&text).map_err(|e| ModelError::Format {
                    path,
                    message: format!("not JSON: {e}"),
                }),
                None => Ok(serde_json::Value::Null),
            }
        };
        let config = json("config.json")?;
        let tok_config = json("tokenizer_config.json")?;
        // A special token is written either as its text or as {"content": text}.
        let token_text = |v: &serde_json::Value| {
            v.as_str()
                .or_else(|| v["content"].as_str())
                .map(str::to_string)
        };
        let bos = token_text(&tok_config["bos_token"]).unwrap_or_default();
        let eos_text = token_text(&tok_config["eos_token"]);
        // transformers 5 saves the template as chat_template.jinja (and no longer in
        // tokenizer_config.json); as in transformers, that file wins over the config's.
        // In the config it is a string, or a list of named templates ("default" is used).
        let jinja = dir.join("chat_template.jinja");
        let (source, origin) = match optional(&jinja, "chat template")? {
            Some(text) => (Some(text), jinja),
            None => {
                let config = &tok_config["chat_template"];
                let source = config.as_str().map(str::to_string).or_else(|| {
                    config.as_array().and_then(|list| {
                        list.iter()
                            .find(|t| t["name"] == "default")
                            .and_then(|t| t["template"].as_str())
                            .map(str::to_string)
                    })
                });
                (source, dir.join("tokenizer_config.json"))
            }
        };
        let template = match source {
            Some(src) => Some(
                ChatTemplate::new(&src, &bos, eos_text.as_deref().unwrap_or_default()).map_err(
                    |e| ModelError::Format {
                        path: origin,
                        message: e.to_string(),
                    },
                )?,
            ),
            None => None,
        };
        let mut eos: Vec<u32> = match &config["eos_token_id"] {
            serde_json::Value::Array(ids) => ids
                .iter()
                .filter_map(|i| i.as_u64())
                .map(|i| i as u32)
                .collect(),
            v => v.as_u64().map(|i| i as u32).into_iter().collect(),
        };
        eos.extend(eos_text.and_then(|t| tokenizer.token_id(&t)));
        Ok(Self::new(model, tokenizer, template, eos))
    }
}
