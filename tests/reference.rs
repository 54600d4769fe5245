//! Our forward pass against candle-transformers' llama implementations, which stay here
//! as references only (they cannot verify a tree: no mask, contiguous positions, last row
//! only, a cache that cannot be cut).
//!
//! - From the GGUF file, in f32, against `quantized_llama` (with CANDLE_DEQUANTIZE_ALL, so
//!   that both multiply the same f32 weights): prefill, every node of a branching tree,
//!   and a step after the cache kept one branch.
//! - From a Hugging Face safetensors directory (written here from the GGUF weights, in
//!   Hugging Face's layout), against `llama`, whose RoPE pairs rows the Hugging Face way:
//!   this checks that the loader reorders q and k rows correctly.
//!
//! This file is its own test binary because CANDLE_DEQUANTIZE_ALL changes every
//! quantized matmul in the process. It needs the default model (tools/setup.sh); set
//! `SUFFIXD_SKIP_MODEL_TESTS=1` to skip without it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file;
use candle_core::{DType, Device, IndexOp, Tensor};
use suffixd::engine::{Engine, GenerateOptions, NoDrafts};
use suffixd::model::forward::{KvCache, Model, WeightFormat};
use suffixd::model::tokenizer::ModelTokenizer;

/// The bar for f32 agreement with the library model.
const TOLERANCE: f32 = 1e-4;

