//! Constrained decoding: a grammar limits which tokens may come next, so that the answer
//! is valid JSON for a schema, or a tool call in the form the parser reads.
//!
//! Grammars are JSON schemas or Lark grammars, compiled by llguidance (the library
//! llama.cpp and vLLM use) against the model's vocabulary. The [`GrammarCompiler`] is
//! built once per model; compiling a request's grammar ([`GrammarCompiler::compile`])
//! happens on the serving edge, so an invalid schema is the client's 400 before the
//! request reaches the model thread. Each running request holds a [`Constraint`]: the
//! grammar's state after the tokens generated so far.
//!
//! The engine applies the constraint at every position it accepts a token for, drafted or
//! not: the logits of that position are masked to what the grammar allows there, then
//! the greedy or sampled choice is made as without a grammar. A drafted token is
//! accepted only if it is the masked choice, so constrained output with speculation is
//! the constrained output without it, token for token. Drafting also gains from the
//! grammar ([`Constraint::shape_draft`]): draft branches that the grammar forbids are cut
//! before they cost a row, and the tokens it forces (a schema's keys, quotes and braces)
//! are drafted.
//!
//! A request's schema is bounded before it is compiled ([`limits`]), and compiles run on
//! threads of their own with a large stack, a few at a time: a schema that nests deeper
//! than the compiler's recursion can go is the client's 400, never a crash.

mod limits;

use std::sync::{Arc, Condvar, Mutex};

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{InferenceCapabilities, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};

use crate::speculate::{Draft, DraftSource};

use super::tokenizer::ModelTokenizer;

pub use limits::{SchemaLimits, check_schema};

/// The stack of a compile thread. llguidance recurses about 4 KB per level of a schema;
/// [`SchemaLimits`]' depth needs a few MB, and the rest covers what its reading of a
/// schema might miss. Only the pages a compile touches are ever resident, and they are
/// returned when its thread ends.
pub const COMPILE_STACK_BYTES: usize = 256 << 20;

/// Errors from building a grammar or running one.
#[derive(Clone, Debug, thiserror::Error)]
pub enum GrammarError {
    /// The model's tokenizer cannot be described to the grammar engine.
    #[error("constrained decoding is unavailable for this model's tokenizer: {0}")]
    Tokenizer(String),
    /// The schema or grammar is invalid, or uses what the grammar engine does not support.
    #[error("{0}")]
    Invalid(String),
    /// The grammar could not go on while generating: a schema past the engine's limits
    /// (its lexer or parser ran out of fuel), or a bug.
    #[error("the grammar failed while generating: {0}")]
    Failed(String),
    /// The schema is larger or deeper than the server compiles ([`SchemaLimits`]).
    #[error("{0}")]
    TooComplex(String),
    /// The compiler could not run (no thread could be started, or it panicked): the
    /// server's fault, not the schema's.
    #[error("the grammar compiler could not run: {0}")]
    Compiler(String),
}

/// What constrains an answer.
#[derive(Clone, Debug)]
pub enum GrammarSpec {
    /// Any JSON object (`response_format: {"type": "json_object"}`).
    JsonObject,
    /// JSON valid under this schema.
    JsonSchema(serde_json::Value),
    /// A grammar in llguidance's Lark syntax (which can embed schemas with `%json`).
    Lark(String),
}

/// How JSON is laid out under a schema: one space after `,` and `:`, no other
/// whitespace. One layout makes the keys, separators and braces forced tokens (drafted
/// for free) and makes answers repeat token for token, which the suffix trees learn.
/// `oneOf` is read as `anyOf` (`coerce_one_of`): Pydantic writes `oneOf` for
/// discriminated unions, whose branches exclude each other by their tag anyway; in
/// general an answer may then match more than one branch.
const JSON_LAYOUT: &str = r#"{"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": ", "coerce_one_of": true}"#;

/// `schema` with [`JSON_LAYOUT`], unless it sets its own (`x-guidance`). For schemas
/// embedded in Lark grammars (`%json {..}`), which [`GrammarCompiler::compile`] does not
/// rewrite.
pub fn with_json_layout(mut schema: serde_json::Value) -> serde_json::Value {
    if let Some(obj) = schema.as_object_mut()
        && !obj.contains_key("x-guidance")
    {
        obj.insert(
            "x-guidance".into(),
            serde_json::from_str(JSON_LAYOUT).expect("a valid constant"),
        );
    }
    schema
}

/// Bytes of forced text tokenized at most (see [`Vocabulary::tokenize_bytes`]): far
/// more than a draft follows (a pass verifies at most 64 rows on a CPU, 128 on a GPU)
/// and far from the first token, which is all a mask takes from it.
const TOKENIZED_BYTES: usize = 4096;

