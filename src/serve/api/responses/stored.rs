//! Stored responses: what a later request's `previous_response_id` continues, and what
//! `GET /v1/responses/{id}` returns. A response is kept when its request asks (`store`,
//! true unless it says otherwise, as at OpenAI) and the server keeps any
//! (`--stored-responses-bytes` above 0).
//!
//! Kept in memory within a byte budget, the least recently used out first. Replicas
//! (`--replicate`) also share them through NATS ([`crate::replicate::responses`]): each
//! kept response is published before its client reads that it is done, a response not
//! in memory is fetched from there with the conversation before it, and a delete
//! reaches every replica. Alone, a server keeps them until it restarts. A client that
//! gets `previous_response_not_found` sends the whole conversation as `input` instead
//! (the Agents SDK's default, and what proxies fall back to).
//!
//! A response holds the one it continued, so that a conversation stays whole while its
//! newest response is kept, even when an older one was evicted or deleted. The budget
//! counts every response alive, kept or only held by a later one: each adds its size
//! when made and takes it back when dropped, so memory stays within the budget.
//!
//! Ids are 128 random bits: knowing one is what lets a client read or continue it.
//! Under API keys bound to namespaces (tenants), a response also remembers the tenant
//! whose key made it, and a bound key finds only its own tenant's responses (others
//! are "not found", as unknown ids are); an unbound key, or no keys, finds any.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::super::keys::Caller;
use super::items::{Place, as_listed, item_place};
use crate::replicate::responses::{SharedError, SharedResponses, is_shareable_id};

/// One kept response, linked to the one it continued.
pub(super) struct StoredResponse {
    /// The response as it finished (what `GET` returns).
    response: Value,
    /// The request's own input items (a text input as a user message).
    input: Vec<Value>,
    /// The response this one continued.
    previous: Option<Arc<StoredResponse>>,
    /// The namespace of the API key that made it, when that key is bound to one.
    tenant: Option<String>,
    /// Its size, counted in `live` while it is alive.
    bytes: usize,
    /// Its size and that of every earlier response of its conversation.
    chain_bytes: usize,
    live: Arc<AtomicUsize>,
}

impl StoredResponse {
    /// The response as it finished.
    pub(super) fn response(&self) -> &Value {
        &self.response
    }

    /// Its id.
    pub(super) fn id(&self) -> Option<&str> {
        self.response.get("id").and_then(Value::as_str)
    }

    /// The namespace of the API key that made it, when that key is bound to one.
    pub(super) fn tenant(&self) -> Option<&str> {
        self.tenant.as_deref()
    }

    /// Its request's own input items.
    pub(super) fn input(&self) -> &[Value] {
        &self.input
    }

    /// Its output items.
    pub(super) fn output(&self) -> &[Value] {
        match self.response.get("output").and_then(Value::as_array) {
            Some(output) => output,
            None => &[],
        }
    }

    /// The responses of its conversation, oldest first, ending with this one.
    pub(super) fn chain(&self) -> Vec<&StoredResponse> {
        let mut chain = vec![self];
        while let Some(previous) = chain.last().and_then(|r| r.previous.as_deref()) {
            chain.push(previous);
        }
        chain.reverse();
        chain
    }

    /// The conversation up to and with this response, as input items, oldest first:
    /// each response's input, then its output.
    pub(super) fn conversation(&self) -> Vec<Value> {
        let mut items = Vec::new();
        for link in self.chain() {
            items.extend(link.input.iter().cloned());
            items.extend(link.output().iter().cloned());
        }
        items
    }
}

impl Drop for StoredResponse {
    fn drop(&mut self) {
        self.live.fetch_sub(self.bytes, Ordering::Relaxed);
        // Free the responses before this one that nothing else holds one by one: dropped
        // in turn, a conversation of many thousand short turns would overflow the stack.
        let mut previous = self.previous.take();
        while let Some(link) = previous {
            previous = match Arc::try_unwrap(link) {
                Ok(mut unheld) => unheld.previous.take(),
                Err(_) => None,
            };
        }
    }
}

/// One response as the replicas share it: the response, its own input, and the id of
/// the one it continued (fetched in turn, unless the replica holds it).
#[derive(serde::Serialize, serde::Deserialize)]
struct SharedRecord {
    response: Value,
    input: Vec<Value>,
    previous_response_id: Option<String>,
    /// Absent in records of servers before tenants: such a response is no tenant's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    tenant: Option<String>,
}

