//! Positions beyond plain RoPE (a module of tests/families.rs):
//!
//! - YaRN scaling (Qwen's model cards' way to long contexts) against Hugging Face
//!   transformers itself: the tiny Qwen 2 model's logits under four YaRN configs, computed
//!   by transformers and kept in `tests/fixtures/yarn_transformers.json`
//!   (`tools/yarn-fixture.py` rewrites it; the test suite installs no PyTorch), and the
//!   same from GGUF files carrying the keys llama.cpp's converter writes;
//! - SmolLM3's layers without RoPE (NoPE) against candle-transformers' `smollm3`, and
//!   from GGUF.

use super::*;

/// The fixture: per variant, the config patch, transformers' inverse frequencies and its
/// logits of every prefix of PROMPT.
fn fixture() -> serde_json::Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/yarn_transformers.json");
    let fixture: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    assert_eq!(fixture["prompt"], serde_json::json!(PROMPT));
    fixture
}

fn rows(v: &serde_json::Value) -> Vec<Vec<f32>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|row| {
            (row.as_array().unwrap().iter())
                .map(|x| x.as_f64().unwrap() as f32)
                .collect()
        })
        .collect()
}

/// The tiny Qwen 2 written as a directory with `patch` on its config (a transformers 5
/// `rope_parameters` carries its own base, as tools/yarn-fixture.py writes it).
fn patched(tiny: &Tiny, dir: &Path, patch: &serde_json::Value) -> Model {
    tiny.write_hf(dir);
    let mut config = tiny.config(false);
    for (k, v) in patch.as_object().unwrap() {
        config[k] = v.clone();
    }
    if patch.get("rope_parameters").is_some() {
        config.as_object_mut().unwrap().remove("rope_theta");
    }
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    Model::load_safetensors(dir, WeightFormat::F32, CONTEXT, &Device::Cpu).unwrap()
}

#[test]
fn yarn_matches_transformers_from_a_directory_and_from_gguf() {
    use gguf_file::Value;
    let fixture = fixture();
    let tiny = Tiny::new(Fam::Qwen2);
    let dir = tempfile::tempdir().unwrap();
    let unscaled = {
        tiny.write_hf(dir.path());
        let hf = Model::load_safetensors(dir.path(), WeightFormat::F32, CONTEXT, &Device::Cpu);
        ours(&hf.unwrap(), &PROMPT)
    };
    let variants = fixture["variants"].as_object().unwrap();
    assert_eq!(variants.len(), 4);
    let mut from_dir = HashMap::new();
    for (name, variant) in variants {
        let reference = rows(&variant["logits"]);
        let logits = ours(&patched(&tiny, dir.path(), &variant["patch"]), &PROMPT);
        agree(
            &format!("YaRN {name}: directory vs transformers"),
            &logits,
            |n| reference[n - 1].clone(),
        );
        // It can fail: the scaling moves every logit past the tolerance here.
        let last = PROMPT.len() - 1;
        assert!(worst(&unscaled[last], &reference[last]) > 1e-2, "{name}");
        from_dir.insert(name.clone(), logits);
    }

    // The frequencies themselves, against transformers' (f32; the band is blended).
    let yarn = |base: f32, original: f32| {
        let yarn = suffixd::model::arch::Yarn {
            factor: 4.0,
            original_context: original,
            beta_fast: 32.0,
            beta_slow: 1.0,
            truncate: true,
            ext_factor: 1.0,
        };
        suffixd::model::arch::RopeSpec {
            base,
            divisors: suffixd::model::arch::yarn_rope_divisors(16, base, &yarn),
            scale: 1.0,
        }
        .inverse_frequencies(16)
    };
    for (name, ours) in [
        ("qwen_card", yarn(10_000.0, 16.0)),
        ("wide_band", yarn(100.0, 64.0)),
    ] {
        let theirs = &variants[name]["inverse_frequencies"];
        for (i, (a, b)) in ours.iter().zip(theirs.as_array().unwrap()).enumerate() {
            let b = b.as_f64().unwrap() as f32;
            assert!(
                (a - b).abs() <= 1e-6 * b,
                "{name} frequency {i}: {a} vs {b}"
            );
        }
    }

    // GGUF, with the keys llama.cpp reads for these architectures (it always rounds the
    // band's ends and reads no other YaRN number for them).
    let path = dir.path().join("model.gguf");
    let run = |keys: &[(&str, Value)]| {
        tiny.write_gguf_with(&path, GgmlDType::F32, |md| {
            for (k, v) in keys {
                let k = format!("qwen2.{k}");
                md.retain(|(have, _)| *have != k);
                md.push((k, v.clone()));
            }
        });
        ours(&load_gguf(&path, WeightFormat::F32), &PROMPT)
    };
    let yarn_keys = |original: u32| {
        vec![
            ("rope.scaling.type", Value::String("yarn".into())),
            ("rope.scaling.factor", Value::F32(4.0)),
            ("rope.scaling.original_context_length", Value::U32(original)),
        ]
    };
    let card = run(&yarn_keys(16));
    agree("YaRN GGUF vs directory (Qwen's card)", &card, |n| {
        from_dir["qwen_card"][n - 1].clone()
    });
    let mut wide = yarn_keys(64);
    wide.push(("rope.freq_base", Value::F32(100.0)));
    agree("YaRN GGUF vs directory (wide band)", &run(&wide), |n| {
        from_dir["wide_band"][n - 1].clone()
    });
    // llama.cpp's `rope.scaling.attn_factor` multiplies YaRN's own factor.
    let mscale = 0.1 * 4f32.ln() + 1.0;
    let mut outright = yarn_keys(16);
    outright.push(("rope.scaling.attn_factor", Value::F32(1.5 / mscale)));
    agree(
        "YaRN GGUF vs directory (attention factor)",
        &run(&outright),
        |n| from_dir["attention_factor"][n - 1].clone(),
    );
}

