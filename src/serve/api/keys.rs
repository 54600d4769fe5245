//! API keys for the OpenAI routes (`/v1/...`): `SUFFIXD_API_KEY` (one key) and
//! `--api-keys FILE` (one key a line, each optionally bound to a namespace). Without
//! either the routes are open, as before. [`require_api_key`] is the routes' one gate.
//!
//! A key bound to a namespace is a tenant: its requests draft from and learn into that
//! namespace only (an `x-suffixd-namespace` header naming another gets 403; `user` is
//! then the end user's id, as OpenAI reads it, not a namespace), and the stored
//! responses it reads, continues or deletes must have been made under it. A key without
//! a namespace is trusted as every caller was before keys: any namespace, any response.
//!
//! The file is read at start and again on SIGHUP (a file that does not read then leaves
//! the keys as they were, with an error in the log), so keys rotate without a restart.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use axum::extract::{FromRequestParts, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::ApiError;
use super::secrets::{GuessGuard, bearer, same_secret};
use crate::serve::AppState;

/// The header that names a request's namespace.
pub const NAMESPACE_HEADER: &str = "x-suffixd-namespace";

/// The shortest key accepted: shorter ones are guessable within the guard's rate.
pub const MIN_KEY_BYTES: usize = 16;

/// Why the API keys could not be read; the server does not start (or, on SIGHUP, keeps
/// the keys it had).
#[derive(Debug, thiserror::Error)]
pub enum ApiKeysError {
    /// The file could not be read.
    #[error("cannot read the API keys file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A line of the file is not `KEY` or `KEY NAMESPACE`.
    #[error("the API keys file {path}, line {line}: {why}")]
    Line {
        /// The file.
        path: PathBuf,
        /// The line, from 1.
        line: usize,
        /// What is wrong with it.
        why: String,
    },
    /// `SUFFIXD_API_KEY` is not a key.
    #[error("SUFFIXD_API_KEY: {0}")]
    Variable(String),
    /// The file holds no key (it would lock every client out).
    #[error(
        "the API keys file {0} holds no key: write one a line (`KEY` or `KEY NAMESPACE`), or leave --api-keys out to serve without keys"
    )]
    Empty(PathBuf),
}

/// One key, and the namespace it is bound to.
#[derive(Clone, Debug, PartialEq, Eq)]
struct ApiKey {
    secret: String,
    namespace: Option<String>,
}

/// The keys that may call the OpenAI routes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ApiKeys {
    keys: Vec<ApiKey>,
}

/// Who called, once its key matched: what [`require_api_key`] leaves in the request's
/// extensions for the handlers.
#[derive(Clone, Debug, Default)]
pub struct Caller {
    /// The namespace its key is bound to; None: any (an unbound key, or no keys).
    pub namespace: Option<String>,
}

/// A handler's caller: what the gate left, or anyone's (no gate ran: no keys).
impl<S: Send + Sync> FromRequestParts<S> for Caller {
    type Rejection = std::convert::Infallible;

    async fn from_request_parts(parts: &mut Parts, _: &S) -> Result<Self, Self::Rejection> {
        Ok(parts
            .extensions
            .get::<Caller>()
            .cloned()
            .unwrap_or_default())
    }
}

impl Caller {
    /// Whether this caller may use what was made under `namespace`.
    pub fn may_use(&self, namespace: Option<&str>) -> bool {
        match &self.namespace {
            None => true,
            Some(own) => namespace == Some(own.as_str()),
        }
    }
}