fn model() -> Option<PathBuf> {
    // SAFETY: set before this test binary loads any model; every test here wants both.
    unsafe {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
        std::env::set_var("CANDLE_DEQUANTIZE_ALL", "1");
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    if p.exists() {
        return Some(p);
    }
    if std::env::var_os("SUFFIXD_SKIP_MODEL_TESTS").is_some() {
        eprintln!("skipped: no model and SUFFIXD_SKIP_MODEL_TESTS is set");
        return None;
    }
    panic!("the default model is missing: run tools/setup.sh (or set SUFFIXD_SKIP_MODEL_TESTS=1)");
}

fn read_gguf(path: &Path) -> (gguf_file::Content, std::fs::File) {
    let mut f = std::fs::File::open(path).unwrap();
    let content = gguf_file::Content::read(&mut f).unwrap();
    (content, f)
}

fn prompt_ids(path: &Path) -> Vec<u32> {
    let (content, _) = read_gguf(path);
    let tok = ModelTokenizer::from_gguf(&content).unwrap();
    tok.encode_text("<|im_start|>user\nCopy this JSON: {\"id\": 7, \"city\": \"Lima\"}<|im_end|>\n<|im_start|>assistant\n")
        .unwrap()
}

/// Largest absolute difference between two `(vocab,)` or `(1, vocab)` logit rows.
fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    let a: Vec<f32> = a.flatten_all().unwrap().to_vec1().unwrap();
    let b: Vec<f32> = b.flatten_all().unwrap().to_vec1().unwrap();
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(&b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn chain(n: usize) -> Vec<i32> {
    (0..n as i32).map(|i| i - 1).collect()
}

/// The library's quantized llama after `prefix`: the logits of its last token.
fn library_after(
    path: &Path,
    prefix: &[&[u32]],
) -> (
    candle_transformers::models::quantized_llama::ModelWeights,
    Vec<Tensor>,
) {
    let (content, mut f) = read_gguf(path);
    let mut lib = candle_transformers::models::quantized_llama::ModelWeights::from_gguf(
        content,
        &mut f,
        &Device::Cpu,
    )
    .unwrap();
    let mut pos = 0;
    let mut out = Vec::new();
    for part in prefix {
        let x = Tensor::new(*part, &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        out.push(lib.forward(&x, pos).unwrap());
        pos += part.len();
    }
    (lib, out)
}

#[test]
fn f32_forward_pass_matches_the_library_model_on_prefill_a_branching_tree_and_after_compaction() {
    let Some(path) = model() else { return };
    let (content, _) = read_gguf(&path);
    let ours = Model::load_gguf(&path, &content, WeightFormat::F32, 1024, &Device::Cpu).unwrap();
    let prompt = prompt_ids(&path);
    let n = prompt.len();

    let mut cache = KvCache::default();
    let logits = ours.forward(&mut cache, &prompt, &chain(n)).unwrap();
    let (_, lib) = library_after(&path, &[&prompt]);
    let d = max_diff(&logits.i(n - 1).unwrap(), &lib[0]);
    println!("prefill: max |Δlogit| {d:e}");
    assert!(d < TOLERANCE, "prefill differs by {d}");
    cache.commit(&(0..n).collect::<Vec<_>>()).unwrap();

    // Two branches after the prompt: a → b and c → d.
    let (a, b, c, dd, e) = (504u32, 1056, 19556, 28, 905);
    let logits = ours
        .forward(&mut cache, &[a, b, c, dd], &[-1, 0, -1, 2])
        .unwrap();
    let (_, lib_ab) = library_after(&path, &[&prompt, &[a], &[b]]);
    let (mut lib_cd, lib_cd_out) = library_after(&path, &[&prompt, &[c], &[dd]]);
    for (row, want, name) in [
        (0, &lib_ab[1], "a"),
        (1, &lib_ab[2], "a→b"),
        (2, &lib_cd_out[1], "c"),
        (3, &lib_cd_out[2], "c→d"),
    ] {
        let d = max_diff(&logits.i(row).unwrap(), want);
        println!("tree node {name}: max |Δlogit| {d:e}");
        assert!(d < TOLERANCE, "tree node {name} differs by {d}");
    }

    // Keep the c → d branch; the next token must see exactly prompt, c, d.
    cache.commit(&[2, 3]).unwrap();
    let logits = ours.forward(&mut cache, &[e], &[-1]).unwrap();
    let x = Tensor::new(&[e], &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let want = lib_cd.forward(&x, n + 2).unwrap();
    let d = max_diff(&logits.i(0).unwrap(), &want);
    println!("after compaction: max |Δlogit| {d:e}");
    assert!(d < TOLERANCE, "after compaction differs by {d}");
}

/// Reverse of the loader's q/k row order: GGUF pairs rotary rows within a head
/// (interleaved); Hugging Face pairs row i with row i + head_dim/2.
fn rope_rows_hf(w: &Tensor, heads: usize) -> Tensor {
    let (rows, cols) = w.dims2().unwrap();
    w.reshape((heads, rows / heads / 2, 2, cols))
        .unwrap()
        .transpose(1, 2)
        .unwrap()
        .contiguous()
        .unwrap()
        .reshape((rows, cols))
        .unwrap()
}

/// Write the GGUF model as a Hugging Face llama directory: f32 safetensors in Hugging
/// Face's names and layout, config.json, tokenizer.json and tokenizer_config.json.
fn write_hf_dir(gguf: &Path, dir: &Path) {
    let (content, mut f) = read_gguf(gguf);
    let md = |k: &str| content.metadata.get(k).unwrap_or_else(|| panic!("{k}"));
    let u = |k: &str| md(k).to_u32().unwrap() as usize;
    let (heads, kv_heads, layers) = (
        u("llama.attention.head_count"),
        u("llama.attention.head_count_kv"),
        u("llama.block_count"),
    );
    let mut get = |name: &str| {
        content
            .tensor(&mut f, name, &Device::Cpu)
            .unwrap()
            .dequantize(&Device::Cpu)
            .unwrap()
    };
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    let embed = get("token_embd.weight");
    let vocab = embed.dim(0).unwrap();
    tensors.insert("model.embed_tokens.weight".into(), embed);
    tensors.insert("model.norm.weight".into(), get("output_norm.weight"));
    for i in 0..layers {
        let g = |s: &str| format!("blk.{i}.{s}.weight");
        let h = |s: &str| format!("model.layers.{i}.{s}.weight");
        let q = rope_rows_hf(&get(&g("attn_q")), heads);
        let k = rope_rows_hf(&get(&g("attn_k")), kv_heads);
        tensors.insert(h("self_attn.q_proj"), q);
        tensors.insert(h("self_attn.k_proj"), k);
        for (from, to) in [
            ("attn_v", "self_attn.v_proj"),
            ("attn_output", "self_attn.o_proj"),
            ("attn_norm", "input_layernorm"),
            ("ffn_norm", "post_attention_layernorm"),
            ("ffn_gate", "mlp.gate_proj"),
            ("ffn_up", "mlp.up_proj"),
            ("ffn_down", "mlp.down_proj"),
        ] {
            tensors.insert(h(to), get(&g(from)));
        }
    }
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
    let config = serde_json::json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_act": "silu",
        "hidden_size": u("llama.embedding_length"),
        "intermediate_size": u("llama.feed_forward_length"),
        "vocab_size": vocab,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": md("llama.attention.layer_norm_rms_epsilon").to_f32().unwrap(),
        "rope_theta": md("llama.rope.freq_base").to_f32().unwrap(),
        "max_position_embeddings": u("llama.context_length"),
        "tie_word_embeddings": true,
        "rope_scaling": null,
        "bos_token_id": 1,
        "eos_token_id": 2,
    });
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    let tok = ModelTokenizer::from_gguf(&content).unwrap();
    std::fs::write(dir.join("tokenizer.json"), tok.to_json().unwrap()).unwrap();
    let tok_config = serde_json::json!({
        "chat_template": md("tokenizer.chat_template").to_string().unwrap(),
        "bos_token": "<|im_start|>",
        "eos_token": {"content": "<|im_end|>"},
    });
    std::fs::write(dir.join("tokenizer_config.json"), tok_config.to_string()).unwrap();
}

#[test]
fn hugging_face_directory_loads_and_matches_the_gguf_model_and_the_library_llama() {
    let Some(path) = model() else { return };
    let dir = tempfile::tempdir().unwrap();
    write_hf_dir(&path, dir.path());
    let prompt = prompt_ids(&path);
    let n = prompt.len();

    // Our pass over the directory equals our pass over the GGUF file (same f32 weights).
    let (content, _) = read_gguf(&path);
    let from_gguf =
        Model::load_gguf(&path, &content, WeightFormat::F32, 1024, &Device::Cpu).unwrap();
    let from_hf =
        Model::load_safetensors(dir.path(), WeightFormat::F32, 1024, &Device::Cpu).unwrap();
    let tree = [504u32, 1056, 19556, 28];
    let run = |m: &Model| {
        let mut cache = KvCache::default();
        let first = m.forward(&mut cache, &prompt, &chain(n)).unwrap();
        cache.commit(&(0..n).collect::<Vec<_>>()).unwrap();
        let second = m.forward(&mut cache, &tree, &[-1, 0, -1, 2]).unwrap();
        Tensor::cat(&[first.i(n - 1).unwrap().unsqueeze(0).unwrap(), second], 0).unwrap()
    };
    let (ours_gguf, ours_hf) = (run(&from_gguf), run(&from_hf));
    let d = max_diff(&ours_gguf, &ours_hf);
    println!("directory vs GGUF: max |Δlogit| {d:e}");
    assert!(
        d < 1e-6,
        "the directory's model differs from the GGUF's by {d}"
    );

    // The library's llama reads the directory with Hugging Face's RoPE pairing.
    let cfg: candle_transformers::models::llama::LlamaConfig =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    let cfg = cfg.into_config(false);
    // SAFETY: the file was written above and is not modified while mapped.
    let vb = unsafe {
        candle_nn::VarBuilder::from_mmaped_safetensors(
            &[dir.path().join("model.safetensors")],
            DType::F32,
            &Device::Cpu,
        )
        .unwrap()
    };
    let lib = candle_transformers::models::llama::Llama::load(vb, &cfg).unwrap();
    let mut lib_cache =
        candle_transformers::models::llama::Cache::new(true, DType::F32, &cfg, &Device::Cpu)
            .unwrap();
    let x = Tensor::new(prompt.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let want = lib.forward(&x, 0, &mut lib_cache).unwrap();
    let d = max_diff(&ours_hf.i(0).unwrap(), &want);
    println!("directory vs library llama: max |Δlogit| {d:e}");
    assert!(
        d < TOLERANCE,
        "the directory's model differs from the library llama by {d}"
    );

    // The engine over the directory: same tokenizer identity, template and greedy output.
    let gguf_engine = Engine::load(&path, WeightFormat::F32, 1024, &Device::Cpu).unwrap();
    let hf_engine = Engine::load(dir.path(), WeightFormat::F32, 1024, &Device::Cpu).unwrap();
    assert_eq!(
        gguf_engine.tokenizer_identity(),
        hf_engine.tokenizer_identity()
    );
    let messages = vec![suffixd::corpus::logs::ChatMessage {
        role: "user".into(),
        content: "Name a city.".into(),
        ..Default::default()
    }];
    let rendered = |e: &Engine| {
        e.template()
            .expect("a chat template")
            .render(&messages)
            .unwrap()
    };
    assert_eq!(rendered(&gguf_engine), rendered(&hf_engine));

    // As transformers 5 saves it: the template in chat_template.jinja, which wins over
    // one left in tokenizer_config.json (as transformers reads them).
    let config_path = dir.path().join("tokenizer_config.json");
    let mut tok_config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    let template = tok_config["chat_template"].as_str().unwrap().to_string();
    std::fs::write(dir.path().join("chat_template.jinja"), template).unwrap();
    tok_config["chat_template"] = "{{ 'not the template' }}".into();
    std::fs::write(&config_path, tok_config.to_string()).unwrap();
    let jinja_engine = Engine::load(dir.path(), WeightFormat::F32, 1024, &Device::Cpu).unwrap();
    assert_eq!(rendered(&gguf_engine), rendered(&jinja_engine));
    drop(jinja_engine);

    let opts = GenerateOptions {
        max_tokens: 12,
        speculate: false,
        ..GenerateOptions::default()
    };
    let mut gguf_engine = gguf_engine;
    let mut hf_engine = hf_engine;
    let a = gguf_engine
        .generate(&prompt, &opts, &mut NoDrafts, &mut |_| true)
        .unwrap();
    let b = hf_engine
        .generate(&prompt, &opts, &mut NoDrafts, &mut |_| true)
        .unwrap();
    assert!(!a.tokens.is_empty());
    assert_eq!(a.tokens, b.tokens);
}

#[test]
fn broken_hugging_face_directories_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let err = |d: &Path| {
        Model::load_safetensors(d, WeightFormat::F32, 64, &Device::Cpu)
            .err()
            .unwrap()
            .to_string()
    };
    assert!(
        err(dir.path()).contains("config.json"),
        "{}",
        err(dir.path())
    );
    std::fs::write(dir.path().join("config.json"), "{\"hidden_size\": 8}").unwrap();
    assert!(
        err(dir.path()).contains("not a model config.json"),
        "{}",
        err(dir.path())
    );
    let cfg = serde_json::json!({
        "model_type": "llama", "hidden_size": 8, "num_attention_heads": 2, "num_hidden_layers": 1,
        "rms_norm_eps": 1e-5, "max_position_embeddings": 64, "rope_scaling": {"rope_type": "llama3"},
    });
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    assert!(
        err(dir.path()).contains("rope_scaling"),
        "{}",
        err(dir.path())
    );
    let mut cfg = cfg;
    cfg["rope_scaling"] = serde_json::Value::Null;
    std::fs::write(dir.path().join("config.json"), cfg.to_string()).unwrap();
    assert!(
        err(dir.path()).contains("no model.safetensors"),
        "{}",
        err(dir.path())
    );
    std::fs::write(dir.path().join("model.safetensors"), b"not safetensors").unwrap();
    assert!(
        err(dir.path()).contains("safetensors"),
        "{}",
        err(dir.path())
    );
}