/// The model's vocabulary for llguidance: each token's bytes, and tokenization through
/// the model's own tokenizer.
struct Vocabulary {
    trie: TokTrie,
    tokenizer: ModelTokenizer,
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// The model's own tokenization of the text, and the trie's byte tokens for bytes
    /// that are not text: the grammar engine asks for forced bytes that may stop inside
    /// a character (the first byte of "é"), which a lossy conversion would turn into
    /// U+FFFD's bytes and so into tokens the grammar refuses.
    ///
    /// Past [`TOKENIZED_BYTES`] only a prefix is tokenized, less its last token (the
    /// text after the cut could have merged into it): the engine tokenizes everything a
    /// grammar forces at every step, to mask all but the first forced token and to
    /// draft the rest, and a forced value of 200 KB made that step hold up every
    /// sequence in the batch (tools/grammar-load.py: a bystander's short answer took 60
    /// times as long beside eight such requests).
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        let cut = s.len() > TOKENIZED_BYTES;
        let s = if cut {
            // Back to a character's first byte, so the prefix stays text.
            let mut end = TOKENIZED_BYTES;
            while end > TOKENIZED_BYTES - 4 && s[end] & 0xC0 == 0x80 {
                end -= 1;
            }
            &s[..end]
        } else {
            s
        };
        let text_len = match std::str::from_utf8(s) {
            Ok(_) => s.len(),
            Err(e) => e.valid_up_to(),
        };
        let text = std::str::from_utf8(&s[..text_len]).unwrap_or_default();
        let mut ids = self.tokenizer.encode_literal(text).unwrap_or_default();
        ids.extend(self.trie.greedy_tokenize(&s[text_len..]));
        if cut {
            ids.pop();
        }
        ids
    }
}

/// Compiles grammars for one model's vocabulary. Cheap to clone.
#[derive(Clone)]
pub struct GrammarCompiler {
    factory: Arc<ParserFactory>,
    eos: Arc<[u32]>,
    limits: SchemaLimits,
    slots: Arc<CompileSlots>,
    compiled: Arc<Mutex<Compiled>>,
}

/// Grammars compiled lately, by what they were compiled from: agents send the same
/// tool schemas and response formats with every request, and one compile can take
/// seconds. Refusals are kept too (the same bad schema again costs nothing), not the
/// compiler's own failures. Bounded in entries and in the bytes of their sources (a
/// grammar's size follows its source's), least recently used out first.
struct Compiled {
    grammars: lru::LruCache<String, Result<Grammar, GrammarError>>,
    source_bytes: usize,
}

/// Most grammars kept compiled.
const COMPILED_GRAMMARS: usize = 64;
/// Most bytes of sources kept compiled; a larger source is compiled every time.
const COMPILED_SOURCE_BYTES: usize = 4 << 20;

impl Compiled {
    fn get(&mut self, key: &str) -> Option<Result<Grammar, GrammarError>> {
        self.grammars.get(key).cloned()
    }

    fn put(&mut self, key: String, compiled: Result<Grammar, GrammarError>) {
        if key.len() > COMPILED_SOURCE_BYTES || self.grammars.contains(&key) {
            return;
        }
        self.source_bytes += key.len();
        self.grammars.put(key, compiled);
        while self.grammars.len() > COMPILED_GRAMMARS || self.source_bytes > COMPILED_SOURCE_BYTES {
            match self.grammars.pop_lru() {
                Some((old, _)) => self.source_bytes -= old.len(),
                None => break,
            }
        }
    }
}

/// What a grammar is compiled from, as text: the key of [`Compiled`].
fn source_key(spec: &GrammarSpec) -> String {
    match spec {
        GrammarSpec::JsonObject => "object".into(),
        // serde_json writes an object's keys in one order, so equal schemas are equal text.
        GrammarSpec::JsonSchema(schema) => format!("schema {schema}"),
        GrammarSpec::Lark(source) => format!("lark {source}"),
    }
}

/// How many compiles may run at once (one per two cores): the rest wait, so many heavy
/// schemas at a time take their turns on half the cores, and the model thread and the
/// HTTP workers keep the others.
struct CompileSlots {
    free: Mutex<usize>,
    freed: Condvar,
}

impl CompileSlots {
    fn new(n: usize) -> Self {
        CompileSlots {
            free: Mutex::new(n.max(1)),
            freed: Condvar::new(),
        }
    }

