//! The ids of a response's items and the form its input items are listed in: an
//! output item is `<kind>_<response>_<index>` ([`item_id`]), an input item the client
//! sent without an id is listed as `<kind>_<response>_in<index>` ([`as_listed`]); an
//! `item_reference` to either names its response and place ([`item_place`]).

use serde_json::{Value, json};

/// The id of output item `index` of response `response_id`, with the item kind's
/// prefix (`rs`, `msg`, `fc`).
pub(super) fn item_id(response_id: &str, prefix: &str, index: usize) -> String {
    let tail = response_id.strip_prefix("resp_").unwrap_or(response_id);
    format!("{prefix}_{tail}_{index}")
}

/// Where in its response an item is.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Place {
    /// Output item `index`.
    Output(usize),
    /// Input item `index`, by the id its listing gave it.
    Input(usize),
}

/// The response and place an item's id names: an output item's ([`item_id`]'s
/// inverse) or a listed input item's ([`as_listed`]'s `<kind>_<response>_in<index>`).
pub(super) fn item_place(item_id: &str) -> Option<(String, Place)> {
    let (_kind, rest) = item_id.split_once('_')?;
    let (tail, index) = rest.rsplit_once('_')?;
    let place = match index.strip_prefix("in") {
        Some(input) => Place::Input(input.parse().ok()?),
        None => Place::Output(index.parse().ok()?),
    };
    Some((format!("resp_{tail}"), place))
}

/// Input item `index` of response `response_id` as it is listed: with an id, a type,
/// and a message's text as content parts.
pub(super) fn as_listed(item: &Value, response_id: &str, index: usize) -> Value {
    let mut item = item.clone();
    let Some(fields) = item.as_object_mut() else {
        return item;
    };
    // An item without a type is a message (the API's easy form).
    let kind = match fields.get("type").and_then(Value::as_str) {
        Some(kind) => kind.to_owned(),
        None => "message".to_owned(),
    };
    fields.insert("type".into(), json!(kind));
    if kind == "message"
        && let Some(Value::String(text)) = fields.get("content")
    {
        let part = match fields.get("role").and_then(Value::as_str) {
            Some("assistant") => json!({"type": "output_text", "text": text, "annotations": []}),
            _ => json!({"type": "input_text", "text": text}),
        };
        fields.insert("content".into(), json!([part]));
    }
    if matches!(
        kind.as_str(),
        "message" | "function_call" | "function_call_output"
    ) {
        fields.entry("status").or_insert_with(|| json!("completed"));
    }
    if !fields.get("id").is_some_and(Value::is_string) {
        let prefix = match kind.as_str() {
            "message" => "msg",
            "function_call" => "fc",
            "function_call_output" => "fco",
            "reasoning" => "rs",
            _ => "item",
        };
        let tail = response_id.strip_prefix("resp_").unwrap_or(response_id);
        fields.insert("id".into(), json!(format!("{prefix}_{tail}_in{index}")));
    }
    item
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_item_is_listed_with_an_id_a_type_and_content_parts() {
        assert_eq!(
            item_place(&item_id("resp_ab", "fc", 4)),
            Some(("resp_ab".into(), Place::Output(4)))
        );
        let user = as_listed(&json!({"role": "user", "content": "hi"}), "resp_ab", 0);
        assert_eq!(
            user,
            json!({"id": "msg_ab_in0", "type": "message", "role": "user", "status": "completed",
                   "content": [{"type": "input_text", "text": "hi"}]})
        );
        let assistant = as_listed(
            &json!({"role": "assistant", "content": "yes"}),
            "resp_ab",
            1,
        );
        assert_eq!(assistant["content"][0]["type"], "output_text");
        let output = json!({"type": "function_call_output", "call_id": "c", "output": "18C"});
        assert_eq!(as_listed(&output, "resp_ab", 2)["id"], "fco_ab_in2");
        let own = json!({"type": "function_call", "id": "fc_x_1", "call_id": "c", "name": "f", "arguments": "{}", "status": "completed"});
        assert_eq!(
            as_listed(&own, "resp_ab", 3),
            own,
            "a client's own id and fields stay"
        );
        assert_eq!(
            item_place("fco_ab_in2"),
            Some(("resp_ab".into(), Place::Input(2)))
        );
        assert_eq!(item_place("msg_ab_inx"), None);
    }
}
