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
use std::time::{Duration, Instant};

use llguidance::api::{ParserLimits, TopLevelGrammar};
use llguidance::toktrie::{
    InferenceCapabilities, SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenizerEnv,
};
use llguidance::{Matcher, ParserFactory};

use crate::speculate::{Draft, DraftSource};

use crate::model::tokenizer::ModelTokenizer;

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

/// How a Lark grammar names `marker`: by its control token's id where it is one
/// (llguidance's `<[id]>`: a control token is never text), else as its text.
pub fn lark_marker(control_token: Option<u32>, marker: &str) -> String {
    control_token.map_or_else(|| format!("{marker:?}"), |id| format!("<[{id}]>"))
}

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

/// Bytes of forced text tokenized at most (see [`Vocabulary::tokenize_bytes`]): about
/// the [`FORCED_DRAFT_TOKENS`] a draft follows at 4 bytes a token, and far from the
/// first token, which is all a mask takes from it. The text is tokenized again at every
/// mask (0.45 ms a token at 4 KB, 0.13 ms at 1 KB).
const TOKENIZED_BYTES: usize = 512;

/// Forced tokens drafted at most: as many rows as a pass verifies at most (64 on a CPU,
/// 128 on a GPU). Past them nothing is drafted after the likeliest leaf, which would
/// need the state advanced there and rolled back.
const FORCED_DRAFT_TOKENS: usize = 128;

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
    grammars: lru::LruCache<String, Cached>,
    source_bytes: usize,
}

/// A compiled grammar (or the reason its spec was refused), and when it was last asked
/// for.
struct Cached {
    compiled: Result<Grammar, GrammarError>,
    used: Instant,
}

/// How long a compiled grammar no request asks for is kept: agents send their tool
/// schemas with every request, so a schema unused this long belongs to a client that
/// has gone, or comes back seldom enough to compile again.
pub const GRAMMAR_IDLE: Duration = Duration::from_secs(120);

/// Most grammars kept compiled.
const COMPILED_GRAMMARS: usize = 64;
/// Most bytes of sources kept compiled; a larger source is compiled every time.
const COMPILED_SOURCE_BYTES: usize = 4 << 20;

impl Compiled {
    fn get(&mut self, key: &str) -> Option<Result<Grammar, GrammarError>> {
        let cached = self.grammars.get_mut(key)?;
        cached.used = Instant::now();
        Some(cached.compiled.clone())
    }

    /// Drop the grammars no request has asked for in `idle`; how many went.
    fn forget_unused(&mut self, idle: Duration) -> usize {
        let mut forgotten = 0;
        // Least recently used first: the first one still in use ends the walk.
        while self
            .grammars
            .peek_lru()
            .is_some_and(|(_, cached)| cached.used.elapsed() >= idle)
        {
            if let Some((key, _)) = self.grammars.pop_lru() {
                self.source_bytes -= key.len();
                forgotten += 1;
            }
        }
        forgotten
    }

    fn put(&mut self, key: String, compiled: Result<Grammar, GrammarError>) {
        if key.len() > COMPILED_SOURCE_BYTES || self.grammars.contains(&key) {
            return;
        }
        self.source_bytes += key.len();
        let used = Instant::now();
        self.grammars.put(key, Cached { compiled, used });
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

    /// Drop the compiled grammars no request has asked for in `idle` (the server's
    /// model thread calls it while idle, with [`GRAMMAR_IDLE`]): a heavy grammar's lexer
    /// states take hundreds of megabytes, which its tenant's leaving should give back.
    /// How many went.
    pub fn forget_unused(&self, idle: Duration) -> usize {
        self.compiled
            .lock()
            .expect("grammar cache lock")
            .forget_unused(idle)
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
        let mut matcher = Matcher::new(Ok(parser));
        // Walk what the grammar forces from its start here, once, on the compile
        // thread: every answer starts from this state, and the first walk of a long
        // forced value (building the lexer's states byte by byte) is the slow one.
        matcher.compute_ff_tokens();
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

/// A compiled grammar at its start; [`Grammar::start`] gives each answer its own state.
///
/// Every answer of a grammar shares its lexer's caches (the lexer states its answers
/// have reached, built as they go): a state is built once per grammar, not once per
/// answer. For a 119 KB `const` that was 130 ms of the model thread at each answer's
/// start, and a copy of the caches per answer 22 ms and 120 MB. The states are bounded
/// by the grammar, which [`SchemaLimits`] bound, not by how many answers walk them
/// (llguidance refuses a lexer past 250,000 states).
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
            matcher: self.start.clone(),
            eos: self.eos.clone(),
            force: self.force,
            mask: None,
        }
    }
}

/// The state of a grammar after the tokens an answer has so far.
pub struct Constraint {
    matcher: Matcher,
    eos: Arc<[u32]>,
    force: bool,
    /// The mask [`Constraint::forced_next`] computed at this state, if it did.
    mask: Option<SimpleVob>,
}

impl Constraint {
    fn failed(&self, e: impl std::fmt::Display) -> GrammarError {
        GrammarError::Failed(self.matcher.get_error().unwrap_or_else(|| e.to_string()))
    }