/// The responses kept in memory, by id.
type Kept = Mutex<lru::LruCache<String, Arc<StoredResponse>>>;

/// The kept responses, by id.
pub struct ResponseStore {
    budget_bytes: usize,
    /// Bytes of every stored response alive (kept, held by a later one, or in use).
    live: Arc<AtomicUsize>,
    kept: Arc<Kept>,
    /// The replicas' shared responses, with `--replicate`.
    shared: Option<SharedResponses>,
}

impl ResponseStore {
    /// A store keeping at most `budget_bytes` of responses (0: none).
    pub fn new(budget_bytes: usize) -> Self {
        ResponseStore {
            budget_bytes,
            live: Arc::default(),
            kept: Arc::new(Mutex::new(lru::LruCache::unbounded())),
            shared: None,
        }
    }

    /// A store as [`ResponseStore::new`] that shares its responses with the replicas of
    /// `cluster` through the NATS server at `url` (none when it keeps none).
    pub fn sharing(budget_bytes: usize, url: &str, cluster: &str) -> std::io::Result<Self> {
        let mut store = ResponseStore::new(budget_bytes);
        if store.enabled() {
            let kept = store.kept.clone();
            // The outbox holds at most what memory holds of responses.
            store.shared = Some(SharedResponses::start(
                url,
                cluster,
                budget_bytes,
                move |id| {
                    lock(&kept).pop(id);
                },
            )?);
        }
        Ok(store)
    }

    /// The replicas' shared responses, when this server shares them.
    pub fn shared(&self) -> Option<&SharedResponses> {
        self.shared.as_ref()
    }

    /// Whether this server keeps responses at all.
    pub fn enabled(&self) -> bool {
        self.budget_bytes > 0
    }

    /// How many responses are kept, and the bytes of all alive.
    pub fn usage(&self) -> (usize, usize) {
        let kept = self.lock().len();
        (kept, self.live.load(Ordering::Relaxed))
    }

    /// The response `id`, marked as used.
    pub(super) fn get(&self, id: &str) -> Option<Arc<StoredResponse>> {
        self.lock().get(id).cloned()
    }

    /// Forget the response `id`; whether it was kept. A later response that continued
    /// it still holds it.
    pub(super) fn delete(&self, id: &str) -> bool {
        self.lock().pop(id).is_some()
    }

    /// The response `id` if `caller` may use it (a bound key: only its own tenant's):
    /// kept here, or else fetched from the replicas' shared responses with the
    /// conversation before it (up to a response kept here) and kept. None when neither
    /// holds it, its conversation is no longer whole there, or it is another tenant's.
    pub(super) async fn find(
        &self,
        id: &str,
        caller: &Caller,
    ) -> Result<Option<Arc<StoredResponse>>, SharedError> {
        let found = self.find_any(id).await?;
        Ok(found.filter(|r| caller.may_use(r.tenant())))
    }

    /// The response `id`, whoever made it (as [`ResponseStore::find`]).
    async fn find_any(&self, id: &str) -> Result<Option<Arc<StoredResponse>>, SharedError> {
        if let Some(kept) = self.get(id) {
            return Ok(Some(kept));
        }
        let Some(shared) = &self.shared else {
            return Ok(None);
        };
        // Newest first, until a response kept here or the conversation's first.
        let (mut fetched, mut fetched_bytes, mut next) = (Vec::new(), 0, Some(id.to_string()));
        let mut base = None;
        while let Some(link) = next.take() {
            if let Some(kept) = self.get(&link) {
                base = Some(kept);
                break;
            }
            if !is_shareable_id(&link) {
                return Ok(None);
            }
            let Some(bytes) = shared.get(&link).await? else {
                return Ok(None);
            };
            fetched_bytes += bytes.len();
            if fetched_bytes > self.budget_bytes {
                return Ok(None);
            }
            let record: SharedRecord = match serde_json::from_slice(&bytes) {
                Ok(record) => record,
                Err(e) => {
                    tracing::warn!("shared response {link} does not read ({e}): not continued");
                    return Ok(None);
                }
            };
            next = record.previous_response_id.clone();
            fetched.push(record);
        }
        let mut previous = base;
        for record in fetched.into_iter().rev() {
            let kept = self.keep(record.response, record.input, previous, record.tenant);
            let Some(kept) = kept else {
                return Ok(None);
            };
            previous = Some(kept);
        }
        Ok(previous)
    }

