//! The grammar module's unit tests, over the default model's tokenizer.

use super::*;

use std::path::Path;

/// A compiler over SmolLM2's tokenizer: the shared data's copy when this checkout
/// sits beside it, else the default model's (which `tools/setup.sh` installs).
pub(crate) fn smollm2() -> (GrammarCompiler, ModelTokenizer) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let shared = root.join("../shared/data/sharegpt/tokenizer_smollm2.json");
    let model = root.join("models/SmolLM2-135M-Instruct.Q4_1.gguf");
    let tokenizer = if shared.exists() {
        ModelTokenizer::from_file(&shared).unwrap()
    } else {
        let mut file = std::fs::File::open(&model)
            .unwrap_or_else(|e| panic!("{}: {e}; run tools/setup.sh", model.display()));
        let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
        ModelTokenizer::from_gguf(&content).unwrap()
    };
    let eos = [tokenizer.token_id("<|im_end|>").unwrap()];
    let compiler = GrammarCompiler::new(&tokenizer, 49152, &eos).unwrap();
    (compiler, tokenizer)
}

/// The tokenizers the project loads: the default model's (from its GGUF) and, where
/// they are here, the shared data's SmolLM2 tokenizer.json and Gemma 3's GGUF.
fn loaded_tokenizers() -> Vec<(String, ModelTokenizer)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let gguf = |path: &Path| {
        let mut file = std::fs::File::open(path).ok()?;
        let content = candle_core::quantized::gguf_file::Content::read(&mut file).ok()?;
        ModelTokenizer::from_gguf(&content).ok()
    };
    let mut found = vec![(
        "the default model".to_string(),
        gguf(&root.join("models/SmolLM2-135M-Instruct.Q4_1.gguf")).expect("run tools/setup.sh"),
    )];
    let shared = root.join("../shared/data/sharegpt/tokenizer_smollm2.json");
    if let Ok(t) = ModelTokenizer::from_file(&shared) {
        found.push(("tokenizer_smollm2.json".into(), t));
    }
    if let Some(t) = gguf(&root.join("models/gemma-3-270m-q4_k_m.gguf")) {
        found.push(("Gemma 3".into(), t));
    }
    found
}

/// Every token of each vocabulary maps to the bytes the tokenizer decodes it to
/// (read after a plain token, so that a decoder's handling of a leading space shows
/// as it does mid-text). Tokens that are part of a character decode to U+FFFD and
/// are checked by the next test instead.
#[test]
fn every_token_maps_to_its_exact_bytes() {
    for (name, tokenizer) in loaded_tokenizers() {
        let vocab = tokenizer.vocab_size();
        let words = token_bytes(&tokenizer, vocab).unwrap();
        let lead = tokenizer.encode_literal("a").unwrap();
        let lead_text = tokenizer.decode(&lead, false).unwrap();
        let (mut checked, mut partial) = (0, 0);
        for t in 0..vocab as u32 {
            if words[t as usize].first() == Some(&TokTrie::SPECIAL_TOKEN_MARKER) {
                continue;
            }
            let ids: Vec<u32> = lead.iter().copied().chain([t]).collect();
            let text = tokenizer.decode(&ids, false).unwrap();
            let Some(own) = text.strip_prefix(lead_text.as_str()) else {
                panic!("{name}: token {t} rewrote the text before it: {text:?}");
            };
            if own.contains('\u{fffd}') {
                partial += 1;
                continue;
            }
            assert_eq!(
                words[t as usize],
                own.as_bytes(),
                "{name}: token {t} ({own:?})"
            );
            checked += 1;
        }
        assert!(
            checked > vocab * 9 / 10,
            "{name}: {checked} of {vocab} tokens checked, {partial} partial"
        );
    }
}