impl ApiKeys {
    /// The keys of `SUFFIXD_API_KEY` (`variable`, when set) and the file at `file`.
    pub fn load(variable: Option<&str>, file: Option<&Path>) -> Result<Self, ApiKeysError> {
        let mut keys = ApiKeys::default();
        if let Some(secret) = variable {
            check_secret(secret).map_err(ApiKeysError::Variable)?;
            keys.keys.push(ApiKey {
                secret: secret.to_string(),
                namespace: None,
            });
        }
        if let Some(path) = file {
            let text = std::fs::read_to_string(path).map_err(|source| ApiKeysError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            let from_file = ApiKeys::parse(&text).map_err(|(line, why)| ApiKeysError::Line {
                path: path.to_path_buf(),
                line,
                why,
            })?;
            if from_file.keys.is_empty() {
                return Err(ApiKeysError::Empty(path.to_path_buf()));
            }
            for key in from_file.keys {
                if keys.keys.iter().any(|k| k.secret == key.secret) {
                    return Err(ApiKeysError::Variable(format!(
                        "the same key is also in {}: keep it in one place",
                        path.display()
                    )));
                }
                keys.keys.push(key);
            }
        }
        Ok(keys)
    }

    /// The keys of a file's text: one a line, `KEY` or `KEY NAMESPACE`; a word starting
    /// with `#` starts a comment, and lines without a key are skipped. A bad line: its number (from 1) and why.
    pub fn parse(text: &str) -> Result<Self, (usize, String)> {
        let mut keys: Vec<ApiKey> = Vec::new();
        for (index, line) in text.lines().enumerate() {
            // A word starting with `#` starts a comment, to the end of the line.
            let mut words = line
                .split_ascii_whitespace()
                .take_while(|word| !word.starts_with('#'))
                .peekable();
            if words.peek().is_none() {
                continue;
            }
            let bad = |why: String| (index + 1, why);
            let secret = words.next().unwrap_or_default();
            let namespace = words.next();
            if words.next().is_some() {
                return Err(bad("expected `KEY` or `KEY NAMESPACE`".into()));
            }
            check_secret(secret).map_err(bad)?;
            if let Some(ns) = namespace
                && !crate::store::is_namespace(ns)
            {
                return Err(bad(format!(
                    "the namespace must be 1 to {} printable ASCII characters without spaces",
                    crate::store::MAX_NAMESPACE_BYTES
                )));
            }
            if keys.iter().any(|k| k.secret == secret) {
                return Err(bad("this key is on an earlier line too".into()));
            }
            keys.push(ApiKey {
                secret: secret.to_string(),
                namespace: namespace.map(str::to_string),
            });
        }
        Ok(ApiKeys { keys })
    }

    /// How many keys there are, and how many of them are bound to a namespace.
    pub fn counts(&self) -> (usize, usize) {
        let bound = self.keys.iter().filter(|k| k.namespace.is_some()).count();
        (self.keys.len(), bound)
    }

    /// The key `given` matches, compared with every key in constant time each (the
    /// time says how many keys there are, not where `given` differs from one).
    fn matching(&self, given: &str) -> Option<&ApiKey> {
        let mut found = None;
        for key in &self.keys {
            if same_secret(given.as_bytes(), key.secret.as_bytes()) {
                found = Some(key);
            }
        }
        found
    }
}

/// Why `secret` cannot be a key, if it cannot.
fn check_secret(secret: &str) -> Result<(), String> {
    if !secret.bytes().all(|b| b.is_ascii_graphic()) {
        return Err("a key is visible ASCII (no spaces, control or non-ASCII characters, which an Authorization header cannot carry)".into());
    }
    if secret.len() < MIN_KEY_BYTES {
        return Err(format!(
            "a key has at least {MIN_KEY_BYTES} characters (make one with `openssl rand -hex 24`)"
        ));
    }
    Ok(())
}

/// The keys in force and where they come from, for the gate and for SIGHUP.
#[derive(Default)]
pub struct KeyGate {
    /// `SUFFIXD_API_KEY`.
    variable: Option<String>,
    /// `--api-keys`.
    file: Option<PathBuf>,
    /// None: the OpenAI routes are open.
    keys: RwLock<Option<Arc<ApiKeys>>>,
    /// The cap on wrong keys.
    guard: GuessGuard,
}

impl KeyGate {
    /// The gate of `SUFFIXD_API_KEY` (`variable`) and `--api-keys` (`file`), read now;
    /// open when both are None.
    pub fn open(variable: Option<String>, file: Option<PathBuf>) -> Result<Self, ApiKeysError> {
        let keys = match (&variable, &file) {
            (None, None) => None,
            _ => Some(Arc::new(ApiKeys::load(
                variable.as_deref(),
                file.as_deref(),
            )?)),
        };
        Ok(KeyGate {
            variable,
            file,
            keys: RwLock::new(keys),
            guard: GuessGuard::default(),
        })
    }

    /// Read the keys again (on SIGHUP). On an error the keys stay as they were.
    pub fn reload(&self) -> Result<(usize, usize), ApiKeysError> {
        if self.variable.is_none() && self.file.is_none() {
            return Ok((0, 0));
        }
        let keys = ApiKeys::load(self.variable.as_deref(), self.file.as_deref())?;
        let counts = keys.counts();
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(keys));
        Ok(counts)
    }

    /// The keys in force; None: the routes are open.
    pub fn keys(&self) -> Option<Arc<ApiKeys>> {
        self.keys.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Who `request` comes from, or the error that refuses it.
    fn admit(&self, request: &mut Request, source: IpAddr) -> Result<Caller, ApiError> {
        let Some(keys) = self.keys() else {
            return Ok(Caller::default());
        };
        let unauthorized = |message: &str| {
            ApiError::new(StatusCode::UNAUTHORIZED, "invalid_request_error", message)
                .code("invalid_api_key")
        };
        // A request without a key guesses nothing: it is not counted against its source.
        let Some(given) = bearer(request.headers()) else {
            return Err(unauthorized(
                "You didn't provide an API key: send Authorization: Bearer <key> (this server's keys are set by SUFFIXD_API_KEY or --api-keys)",
            ));
        };
        if let Some(refusal) = self.guard.refusal(source, "API key") {
            return Err(refusal);
        }
        let Some(key) = keys.matching(given) else {
            self.guard.failed(source);
            return Err(unauthorized(
                "Incorrect API key provided: it is not one of this server's keys",
            ));
        };
        if let Some(own) = &key.namespace {
            let headers = request.headers_mut();
            if let Some(asked) = headers.get(NAMESPACE_HEADER)
                && asked.as_bytes() != own.as_bytes()
            {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "permission_error",
                    format!(
                        "this API key is bound to the namespace {own:?}; the {NAMESPACE_HEADER} header names another"
                    ),
                ));
            }
            // The handlers read the namespace from the header before `user`.
            let value = HeaderValue::from_str(own).expect("a namespace is visible ASCII");
            headers.insert(NAMESPACE_HEADER, value);
        }
        Ok(Caller {
            namespace: key.namespace.clone(),
        })
    }
}