    /// Publish `stored`, just kept, to the replicas' shared responses (when this server
    /// shares them); returns once they hold it, or while NATS is away once it waits in
    /// the outbox.
    pub(super) async fn share(&self, stored: &StoredResponse) -> Result<(), SharedError> {
        let (Some(shared), Some(id)) = (&self.shared, stored.id()) else {
            return Ok(());
        };
        let record = SharedRecord {
            response: stored.response.clone(),
            input: stored.input.clone(),
            previous_response_id: stored
                .previous
                .as_deref()
                .and_then(StoredResponse::id)
                .map(str::to_owned),
            tenant: stored.tenant.clone(),
        };
        let bytes = serde_json::to_vec(&record).unwrap_or_default();
        shared.put(id, bytes).await
    }

    /// Forget the response `id`, here and on every replica; whether any held it. A
    /// bound caller forgets only its own tenant's (another's is not found).
    pub(super) async fn forget(&self, id: &str, caller: &Caller) -> Result<bool, SharedError> {
        if caller.namespace.is_some() && self.find(id, caller).await?.is_none() {
            return Ok(false);
        }
        let here = self.delete(id);
        match &self.shared {
            Some(shared) if is_shareable_id(id) => Ok(shared.delete(id).await? || here),
            _ => Ok(here),
        }
    }

    /// Keep `response` (its `id` and `output` read from it), made from `input` after
    /// `previous` under the key of `tenant` (None: a key bound to no namespace, or no
    /// keys); the response kept, or None when it was not (its conversation alone is over
    /// the budget). Older responses go until everything alive fits.
    pub(super) fn keep(
        &self,
        response: Value,
        input: Vec<Value>,
        previous: Option<Arc<StoredResponse>>,
        tenant: Option<String>,
    ) -> Option<Arc<StoredResponse>> {
        let id = response.get("id").and_then(Value::as_str)?.to_owned();
        let bytes = size_of_json(&response) + input.iter().map(size_of_json).sum::<usize>();
        let chain_bytes = bytes + previous.as_ref().map_or(0, |p| p.chain_bytes);
        if !self.enabled() || chain_bytes > self.budget_bytes {
            return None;
        }
        self.live.fetch_add(bytes, Ordering::Relaxed);
        let stored = Arc::new(StoredResponse {
            response,
            input,
            previous,
            tenant,
            bytes,
            chain_bytes,
            live: self.live.clone(),
        });
        let mut kept = self.lock();
        kept.put(id, stored.clone());
        // Each eviction drops a response unless a later one holds it; dropping the
        // later ones then frees the chain. The newest (its chain within the budget)
        // stays, so this ends with everything alive in budget, but for responses
        // requests are using right now.
        while self.live.load(Ordering::Relaxed) > self.budget_bytes && kept.len() > 1 {
            kept.pop_lru();
        }
        Some(stored)
    }

    /// `items` with each `item_reference` to an item of a kept response (an output item,
    /// or an input item by the id its listing gives it) replaced by that item (as
    /// clients that keep responses at OpenAI send earlier items: the Vercel AI SDK,
    /// Codex). References to anything else stay, to be refused by name.
    pub(super) async fn resolve_references(
        &self,
        items: Vec<Value>,
        caller: &Caller,
    ) -> Result<Vec<Value>, SharedError> {
        let mut resolved = Vec::with_capacity(items.len());
        for item in items {
            let reference = (item.get("type").and_then(Value::as_str) == Some("item_reference"))
                .then(|| item.get("id").and_then(Value::as_str))
                .flatten();
            let found = match reference {
                Some(id) => self.kept_item(id, caller).await?,
                None => None,
            };
            resolved.push(found.unwrap_or(item));
        }
        Ok(resolved)
    }