/// Bytes that stop inside a character (what the grammar engine forces before the
/// rest of "é" is decided) tokenize to tokens whose bytes are exactly those.
#[test]
fn forced_bytes_that_split_a_character_tokenize_to_those_bytes() {
    for (name, tokenizer) in loaded_tokenizers() {
        let vocab = tokenizer.vocab_size();
        let words = token_bytes(&tokenizer, vocab).unwrap();
        let info = TokRxInfo::new(vocab as u32, 0);
        let env = Vocabulary {
            trie: TokTrie::from(&info, &words),
            tokenizer: tokenizer.clone(),
        };
        for text in ["é", "ï\u{8b}", "x: \"日本", "🦀"] {
            let bytes = text.as_bytes();
            for cut in 1..=bytes.len() {
                let ids = env.tokenize_bytes(&bytes[..cut]);
                let spelled: Vec<u8> = ids
                    .iter()
                    .flat_map(|&t| words[t as usize].clone())
                    .collect();
                assert_eq!(
                    spelled,
                    &bytes[..cut],
                    "{name}: {text:?} cut at {cut}: {ids:?}"
                );
            }
        }
    }
}

/// Schemas built to nest as deep as the limits allow, every way a schema nests
/// (references, anyOf, allOf, arrays, objects, mixed), compile on the compile thread;
/// one level of references past the limit is refused before compiling, by name.
/// Before the limits, a chain of 800 references aborted the process.
#[test]
fn schemas_at_the_limits_compile_and_past_them_are_refused() {
    let (compiler, _) = smollm2();
    let limits = *compiler.limits();
    // Each link is one object, reached by reference from the one before.
    let chain = |n: usize, link: &dyn Fn(String) -> serde_json::Value| {
        let mut defs = serde_json::Map::new();
        for i in 0..n {
            defs.insert(format!("d{i}"), link(format!("#/$defs/d{}", i + 1)));
        }
        defs.insert(format!("d{n}"), serde_json::json!({"type": "integer"}));
        serde_json::json!({"$ref": "#/$defs/d0", "$defs": defs})
    };
    type Link = fn(String) -> serde_json::Value;
    let links: [(&str, Link); 5] = [
        ("$ref", |r| serde_json::json!({"$ref": r})),
        (
            "anyOf",
            |r| serde_json::json!({"anyOf": [{"$ref": r}, {"type": "null"}]}),
        ),
        ("allOf", |r| serde_json::json!({"allOf": [{"$ref": r}]})),
        (
            "items",
            |r| serde_json::json!({"type": "array", "items": {"$ref": r}}),
        ),
        (
            "object",
            |r| serde_json::json!({"type": "object", "properties": {"a": {"$ref": r}}, "required": ["a"]}),
        ),
    ];
    for (name, link) in links {
        // The longest n whose schema passes the check compiles.
        let mut n = limits.max_depth;
        let mut fits = chain(n, &link);
        while check_schema(&fits, &limits).is_err() {
            n -= 1;
            fits = chain(n, &link);
        }
        let started = std::time::Instant::now();
        compiler
            .compile(&GrammarSpec::JsonSchema(fits))
            .unwrap_or_else(|e| panic!("{name} chain of {n}: {e}"));
        eprintln!("{name}: a chain of {n} compiled in {:?}", started.elapsed());
        let e = compiler
            .compile(&GrammarSpec::JsonSchema(chain(n + 1, &link)))
            .unwrap_err();
        assert!(matches!(e, GrammarError::TooComplex(_)), "{name}: {e}");
    }
    // As wide as allowed: every property required.
    let names: Vec<String> = (0..limits.max_properties)
        .map(|i| format!("p{i}"))
        .collect();
    let props: serde_json::Map<_, _> = names
        .iter()
        .map(|n| (n.clone(), serde_json::json!({"type": "integer"})))
        .collect();
    let wide = serde_json::json!({"type": "object", "properties": props, "required": names});
    compiler.compile(&GrammarSpec::JsonSchema(wide)).unwrap();
}