    /// Wait for a slot; it is given back when the guard drops.
    fn take(&self) -> SlotGuard<'_> {
        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
        while *free == 0 {
            free = self.freed.wait(free).unwrap_or_else(|e| e.into_inner());
        }
        *free -= 1;
        SlotGuard(self)
    }
}

struct SlotGuard<'a>(&'a CompileSlots);

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        *self.0.free.lock().unwrap_or_else(|e| e.into_inner()) += 1;
        self.0.freed.notify_one();
    }
}

/// Each token's bytes, as the grammar engine reads them, padded to the model's `vocab`
/// rows of logits (special tokens start with [`TokTrie::SPECIAL_TOKEN_MARKER`]).
fn token_bytes(tokenizer: &ModelTokenizer, vocab: usize) -> Result<Vec<Vec<u8>>, GrammarError> {
    let bad = |e: String| GrammarError::Tokenizer(e);
    let json: serde_json::Value =
        serde_json::from_str(&tokenizer.to_json().map_err(|e| bad(e.to_string()))?)
            .map_err(|e| bad(e.to_string()))?;
    let mut words =
        llguidance::token_bytes_from_tokenizer_json(&json).map_err(|e| bad(e.to_string()))?;
    if words.len() > vocab {
        return Err(bad(format!(
            "the tokenizer has {} tokens, more than the model's {vocab} logits",
            words.len()
        )));
    }
    // Rows of logits past the tokenizer's vocabulary are tokens no text spells:
    // special tokens nothing can produce.
    while words.len() < vocab {
        let mut name = format!(".<[{}]>", words.len()).into_bytes();
        name[0] = TokTrie::SPECIAL_TOKEN_MARKER;
        words.push(name);
    }
    Ok(words)
}

impl GrammarCompiler {
    /// A compiler for `tokenizer`'s vocabulary, padded to the model's `vocab` rows of
    /// logits. `eos` ends an answer; the first is the one grammars name.
    pub fn new(
        tokenizer: &ModelTokenizer,
        vocab: usize,
        eos: &[u32],
    ) -> Result<Self, GrammarError> {
        let bad = |e: String| GrammarError::Tokenizer(e);
        let &first_eos = eos
            .first()
            .ok_or_else(|| bad("the model has no end-of-sequence token".into()))?;
        let words = token_bytes(tokenizer, vocab)?;
        let info = TokRxInfo::new(vocab as u32, first_eos);
        let env: TokEnv = Arc::new(Vocabulary {
            trie: TokTrie::from(&info, &words),
            tokenizer: tokenizer.clone(),
        });
        let mut factory = ParserFactory::new(
            &env,
            InferenceCapabilities {
                ff_tokens: true,
                ..InferenceCapabilities::default()
            },
            &llguidance::earley::SlicedBiasComputer::general_slices(),
        )
        .map_err(|e| bad(e.to_string()))?;
        factory.quiet();
        // Errors name the problem in the grammar, not the parser's internal state.
        *factory.limits_mut() = ParserLimits {
            verbose_errors: false,
            ..ParserLimits::default()
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Ok(GrammarCompiler {
            factory: Arc::new(factory),
            eos: eos.into(),
            limits: SchemaLimits::default(),
            slots: Arc::new(CompileSlots::new(cores / 2)),
            compiled: Arc::new(Mutex::new(Compiled {
                grammars: lru::LruCache::unbounded(),
                source_bytes: 0,
            })),
        })
    }

    /// The bounds every JSON schema is checked against before it is compiled.
    pub fn limits(&self) -> &SchemaLimits {
        &self.limits
    }

    /// Compile `spec`, on a thread of its own with a [`COMPILE_STACK_BYTES`] stack,
    /// once one of the compiler's slots (one per two cores) is free. An invalid schema or
    /// grammar is a [`GrammarError::Invalid`] that names the problem; a schema past the
    /// [`SchemaLimits`] is a [`GrammarError::TooComplex`], refused before compiling.
    /// The same spec again is answered from the grammars compiled lately.
    /// Blocks: call it off async workers.
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Grammar, GrammarError> {
        self.compile_while(spec, &|| true)
    }

    /// [`GrammarCompiler::compile`], given up when `wanted` says no once a slot is free:
    /// a request whose client went away while it waited costs no compile (a compile
    /// that has started runs to its end, and its grammar is kept).
    pub fn compile_while(
        &self,
        spec: &GrammarSpec,
        wanted: &dyn Fn() -> bool,
    ) -> Result<Grammar, GrammarError> {
        let key = source_key(spec);
        if let Some(compiled) = self.compiled.lock().expect("grammar cache lock").get(&key) {
            return compiled;
        }
        let compiled = self.compile_uncached(spec, wanted);
        if !matches!(compiled, Err(GrammarError::Compiler(_))) {
            self.compiled
                .lock()
                .expect("grammar cache lock")
                .put(key, compiled.clone());
        }
        compiled
    }

    /// Check and compile `spec`, as [`GrammarCompiler::compile`] describes, without
    /// the cache.
    fn compile_uncached(
        &self,
        spec: &GrammarSpec,
        wanted: &dyn Fn() -> bool,
    ) -> Result<Grammar, GrammarError> {
        if let GrammarSpec::JsonSchema(schema) = spec {
            check_schema(schema, &self.limits)?;
        }
        let _slot = self.slots.take();
        if !wanted() {
            return Err(GrammarError::Compiler(
                "its request went away before it compiled".into(),
            ));
        }
        let (this, spec) = (self.clone(), spec.clone());
        std::thread::Builder::new()
            .name("grammar-compile".into())
            .stack_size(COMPILE_STACK_BYTES)
            .spawn(move || this.compile_here(&spec))
            .map_err(|e| GrammarError::Compiler(format!("no thread to compile on: {e}")))?
            .join()
            .map_err(|_| GrammarError::Compiler("it panicked".into()))?
    }

    /// Compile on this thread (whose stack must be deep enough).
    fn compile_here(&self, spec: &GrammarSpec) -> Result<Grammar, GrammarError> {
        let grammar = match spec {
            GrammarSpec::JsonObject => TopLevelGrammar::from_json_schema(with_json_layout(
                serde_json::json!({"type": "object"}),
            )),
            GrammarSpec::JsonSchema(schema) => {
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(GrammarError::Invalid(
                        "a JSON schema must be an object".into(),
                    ));
                }
                TopLevelGrammar::from_json_schema(with_json_layout(schema.clone()))
            }
            GrammarSpec::Lark(source) => TopLevelGrammar::from_lark(source.clone()),
        };
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| GrammarError::Invalid(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(GrammarError::Invalid(e));
        }
        Ok(Grammar {
            start: matcher,
            eos: self.eos.clone(),
            force: true,
        })
    }
}