    /// The item `id` of a kept response: an output item, or an input item as listed.
    async fn kept_item(&self, id: &str, caller: &Caller) -> Result<Option<Value>, SharedError> {
        let Some((response_id, place)) = item_place(id) else {
            return Ok(None);
        };
        let Some(kept) = self.find(&response_id, caller).await? else {
            return Ok(None);
        };
        let item = match place {
            Place::Output(output) => kept.output().get(output).cloned(),
            Place::Input(input) => kept
                .input()
                .get(input)
                .map(|i| as_listed(i, &response_id, input)),
        };
        Ok(item.filter(|item| item.get("id").and_then(Value::as_str) == Some(id)))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, lru::LruCache<String, Arc<StoredResponse>>> {
        lock(&self.kept)
    }
}

/// The kept responses, locked. A panic elsewhere while holding the lock leaves the map
/// whole (every change is one call on it): keep serving.
fn lock(kept: &Kept) -> std::sync::MutexGuard<'_, lru::LruCache<String, Arc<StoredResponse>>> {
    kept.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// A response's id: `resp_` and 128 random bits in hex.
pub(super) fn fresh_response_id() -> String {
    format!("resp_{:032x}", rand::random::<u128>())
}

/// An input given as text, as the user message item it stands for.
pub(super) fn user_message(text: &str) -> Value {
    json!({"type": "message", "role": "user", "content": text})
}

/// The bytes of `value` written as JSON (what it costs to keep, near enough).
fn size_of_json(value: &Value) -> usize {
    struct Counter(usize);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut counter = Counter(0);
    let _ = serde_json::to_writer(&mut counter, value);
    counter.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(id: &str, text: &str) -> Value {
        json!({"id": id, "object": "response", "output": [
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}
        ]})
    }

    #[test]
    fn a_chain_is_its_inputs_and_outputs_in_order() {
        let store = ResponseStore::new(1 << 20);
        assert!(
            store
                .keep(
                    response("resp_a", "A1"),
                    vec![user_message("Q1")],
                    None,
                    None
                )
                .is_some()
        );
        let first = store.get("resp_a").unwrap();
        let second_input =
            vec![json!({"type": "function_call_output", "call_id": "c", "output": "x"})];
        assert!(
            store
                .keep(response("resp_b", "A2"), second_input, Some(first), None)
                .is_some()
        );
        let texts: Vec<Value> = store
            .get("resp_b")
            .unwrap()
            .conversation()
            .into_iter()
            .map(|item| {
                item.get("output")
                    .cloned()
                    .or_else(|| item["content"].as_str().map(|s| json!(s)))
                    .unwrap_or_else(|| item["content"][0]["text"].clone())
            })
            .collect();
        assert_eq!(
            texts,
            vec![json!("Q1"), json!("A1"), json!("x"), json!("A2")]
        );
        assert_eq!(store.get("resp_b").unwrap().response()["id"], "resp_b");
    }

    #[test]
    fn the_budget_holds_everything_alive_and_a_kept_chain_stays_whole() {
        let one = size_of_json(&response("resp_0", "x")) + size_of_json(&user_message("q"));
        let store = ResponseStore::new(one * 3);
        // A conversation of three fits; a fourth turn would not, and is not kept.
        let mut previous = None;
        for i in 0..3 {
            let id = format!("resp_{i}");
            assert!(
                store
                    .keep(response(&id, "x"), vec![user_message("q")], previous, None)
                    .is_some()
            );
            previous = store.get(&id);
        }
        assert_eq!(previous.as_ref().unwrap().conversation().len(), 6);
        assert!(
            store
                .keep(
                    response("resp_3", "x"),
                    vec![user_message("q")],
                    previous.clone(),
                    None
                )
                .is_none()
        );
        assert_eq!(store.usage(), (3, one * 3));
        // A new conversation: the old one goes, all of it (its older responses only
        // once its newest does).
        drop(previous);
        assert!(
            store
                .keep(response("resp_9", "x"), vec![user_message("q")], None, None)
                .is_some()
        );
        assert_eq!(store.usage(), (1, one));
        assert!(store.get("resp_2").is_none() && store.get("resp_9").is_some());
        // Deleted, a response frees its memory.
        assert!(store.delete("resp_9"));
        assert!(!store.delete("resp_9"));
        assert_eq!(store.usage(), (0, 0));
    }

    #[test]
    fn a_response_over_the_budget_or_a_store_of_none_keeps_nothing() {
        let store = ResponseStore::new(10);
        assert!(
            store
                .keep(response("resp_a", "long enough"), Vec::new(), None, None)
                .is_none()
        );
        assert_eq!(store.usage(), (0, 0));
        let none = ResponseStore::new(0);
        assert!(!none.enabled());
        assert!(
            none.keep(response("resp_a", "x"), Vec::new(), None, None)
                .is_none()
        );
    }

    #[test]
    fn a_conversation_of_many_turns_is_freed_without_deep_recursion() {
        const TURNS: usize = 200_000;
        let store = ResponseStore::new(usize::MAX);
        let mut previous = None;
        for i in 0..TURNS {
            let id = format!("resp_{i}");
            assert!(
                store
                    .keep(json!({"id": id}), Vec::new(), previous.take(), None)
                    .is_some()
            );
            previous = store.get(&id);
            if i + 1 < TURNS {
                store.delete(&id);
            }
        }
        drop(previous);
        assert_eq!(store.usage().0, 1);
        // The last delete frees the whole chain, here on a test thread's small stack.
        assert!(store.delete(&format!("resp_{}", TURNS - 1)));
        assert_eq!(store.usage(), (0, 0));
    }