#[test]
fn yarn_stretches_the_context_positions_are_made_for() {
    let tiny = Tiny::new(Fam::Qwen2);
    let dir = tempfile::tempdir().unwrap();
    // The config's own limit is CONTEXT (64): YaRN's factor 4 over a trained 16 is 64 too;
    // over a trained 64 it is 256, which the directory then serves.
    let load = |original: usize, limit: usize| {
        let patch = serde_json::json!({"rope_scaling": {"rope_type": "yarn", "factor": 4.0,
            "original_max_position_embeddings": original}});
        tiny.write_hf(dir.path());
        let mut config = tiny.config(false);
        config["rope_scaling"] = patch["rope_scaling"].clone();
        std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
        Model::load_safetensors(dir.path(), WeightFormat::F32, limit, &Device::Cpu)
            .unwrap()
            .config()
            .context
    };
    assert_eq!(load(16, 1024), CONTEXT);
    assert_eq!(load(64, 1024), 256);
    assert_eq!(load(64, 100), 100, "the caller's limit still binds");
}

#[test]
fn smollm3_s_layers_without_rope_match_the_library_s_smollm3_from_a_directory_and_from_gguf() {
    use candle_transformers::models::smol::smollm3;
    let tiny = Tiny::new(Fam::SmolLM3);
    let dir = tempfile::tempdir().unwrap();
    let load_dir = |config: &serde_json::Value| {
        tiny.write_hf(dir.path());
        std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
        let model = Model::load_safetensors(dir.path(), WeightFormat::F32, CONTEXT, &Device::Cpu);
        ours(&model.unwrap(), &PROMPT)
    };
    let library = |config: &serde_json::Value, n: usize| {
        let cfg: smollm3::Config = serde_json::from_value(config.clone()).unwrap();
        let mut lib = smollm3::ModelForCausalLM::new(&cfg, var_builder(dir.path())).unwrap();
        flat(&lib.forward(&input(n), 0).unwrap())
    };
    // Every fourth layer without RoPE (SmolLM3-3B's config), then a list of its own.
    let every_fourth = tiny.config(false);
    let from_dir = load_dir(&every_fourth);
    agree("SmolLM3 (every 4th) vs the library", &from_dir, |n| {
        library(&every_fourth, n)
    });
    let mut listed = every_fourth.clone();
    listed["no_rope_layers"] = serde_json::json!([1, 0, 1, 0]);
    let from_list = load_dir(&listed);
    agree("SmolLM3 (no_rope_layers) vs the library", &from_list, |n| {
        library(&listed, n)
    });
    // It can fail: the same weights with RoPE on every layer (llama's block) differ.
    let mut rotated = every_fourth.clone();
    rotated["model_type"] = serde_json::json!("llama");
    let llama = load_dir(&rotated);
    let last = PROMPT.len() - 1;
    assert!(worst(&llama[last], &from_dir[last]) > 1e-3);
    assert!(worst(&from_list[last], &from_dir[last]) > 1e-3);

    // GGUF (architecture smollm3: llama's tensors, every fourth layer without RoPE, as
    // llama.cpp fixes it).
    tiny.write_hf(dir.path());
    let path = dir.path().join("model.gguf");
    tiny.write_gguf(&path, GgmlDType::F32);
    let from_gguf = ours(&load_gguf(&path, WeightFormat::F32), &PROMPT);
    agree("SmolLM3 GGUF vs directory", &from_gguf, |n| {
        from_dir[n - 1].clone()
    });

    // A list that does not fit the layers is refused by name.
    listed["no_rope_layers"] = serde_json::json!([1, 0]);
    std::fs::write(dir.path().join("config.json"), listed.to_string()).unwrap();
    let err = Model::load_safetensors(dir.path(), WeightFormat::F32, CONTEXT, &Device::Cpu)
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("no_rope_layers has 2 entries for 4 layers"),
        "{err}"
    );
}