/// Greedy decoding of a fixed preference under a constraint: the answer follows
/// the schema even when the "model" would rather say something else.
#[test]
fn the_mask_holds_answers_to_the_schema() {
    let (compiler, tok) = smollm2();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"name": {"type": "string", "enum": ["ada", "bob"]}, "n": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["name", "n"], "additionalProperties": false
    });
    let grammar = compiler.compile(&GrammarSpec::JsonSchema(schema)).unwrap();
    let mut c = grammar.start();
    // The "model" prefers the word "hello" and digits, then the end.
    let prefer: Vec<u32> = tok.encode_text("hello 7").unwrap();
    let eos = tok.token_id("<|im_end|>").unwrap();
    let mut out = Vec::new();
    for _ in 0..40 {
        let mut logits = vec![0.0f32; 49152];
        for (rank, &t) in prefer.iter().enumerate() {
            logits[t as usize] = 10.0 - rank as f32;
        }
        logits[eos as usize] = 5.0;
        c.mask_logits(&mut logits).unwrap();
        let best = (0..logits.len())
            .max_by(|&a, &b| logits[a].total_cmp(&logits[b]).then(b.cmp(&a)))
            .unwrap() as u32;
        assert!(logits[best as usize].is_finite(), "the mask left a token");
        if best == eos {
            break;
        }
        c.advance(best).unwrap();
        out.push(best);
        if c.is_finished() {
            break;
        }
    }
    let text = tok.decode(&out, true).unwrap();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert!(matches!(v["name"].as_str(), Some("ada" | "bob")), "{text}");
    assert!(
        v["n"].as_i64().is_some_and(|n| (0..=99).contains(&n)),
        "{text}"
    );
    assert!(text.starts_with("{\"name\": \""), "one layout: {text}");
}

/// A draft's forbidden branches are cut and the forced tokens drafted; the state is
/// unchanged by shaping.
#[test]
fn drafts_lose_forbidden_branches_and_gain_forced_tokens() {
    let (compiler, tok) = smollm2();
    let schema = serde_json::json!({
        "type": "object", "properties": {"colour": {"type": "string"}},
        "required": ["colour"], "additionalProperties": false
    });
    let grammar = compiler.compile(&GrammarSpec::JsonSchema(schema)).unwrap();
    let mut c = grammar.start();
    // Two branches: prose (forbidden) and the object's first token.
    let prose = tok.encode_text("Sure").unwrap();
    let brace = tok.encode_text("{").unwrap();
    let mut draft = Draft::default();
    draft.graft_chain(-1, &prose);
    draft.graft_chain(-1, &brace);
    c.shape_draft(&mut draft).unwrap();
    let all = tok.decode(&draft.tokens, true).unwrap();
    assert!(!all.contains("Sure"), "{all}");
    // The forced tokens (from the start: the brace, the key and its separator) are
    // one path of the draft.
    let forced = c.matcher.compute_ff_tokens();
    assert!(
        tok.decode(&forced, true)
            .unwrap()
            .starts_with("{\"colour\":")
    );
    assert_eq!(draft.follow(&forced).1, forced.len(), "{all:?}");
    // The state did not move: the whole draft is still allowed from it, and the
    // forced tokens are already there.
    let mut again = draft.clone();
    c.shape_draft(&mut again).unwrap();
    assert_eq!(again.tokens[..draft.len()], draft.tokens);
    // Without forcing, only the cut.
    let mut plain = Draft::default();
    plain.graft_chain(-1, &prose);
    plain.graft_chain(-1, &brace);
    let mut c = grammar.clone().drafting_forced_tokens(false).start();
    c.shape_draft(&mut plain).unwrap();
    assert_eq!(plain.tokens, brace);
}