    #[test]
    fn references_to_kept_items_become_the_items() {
        let store = ResponseStore::new(1 << 20);
        let mut kept = response("resp_ab12", "A1");
        kept["output"][0]["id"] = json!("msg_ab12_0");
        let input = vec![
            user_message("Q1"),
            json!({"type": "message", "id": "own", "role": "user", "content": "Q2"}),
        ];
        assert!(
            store
                .keep(kept.clone(), input.clone(), None, None)
                .is_some()
        );
        let reference = |id: &str| json!({"type": "item_reference", "id": id});
        let user = user_message("next");
        let items = vec![
            reference("msg_ab12_0"),
            user.clone(),
            reference("msg_ab12_1"),
            reference("fc_ab12_0"),
            reference("msg_nothere_0"),
            reference("no-underscores"),
            reference("msg_ab12_in0"),
            reference("msg_ab12_in1"),
            reference("msg_ab12_in2"),
        ];
        let resolved = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(store.resolve_references(items.clone(), &Caller::default()))
            .unwrap();
        assert_eq!(resolved[0], kept["output"][0]);
        assert_eq!(resolved[1], user);
        // An index past the output, a kind the item is not, an unknown response, an id
        // of another shape: left as they are.
        assert_eq!(resolved[2..6], items[2..6]);
        // An input item by the id its listing gives it (not one that has its own id,
        // nor one past the input).
        assert_eq!(resolved[6], as_listed(&input[0], "resp_ab12", 0));
        assert_eq!(resolved[6]["content"][0]["text"], "Q1");
        assert_eq!(resolved[7..], items[7..]);
    }

    #[test]
    fn ids_are_random_and_distinct() {
        let (a, b) = (fresh_response_id(), fresh_response_id());
        assert_ne!(a, b);
        assert_eq!(a.len(), "resp_".len() + 32);
    }

    #[test]
    fn a_bound_key_finds_and_forgets_only_its_own_tenant_s_responses() {
        let store = ResponseStore::new(1 << 20);
        let tenant = |ns: &str| Caller {
            namespace: Some(ns.into()),
        };
        let mut mine = response("resp_a", "A");
        mine["output"][0]["id"] = json!("msg_a_0");
        let made = store.keep(mine.clone(), Vec::new(), None, Some("a".into()));
        assert!(made.is_some());
        assert!(
            store
                .keep(response("resp_open", "O"), Vec::new(), None, None)
                .is_some()
        );
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let found = |id: &str, caller: &Caller| {
            let found = runtime.block_on(store.find(id, caller)).unwrap();
            found.map(|r| r.id().unwrap().to_string())
        };
        assert_eq!(found("resp_a", &tenant("a")).as_deref(), Some("resp_a"));
        assert_eq!(found("resp_a", &tenant("b")), None);
        assert_eq!(
            found("resp_a", &Caller::default()).as_deref(),
            Some("resp_a")
        );
        // A response made without a bound key is no tenant's.
        assert_eq!(found("resp_open", &tenant("a")), None);
        let reference = vec![json!({"type": "item_reference", "id": "msg_a_0"})];
        let resolved = runtime
            .block_on(store.resolve_references(reference.clone(), &tenant("b")))
            .unwrap();
        assert_eq!(resolved, reference, "another tenant's item is not resolved");
        let resolved = runtime
            .block_on(store.resolve_references(reference, &tenant("a")))
            .unwrap();
        assert_eq!(resolved[0], mine["output"][0]);
        assert!(
            !runtime
                .block_on(store.forget("resp_a", &tenant("b")))
                .unwrap()
        );
        assert!(store.get("resp_a").is_some());
        assert!(
            runtime
                .block_on(store.forget("resp_a", &tenant("a")))
                .unwrap()
        );
        assert!(store.get("resp_a").is_none());
        // Records of servers before tenants read as no tenant's.
        let old = r#"{"response": {"id": "resp_x"}, "input": [], "previous_response_id": null}"#;
        let record: SharedRecord = serde_json::from_str(old).unwrap();
        assert_eq!(record.tenant, None);
    }
}