    /// Set the logits of every token the grammar does not allow next to −∞. When the
    /// grammar may end here, every end-of-sequence token stays allowed.
    pub fn mask_logits(&mut self, logits: &mut [f32]) -> Result<(), GrammarError> {
        let mask = match self.mask.take() {
            Some(mask) => mask,
            None => self.compute_mask()?,
        };
        Self::apply(&mask, &self.eos, logits);
        Ok(())
    }

    /// The one token the grammar allows next, when it allows one alone (a forced
    /// token, never an end): whatever the sampling, a distribution over one token picks
    /// it, so its logits need not be read. Otherwise None, and the mask computed is
    /// kept for [`Constraint::mask_logits`].
    pub fn forced_next(&mut self) -> Result<Option<u32>, GrammarError> {
        let mask = self.compute_mask()?;
        let only = match mask.first_bit_set() {
            Some(t) if mask.num_set() == 1 && !self.eos.contains(&(t as u32)) => Some(t as u32),
            _ => None,
        };
        self.mask = Some(mask);
        Ok(only)
    }

    fn compute_mask(&mut self) -> Result<SimpleVob, GrammarError> {
        self.matcher
            .compute_mask_or_eos()
            .map_err(|e| self.failed(e))
    }

    fn apply(mask: &SimpleVob, eos: &[u32], logits: &mut [f32]) {
        let may_end = mask.is_allowed(eos[0]);
        let len = logits.len();
        mask.iter_unset_entries(|i| {
            if i < len {
                logits[i] = f32::NEG_INFINITY;
            }
        });
        // Rows past the mask's vocabulary cannot be allowed.
        logits[mask.len().min(len)..].fill(f32::NEG_INFINITY);
        if !may_end {
            for &e in eos {
                if let Some(l) = logits.get_mut(e as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }

    /// Take `token`, which the mask allowed. An end-of-sequence token ends the answer
    /// and leaves the state alone (a complete grammar takes no more tokens).
    pub fn advance(&mut self, token: u32) -> Result<(), GrammarError> {
        self.mask = None;
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
        self.mask = None;
        if self.eos.contains(&token) {
            // An end is accepted only where the grammar is complete: never drafted.
            return false;
        }
        matches!(self.matcher.try_consume_tokens(&[token]), Ok(1))
    }

    fn rollback(&mut self, n: usize) -> Result<(), GrammarError> {
        self.mask = None;
        self.matcher.rollback(n).map_err(|e| self.failed(e))
    }

    /// Fit a draft to the grammar: cut every branch at its first token the grammar
    /// forbids, then make sure the tokens the grammar forces next are drafted, following
    /// the draft as far as it already has them and adding the rest as a chain below (at
    /// most [`FORCED_DRAFT_TOKENS`]). Without [`Grammar::drafting_forced_tokens`] only
    /// the cut is made. The state is left as it was.
    ///
    /// The cut checks each branch without advancing the state (llguidance's
    /// `validate_tokens`): advancing and rolling back dropped the bytes the grammar had
    /// forced, and llguidance walked all of them again, byte by byte, at the next mask.
    /// Beside a long forced value (a 119 KB `const`) that walk was 15 ms a step.
    pub fn shape_draft(&mut self, draft: &mut Draft) -> Result<(), GrammarError> {
        if !draft.is_empty() {
            let mut keep = vec![false; draft.len()];
            // Each root-to-leaf path is checked once; a node is kept when the grammar
            // takes its path (an end-of-sequence token is never drafted).
            for leaf in draft.leaves() {
                let path = draft.path_to(leaf);
                let tokens: Vec<u32> = path.iter().map(|&i| draft.tokens[i]).collect();
                let drafted = tokens
                    .iter()
                    .position(|t| self.eos.contains(t))
                    .unwrap_or(tokens.len());
                let valid = self
                    .matcher
                    .validate_tokens(&tokens[..drafted])
                    .map_err(|e| self.failed(e))?;
                for &i in &path[..valid.min(drafted)] {
                    keep[i] = true;
                }
            }
            draft.retain(&keep);
        }
        if self.force {
            let mut forced = self.matcher.compute_ff_tokens();
            forced.truncate(FORCED_DRAFT_TOKENS);
            if !forced.is_empty() {
                let was_empty = draft.is_empty();
                let (under, done) = draft.follow(&forced);
                draft.graft_chain(under, &forced[done..]);
                if was_empty {
                    draft.source = DraftSource::Grammar;
                }
            }
            if forced.len() < FORCED_DRAFT_TOKENS {
                self.force_after_likeliest_leaf(draft)?;
            }
        }
        Ok(())
    }

    /// Draft the tokens the grammar forces after the draft's likeliest leaf: where a
    /// drafted value closes, the separator and the next key follow without a choice.
    fn force_after_likeliest_leaf(&mut self, draft: &mut Draft) -> Result<(), GrammarError> {
        // The likeliest leaf, the deepest (latest) of equals.
        let Some(leaf) = draft
            .leaves()
            .into_iter()
            .max_by(|&a, &b| draft.probs[a].total_cmp(&draft.probs[b]).then(a.cmp(&b)))
        else {
            return Ok(());
        };
        let path: Vec<u32> = draft
            .path_to(leaf)
            .iter()
            .map(|&i| draft.tokens[i])
            .collect();
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
pub(crate) mod tests;