/// The cut keeps exactly the nodes whose path the grammar takes token by token,
/// across a tree of valid and invalid answers branching at every depth; a forced
/// value longer than a pass is drafted up to [`FORCED_DRAFT_TOKENS`], and shaping
/// leaves the state where it was.
#[test]
fn the_cut_keeps_the_paths_the_grammar_takes_and_forced_chains_are_bounded() {
    let (compiler, tok) = smollm2();
    let schema = serde_json::json!({
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"], "additionalProperties": false
    });
    let grammar = compiler.compile(&GrammarSpec::JsonSchema(schema)).unwrap();
    let answers = [
        r#"{"name": "Ann", "age": 31}"#,
        r#"{"name": "Ann", "age": "31"}"#,
        r#"{"name": "Anna", "age": 3}"#,
        r#"{"nam": 1}"#,
        r#"{"age": 4, "name": "x"}"#,
        r#"Sure! {"name": "Bo", "age": 2}"#,
        r#"{"name": 7}"#,
    ];
    let mut draft = Draft::default();
    for a in answers {
        let tokens = tok.encode_text(a).unwrap();
        let (under, done) = draft.follow(&tokens);
        draft.graft_chain(under, &tokens[done..]);
    }
    let want: Vec<Vec<u32>> = (0..draft.len())
        .filter_map(|i| {
            let path: Vec<u32> = draft.path_to(i).iter().map(|&n| draft.tokens[n]).collect();
            let mut c = grammar.start();
            path.iter().all(|&t| c.try_advance(t)).then_some(path)
        })
        .collect();
    assert!(
        want.len() > 5 && want.len() < draft.len(),
        "{} of {}",
        want.len(),
        draft.len()
    );
    let mut c = grammar.clone().drafting_forced_tokens(false).start();
    let mut cut = draft.clone();
    c.shape_draft(&mut cut).unwrap();
    let kept: Vec<Vec<u32>> = (0..cut.len())
        .map(|i| cut.path_to(i).iter().map(|&n| cut.tokens[n]).collect())
        .collect();
    assert_eq!(kept, want);

    let long: String = "abcdefghij".repeat(5_000);
    let schema = serde_json::json!({"type": "object", "properties": {"v": {"const": long}},
        "required": ["v"]});
    let grammar = compiler.compile(&GrammarSpec::JsonSchema(schema)).unwrap();
    let mut c = grammar.start();
    let mut out = Vec::new();
    for _ in 0..3 {
        let mut draft = Draft::default();
        c.shape_draft(&mut draft).unwrap();
        assert_eq!(draft.len(), FORCED_DRAFT_TOKENS);
        assert_eq!(c.forced_next().unwrap(), Some(draft.tokens[0]));
        let mut logits = vec![0f32; 49152];
        c.mask_logits(&mut logits).unwrap();
        let allowed: Vec<usize> = (0..logits.len())
            .filter(|&i| logits[i].is_finite())
            .collect();
        assert_eq!(allowed, [draft.tokens[0] as usize], "one token is forced");
        c.advance(draft.tokens[0]).unwrap();
        out.push(draft.tokens[0]);
    }
    let text = tok.decode(&out, true).unwrap();
    assert!(format!("{{\"v\": \"{long}").starts_with(&text), "{text}");
}

