//! `GET /v1/responses/{id}/input_items`: the items a kept response was made from, a page
//! at a time (the OpenAI client's `responses.input_items.list`). As at OpenAI, a
//! response that continued another lists the whole conversation before it (each earlier
//! response's input, then its output) and then its own input; instructions are not
//! items.
//!
//! Every listed item has an id. A client's item without one gets
//! `<kind>_<response>_in<index>`, from the response whose input held it, so the same
//! item has the same id in every listing, on every replica, across pages, and an
//! `item_reference` to it is the item ([`super::items`]). Items read as OpenAI lists
//! them: a message has a `type`, its text as content parts and a `status`.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::super::keys::Caller;
use super::items::as_listed;
use super::stored::StoredResponse;
use super::{not_kept, shared_unavailable};
use crate::serve::AppState;
use crate::serve::api::ApiError;

/// Items on a page unless the request says otherwise, and the most it may ask for
/// (OpenAI's).
const DEFAULT_LIMIT: usize = 20;
const MAX_LIMIT: usize = 100;

/// `GET /v1/responses/{id}/input_items`.
pub async fn response_input_items(
    State(app): State<Arc<AppState>>,
    caller: Caller,
    Path(id): Path<String>,
    Query(query): Query<Vec<(String, String)>>,
) -> Response {
    let page = match Page::read(&query) {
        Ok(page) => page,
        Err(e) => return e.into_response(),
    };
    match app.responses.find(&id, &caller).await {
        Ok(Some(kept)) => match page.of(listed_input(&kept)) {
            Ok(list) => Json(list).into_response(),
            Err(e) => e.into_response(),
        },
        Ok(None) => not_kept(&id).into_response(),
        Err(e) => shared_unavailable(e).into_response(),
    }
}

/// Which items a request asks for.
#[derive(Debug, PartialEq)]
struct Page {
    limit: usize,
    /// Newest first (OpenAI's default), else oldest first.
    newest_first: bool,
    /// Only the items after this one, in the page's order.
    after: Option<String>,
    /// Only the items before this one, in the page's order.
    before: Option<String>,
}

impl Page {
    /// The page `query` asks for. `include` is accepted and changes nothing: this
    /// server keeps no images, files or search results to add.
    fn read(query: &[(String, String)]) -> Result<Page, ApiError> {
        let mut page = Page {
            limit: DEFAULT_LIMIT,
            newest_first: true,
            after: None,
            before: None,
        };
        for (name, value) in query {
            match name.as_str() {
                "limit" => {
                    page.limit = value
                        .parse()
                        .ok()
                        .filter(|n| (1..=MAX_LIMIT).contains(n))
                        .ok_or_else(|| {
                            ApiError::bad_request(format!(
                                "`limit` must be a whole number from 1 to {MAX_LIMIT}"
                            ))
                            .param("limit")
                        })?;
                }
                "order" => {
                    page.newest_first = match value.as_str() {
                        "desc" => true,
                        "asc" => false,
                        _ => {
                            return Err(ApiError::bad_request(
                                "`order` must be `asc` (oldest first) or `desc` (newest first)",
                            )
                            .param("order"));
                        }
                    };
                }
                "after" => page.after = Some(value.clone()),
                "before" => page.before = Some(value.clone()),
                _ => {}
            }
        }
        Ok(page)
    }

    /// The page of `items` (oldest first) it asks for, as OpenAI's list object.
    fn of(&self, mut items: Vec<Value>) -> Result<Value, ApiError> {
        if self.newest_first {
            items.reverse();
        }
        let place = |id: &str, param: &'static str| {
            items
                .iter()
                .position(|item| item.get("id").and_then(Value::as_str) == Some(id))
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "`{param}` names no input item of this response; use an id from an earlier page"
                    ))
                    .param(param)
                })
        };
        let start = match &self.after {
            Some(id) => place(id, "after")? + 1,
            None => 0,
        };
        let end = match &self.before {
            Some(id) => place(id, "before")?,
            None => items.len(),
        };
        let window = items.get(start..end).unwrap_or_default();
        // Paging backwards (`before` alone) takes the items just before the cursor.
        let backwards = self.before.is_some() && self.after.is_none();
        let taken = window.len().min(self.limit);
        let data = match backwards {
            true => &window[window.len() - taken..],
            false => &window[..taken],
        };
        let id_of = |item: Option<&Value>| item.and_then(|i| i.get("id")).cloned();
        Ok(json!({
            "object": "list",
            "data": data,
            "first_id": id_of(data.first()),
            "last_id": id_of(data.last()),
            "has_more": taken < window.len(),
        }))
    }
}