/// The OpenAI routes' gate (a `route_layer` in [`crate::serve::router`]): without keys
/// every request goes on; with keys only those with one, which leave their [`Caller`]
/// in the request's extensions.
pub async fn require_api_key(
    State(app): State<Arc<AppState>>,
    mut request: Request,
    next: Next,
) -> Response {
    let source = GuessGuard::source_of_request(&request);
    match app.api_keys.admit(&mut request, source) {
        Ok(caller) => {
            request.extensions_mut().insert(caller);
            next.run(request).await
        }
        Err(e) => {
            app.metrics.record_refused_key();
            e.into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_A: &str = "sk-aaaaaaaaaaaaaaaaaaaaaaaa";
    const KEY_B: &str = "sk-bbbbbbbbbbbbbbbbbbbbbbbb";

    #[test]
    fn a_file_holds_keys_each_maybe_bound_to_a_namespace() {
        let text = format!("# the team\n\n{KEY_A} # ops\n  {KEY_B}\tteam-b  #b\n  # end\n");
        let keys = ApiKeys::parse(&text).unwrap();
        assert_eq!(keys.counts(), (2, 1));
        assert_eq!(keys.matching(KEY_A).unwrap().namespace, None);
        assert_eq!(
            keys.matching(KEY_B).unwrap().namespace.as_deref(),
            Some("team-b")
        );
        assert!(keys.matching("sk-aaaaaaaaaaaaaaaaaaaaaaab").is_none());
        assert!(keys.matching(&KEY_A[..KEY_A.len() - 1]).is_none());
        assert!(keys.matching(&format!("{KEY_A}a")).is_none());
        assert!(keys.matching("").is_none());
    }

    #[test]
    fn bad_lines_are_refused_by_number() {
        for (text, line, why) in [
            ("short\n", 1, "at least 16"),
            (&format!("\n{KEY_A} ns extra\n") as &str, 2, "KEY NAMESPACE"),
            (&format!("{KEY_A}\n#\n{KEY_A} ns\n"), 3, "earlier line"),
            (&format!("{KEY_A} {}\n", "n".repeat(200)), 1, "namespace"),
            ("sk-ééééééééééééééééééé\n", 1, "visible ASCII"),
        ] {
            let (at, message) = ApiKeys::parse(text).unwrap_err();
            assert_eq!(at, line, "{text:?}");
            assert!(message.contains(why), "{text:?}: {message}");
        }
    }

    #[test]
    fn the_variable_and_the_file_add_up_and_an_empty_file_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(&path, format!("{KEY_B} team-b\n")).unwrap();
        let keys = ApiKeys::load(Some(KEY_A), Some(&path)).unwrap();
        assert_eq!(keys.counts(), (2, 1));
        assert!(matches!(
            ApiKeys::load(Some(KEY_B), Some(&path)),
            Err(ApiKeysError::Variable(_))
        ));
        assert!(matches!(
            ApiKeys::load(Some("short"), None),
            Err(ApiKeysError::Variable(_))
        ));
        std::fs::write(&path, "# nothing yet\n").unwrap();
        let empty = ApiKeys::load(None, Some(&path)).unwrap_err();
        assert!(matches!(empty, ApiKeysError::Empty(_)), "{empty}");
        let missing = ApiKeys::load(None, Some(&dir.path().join("absent"))).unwrap_err();
        assert!(matches!(missing, ApiKeysError::Read { .. }), "{missing}");
    }

    #[test]
    fn a_reload_that_fails_keeps_the_keys_in_force() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(&path, format!("{KEY_A}\n")).unwrap();
        let gate = KeyGate::open(None, Some(path.clone())).unwrap();
        std::fs::write(&path, format!("{KEY_B} team-b\n")).unwrap();
        assert_eq!(gate.reload().unwrap(), (1, 1));
        assert!(gate.keys().unwrap().matching(KEY_B).is_some());
        std::fs::write(&path, "broken key line here\n").unwrap();
        assert!(gate.reload().is_err());
        let kept = gate.keys().unwrap();
        assert!(kept.matching(KEY_B).is_some() && kept.matching(KEY_A).is_none());
        assert!(KeyGate::open(None, None).unwrap().keys().is_none());
    }

    #[test]
    fn a_bound_caller_uses_only_its_own_namespace() {
        let bound = Caller {
            namespace: Some("team-b".into()),
        };
        assert!(bound.may_use(Some("team-b")));
        assert!(!bound.may_use(Some("team-c")));
        assert!(!bound.may_use(None));
        assert!(Caller::default().may_use(Some("team-c")));
        assert!(Caller::default().may_use(None));
    }
}