/// A compiled grammar at its start; [`Grammar::start`] gives each request its own state.
#[derive(Clone)]
pub struct Grammar {
    start: Matcher,
    eos: Arc<[u32]>,
    force: bool,
}

impl std::fmt::Debug for Grammar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Grammar")
    }
}

impl Grammar {
    /// Whether the tokens this grammar forces are drafted (on by default; off measures
    /// what forcing adds). Forbidden branches are cut either way.
    pub fn drafting_forced_tokens(mut self, on: bool) -> Self {
        self.force = on;
        self
    }

    /// A fresh state of this grammar, for one answer.
    pub fn start(&self) -> Constraint {
        Constraint {
            matcher: self.start.deep_clone(),
            eos: self.eos.clone(),
            force: self.force,
        }
    }
}

/// The state of a grammar after the tokens an answer has so far.
pub struct Constraint {
    matcher: Matcher,
    eos: Arc<[u32]>,
    force: bool,
}

impl Constraint {
    fn failed(&self, e: impl std::fmt::Display) -> GrammarError {
        GrammarError::Failed(self.matcher.get_error().unwrap_or_else(|| e.to_string()))
    }

    /// Set the logits of every token the grammar does not allow next to −∞. When the
    /// grammar may end here, every end-of-sequence token stays allowed.
    pub fn mask_logits(&mut self, logits: &mut [f32]) -> Result<(), GrammarError> {
        let mask = self
            .matcher
            .compute_mask_or_eos()
            .map_err(|e| self.failed(e))?;
        let may_end = mask.is_allowed(self.eos[0]);
        let len = logits.len();
        mask.iter_unset_entries(|i| {
            if i < len {
                logits[i] = f32::NEG_INFINITY;
            }
        });
        // Rows past the mask's vocabulary cannot be allowed.
        logits[mask.len().min(len)..].fill(f32::NEG_INFINITY);
        if !may_end {
            for &e in self.eos.iter() {
                if let Some(l) = logits.get_mut(e as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        Ok(())
    }

    /// Take `token`, which the mask allowed. An end-of-sequence token ends the answer
    /// and leaves the state alone (a complete grammar takes no more tokens).
    pub fn advance(&mut self, token: u32) -> Result<(), GrammarError> {
        if self.eos.contains(&token) {
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| self.failed(e))
    }

    /// True once the grammar is complete and nothing may follow but the end.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Take `token` if the grammar allows it next; false (and no change) if not.
    fn try_advance(&mut self, token: u32) -> bool {
        if self.eos.contains(&token) {
            // An end is accepted only where the grammar is complete: never drafted.
            return false;
        }
        matches!(self.matcher.try_consume_tokens(&[token]), Ok(1))
    }

    fn rollback(&mut self, n: usize) -> Result<(), GrammarError> {
        self.matcher.rollback(n).map_err(|e| self.failed(e))
    }

    /// Fit a draft to the grammar: cut every branch at its first token the grammar
    /// forbids, then make sure the tokens the grammar forces next are drafted, following
    /// the draft as far as it already has them and adding the rest as a chain below.
    /// Without [`Grammar::drafting_forced_tokens`] only the cut is made. The state is
    /// left as it was.
    pub fn shape_draft(&mut self, draft: &mut Draft) -> Result<(), GrammarError> {
        if !draft.is_empty() {
            let mut keep = vec![false; draft.len()];
            let mut children: Vec<Vec<usize>> = vec![Vec::new(); draft.len() + 1];
            for (i, &p) in draft.parents.iter().enumerate() {
                children[(p + 1) as usize].push(i);
            }
            // Depth-first from the context: advance into a node, visit its children,
            // roll back. An explicit stack, so no draft is deep enough to overflow.
            enum Visit {
                Enter(usize),
                Leave,
            }
            let mut stack: Vec<Visit> =
                children[0].iter().rev().map(|&i| Visit::Enter(i)).collect();
            while let Some(visit) = stack.pop() {
                match visit {
                    Visit::Leave => self.rollback(1)?,
                    Visit::Enter(i) => {
                        if !self.try_advance(draft.tokens[i]) {
                            continue;
                        }
                        keep[i] = true;
                        stack.push(Visit::Leave);
                        stack.extend(children[i + 1].iter().rev().map(|&c| Visit::Enter(c)));
                    }
                }
            }
            draft.retain(&keep);
        }
        if self.force {
            let forced = self.matcher.compute_ff_tokens();
            if !forced.is_empty() {
                let was_empty = draft.is_empty();
                let (under, done) = draft.follow(&forced);
                draft.graft_chain(under, &forced[done..]);
                if was_empty {
                    draft.source = DraftSource::Grammar;
                }
            }
            self.force_after_likeliest_leaf(draft)?;
        }
        Ok(())
    }

    /// Draft the tokens the grammar forces after the draft's likeliest leaf: where a
    /// drafted value closes, the separator and the next key follow without a choice.
    fn force_after_likeliest_leaf(&mut self, draft: &mut Draft) -> Result<(), GrammarError> {
        let mut has_child = vec![false; draft.len()];
        for &p in &draft.parents {
            if p >= 0 {
                has_child[p as usize] = true;
            }
        }
        // The likeliest leaf, the deepest (latest) of equals.
        let Some(leaf) = (0..draft.len())
            .filter(|&i| !has_child[i])
            .max_by(|&a, &b| draft.probs[a].total_cmp(&draft.probs[b]).then(a.cmp(&b)))
        else {
            return Ok(());
        };
        let mut path = Vec::new();
        let mut node = leaf as i32;
        while node >= 0 {
            path.push(draft.tokens[node as usize]);
            node = draft.parents[node as usize];
        }
        path.reverse();
        let mut advanced = 0;
        for &t in &path {
            if !self.try_advance(t) {
                break;
            }
            advanced += 1;
        }
        if advanced == path.len() {
            let forced = self.matcher.compute_ff_tokens();
            draft.graft_chain(leaf as i32, &forced);
        }
        self.rollback(advanced)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    use std::path::Path;

    /// A compiler over SmolLM2's tokenizer: the shared data's copy when this checkout
    /// sits beside it, else the default model's (which `tools/setup.sh` installs).
    pub(crate) fn smollm2() -> Option<(GrammarCompiler, ModelTokenizer)> {
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
        Some((compiler, tokenizer))
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
        let Some((compiler, _)) = smollm2() else {
            return;
        };
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
        let Some((compiler, tok)) = smollm2() else {
            return;
        };
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
        let Some((compiler, tok)) = smollm2() else {
            return;
        };
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

    /// A spec compiled again comes from the cache, refusals included, and answers as a
    /// fresh compile does; the cache keeps the most recently used within its bounds.
    #[test]
    fn a_spec_compiled_again_comes_from_the_cache() {
        let Some((compiler, _)) = smollm2() else {
            return;
        };
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
    }

    #[test]
    fn invalid_schemas_and_grammars_are_named() {
        let Some((compiler, _)) = smollm2() else {
            return;
        };
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
}