/// The items `kept` was made from, oldest first, as they are listed.
fn listed_input(kept: &StoredResponse) -> Vec<Value> {
    let chain = kept.chain();
    let mut items = Vec::new();
    for (n, link) in chain.iter().enumerate() {
        let response_id = link.id().unwrap_or("resp_");
        let input = link.input().iter().enumerate();
        items.extend(input.map(|(index, item)| as_listed(item, response_id, index)));
        if n + 1 < chain.len() {
            items.extend(link.output().iter().cloned());
        }
    }
    items
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn items(n: usize) -> Vec<Value> {
        (0..n).map(|i| json!({"id": format!("i{i}")})).collect()
    }

    fn ids(list: &Value) -> Vec<&str> {
        list["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|item| item["id"].as_str().unwrap())
            .collect()
    }

    #[test]
    fn a_query_reads_as_openai_documents_it() {
        let default = Page::read(&[]).unwrap();
        assert_eq!((default.limit, default.newest_first), (20, true));
        let page = Page::read(&query(&[
            ("limit", "3"),
            ("order", "asc"),
            ("after", "i1"),
            ("include[]", "message.input_image.image_url"),
        ]))
        .unwrap();
        assert_eq!((page.limit, page.newest_first), (3, false));
        assert_eq!(page.after.as_deref(), Some("i1"));
        for bad in [
            ("limit", "0"),
            ("limit", "101"),
            ("limit", "x"),
            ("order", "up"),
        ] {
            let e = Page::read(&query(&[bad])).unwrap_err();
            assert_eq!(e.param, Some(bad.0), "{bad:?}");
        }
    }

    #[test]
    fn pages_follow_the_order_and_the_cursors() {
        let page = |pairs: &[(&str, &str)]| Page::read(&query(pairs)).unwrap();
        let newest = page(&[("limit", "2")]).of(items(5)).unwrap();
        assert_eq!(ids(&newest), ["i4", "i3"]);
        assert_eq!(newest["has_more"], true);
        assert_eq!(
            (newest["first_id"].as_str(), newest["last_id"].as_str()),
            (Some("i4"), Some("i3"))
        );
        let next = page(&[("limit", "2"), ("after", "i3")])
            .of(items(5))
            .unwrap();
        assert_eq!(ids(&next), ["i2", "i1"]);
        let last = page(&[("limit", "2"), ("after", "i1")])
            .of(items(5))
            .unwrap();
        assert_eq!((ids(&last), &last["has_more"]), (vec!["i0"], &json!(false)));
        let oldest = page(&[("order", "asc")]).of(items(5)).unwrap();
        assert_eq!(ids(&oldest), ["i0", "i1", "i2", "i3", "i4"]);
        assert_eq!(oldest["has_more"], false);
        // Backwards from a cursor: the items just before it.
        let back = page(&[("order", "asc"), ("limit", "2"), ("before", "i4")])
            .of(items(5))
            .unwrap();
        assert_eq!(
            (ids(&back), &back["has_more"]),
            (vec!["i2", "i3"], &json!(true))
        );
        let between = page(&[("order", "asc"), ("after", "i0"), ("before", "i3")])
            .of(items(5))
            .unwrap();
        assert_eq!(ids(&between), ["i1", "i2"]);
        let crossed = page(&[("order", "asc"), ("after", "i3"), ("before", "i1")])
            .of(items(5))
            .unwrap();
        assert_eq!(
            (ids(&crossed), &crossed["first_id"]),
            (vec![], &Value::Null)
        );
        let unknown = page(&[("after", "nope")]).of(items(5)).unwrap_err();
        assert_eq!(unknown.param, Some("after"));
    }
}