/// A spec compiled again comes from the cache, refusals included, and answers as a
/// fresh compile does; the cache keeps the most recently used within its bounds.
#[test]
fn a_spec_compiled_again_comes_from_the_cache() {
    let (compiler, _) = smollm2();
    let schema = GrammarSpec::JsonSchema(serde_json::json!({
        "type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]
    }));
    let bad = GrammarSpec::JsonSchema(serde_json::json!({"type": "no-such-type"}));
    let masks = |g: &Grammar| {
        let mut c = g.start();
        let mut logits = vec![0.0f32; 49152];
        c.mask_logits(&mut logits).unwrap();
        logits
    };
    // A request that went away while it waited for a slot costs no compile, and
    // leaves nothing in the cache.
    let gone = compiler.compile_while(&schema, &|| false).unwrap_err();
    assert!(matches!(gone, GrammarError::Compiler(_)), "{gone}");
    assert_eq!(compiler.compiled.lock().unwrap().grammars.len(), 0);
    let first = compiler.compile(&schema).unwrap();
    let again = compiler.compile(&schema).unwrap();
    assert_eq!(masks(&first), masks(&again));
    assert!(compiler.compile(&bad).is_err());
    let refused = compiler.compile(&bad).unwrap_err();
    assert!(refused.to_string().contains("no-such-type"), "{refused}");
    {
        let compiled = compiler.compiled.lock().unwrap();
        assert_eq!(compiled.grammars.len(), 2);
        assert!(compiled.grammars.contains(&source_key(&schema)));
        assert!(compiled.grammars.contains(&source_key(&bad)));
    }
    // The bounds: entries, then source bytes; a source past them is not kept.
    let mut cache = Compiled {
        grammars: lru::LruCache::unbounded(),
        source_bytes: 0,
    };
    let refusal = || Err(GrammarError::Invalid("x".into()));
    for i in 0..COMPILED_GRAMMARS + 5 {
        cache.put(format!("key {i}"), refusal());
    }
    assert_eq!(cache.grammars.len(), COMPILED_GRAMMARS);
    assert!(cache.get("key 0").is_none() && cache.get("key 5").is_some());
    cache.put("y".repeat(COMPILED_SOURCE_BYTES + 1), refusal());
    assert!(cache.get(&"y".repeat(COMPILED_SOURCE_BYTES + 1)).is_none());
    cache.put("z".repeat(COMPILED_SOURCE_BYTES - 2), refusal());
    assert!(cache.source_bytes <= COMPILED_SOURCE_BYTES);
    assert_eq!(cache.grammars.len(), 1, "the big one pushed the rest out");

    // Grammars no one asked for lately are forgotten, least recently used first; one
    // asked for since stays.
    let mut cache = Compiled {
        grammars: lru::LruCache::unbounded(),
        source_bytes: 0,
    };
    cache.put("old".into(), refusal());
    cache.put("older".into(), refusal());
    std::thread::sleep(Duration::from_millis(30));
    assert!(cache.get("old").is_some());
    assert_eq!(cache.forget_unused(Duration::from_secs(3600)), 0);
    assert_eq!(cache.forget_unused(Duration::from_millis(20)), 1);
    assert!(cache.get("older").is_none() && cache.get("old").is_some());
    assert_eq!(cache.source_bytes, "old".len());
    assert_eq!(cache.forget_unused(Duration::ZERO), 1);
    assert_eq!((cache.grammars.len(), cache.source_bytes), (0, 0));
}

#[test]
fn invalid_schemas_and_grammars_are_named() {
    let (compiler, _) = smollm2();
    for (spec, needle) in [
        (
            GrammarSpec::JsonSchema(serde_json::json!([1, 2])),
            "must be an object",
        ),
        (
            GrammarSpec::JsonSchema(serde_json::json!({"type": "no-such-type"})),
            "no-such-type",
        ),
        (GrammarSpec::Lark("start: /[abc/".into()), "regex"),
    ] {
        let e = compiler.compile(&spec).unwrap_err();
        assert!(
            matches!(e, GrammarError::Invalid(_)) && e.to_string().contains(needle),
            "{spec:?}: {e}"
        );
    }
}

/// A token the grammar forces is named without logits; where it allows a choice there is
/// none, and the mask computed for the question is the one applied.
#[test]
fn a_forced_token_is_named_and_a_choice_is_masked() {
    let (compiler, tok) = smollm2();
    let schema = serde_json::json!({"type": "string", "enum": ["alpha", "beta"]});
    let grammar = compiler.compile(&GrammarSpec::JsonSchema(schema)).unwrap();
    let mut c = grammar.start();
    let quote = tok.encode_text("\"").unwrap();
    assert_eq!(c.forced_next().unwrap(), Some(quote[0]));
    c.advance(quote[0]).unwrap();
    assert_eq!(c.forced_next().unwrap(), None, "alpha or beta");
    let mut logits = vec![0f32; 49152];
    c.mask_logits(&mut logits).unwrap();
    let allowed: Vec<String> = (0..logits.len())
        .filter(|&i| logits[i].is_finite())
        .map(|i| tok.decode(&[i as u32], false).unwrap())
        .collect();
    assert!(allowed.len() >= 2, "{allowed:?}");
    assert!(
        allowed
            .iter()
            .all(|t| "alpha".starts_with(t.as_str()) || "beta".starts_with(t.as_str())),
        "{allowed:?}"
    );
}
