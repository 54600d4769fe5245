//! Stored responses shared between replicas (`suffixd serve --replicate`) through a real
//! `nats-server`, with two server processes and the real model: a conversation started
//! on one replica is read, continued and deleted on the other, a streamed response is
//! readable elsewhere as soon as its client has read it, and while NATS is down a
//! replica keeps serving from its own memory and says why it cannot reach the others'
//! (what it keeps meanwhile goes out once NATS is back), and after NATS lost its
//! storage the replicas make the stream again. Behind API keys, a tenant's response
//! stays its own on the other replica too.

mod common;

use std::time::{Duration, Instant};

use serde_json::{Value, json};

use common::nats::Nats;
use common::{Server, answer, model_present};

/// POST a response request; its status and body.
fn respond(server: &Server, body: Value) -> (u16, Value) {
    server.post("/v1/responses", &body.to_string(), false)
}

/// A greedy, short request for `input`, continuing `previous` if given.
fn turn(input: &str, previous: Option<&str>) -> Value {
    json!({
        "input": input,
        "max_output_tokens": 12,
        "temperature": 0,
        "previous_response_id": previous,
    })
}

/// The finished response of a streamed request: the `response.completed` (or
/// `response.incomplete`, cut at `max_output_tokens`) event's.
fn streamed(server: &Server, body: Value) -> Value {
    let text = ureq::post(&server.url("/v1/responses"))
        .set("content-type", "application/json")
        .send_string(&body.to_string())
        .expect("the stream starts")
        .into_string()
        .expect("the stream ends");
    text.lines()
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .find(|event| {
            event["type"] == "response.completed" || event["type"] == "response.incomplete"
        })
        .map(|event| event["response"].clone())
        .unwrap_or_else(|| panic!("no response.completed in {text}"))
}

fn delete(server: &Server, id: &str) -> (u16, Value) {
    answer(ureq::delete(&server.url(&format!("/v1/responses/{id}"))).call())
}

fn metric(server: &Server, event: &str) -> u64 {
    let text = ureq::get(&server.url("/metrics"))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    let name = format!("suffixd_shared_responses_total{{event=\"{event}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(name.as_str()))
        .and_then(|count| count.parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {text}"))
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let t = Instant::now();
    while !done() {
        assert!(t.elapsed() < Duration::from_secs(60), "timed out: {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn replicas_continue_read_and_delete_each_other_s_responses() {
    if !model_present() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let nats_dir = tmp.path().join("nats");
    let nats = Nats::start(&nats_dir, None);
    let url = nats.url();
    let flags = ["--replicate", url.as_str(), "--cluster", "shared-responses"];
    let a = Server::start_with(&tmp.path().join("a"), &flags, false);
    let b = Server::start_with(&tmp.path().join("b"), &flags, false);

    // A conversation starts on a; b reads it as a made it.
    let (status, first) = respond(&a, turn("Name three colours.", None));
    assert_eq!(status, 200, "{first}");
    let first_id = first["id"].as_str().unwrap().to_string();
    let (status, read) = b.get(&format!("/v1/responses/{first_id}"), false);
    assert_eq!(status, 200, "{read}");
    assert_eq!(read, first, "b returns a's response as a finished it");

    // b continues it: the earlier turn is in b's prompt (more input tokens than the
    // same question alone).
    let question = "And three animals?";
    let (status, second) = respond(&b, turn(question, Some(&first_id)));
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["previous_response_id"], first_id.as_str());
    let (status, alone) = respond(
        &b,
        json!({"input": question, "max_output_tokens": 1, "store": false}),
    );
    assert_eq!(status, 200, "{alone}");
    let (with_history, without) = (
        second["usage"]["input_tokens"].as_u64().unwrap(),
        alone["usage"]["input_tokens"].as_u64().unwrap(),
    );
    assert!(
        with_history > without + 5,
        "the continued prompt holds the first turn: {with_history} tokens against {without}"
    );
    let second_id = second["id"].as_str().unwrap().to_string();

    // A streamed third turn on a: b finds it as soon as a's client has read that it is
    // done, and both continue from it alike.
    let third = streamed(
        &a,
        json!({"input": "Which is largest?", "max_output_tokens": 8,
        "temperature": 0, "previous_response_id": second_id, "stream": true}),
    );
    let third_id = third["id"].as_str().unwrap().to_string();
    let (status, read) = b.get(&format!("/v1/responses/{third_id}"), false);
    assert_eq!(status, 200, "{read}");
    assert_eq!(read["output"], third["output"]);
    let (status, on_a) = respond(&a, turn("Why?", Some(&third_id)));
    let (status_b, on_b) = respond(&b, turn("Why?", Some(&third_id)));
    assert_eq!((status, status_b), (200, 200), "{on_a} {on_b}");
    assert_eq!(on_a["usage"]["input_tokens"], on_b["usage"]["input_tokens"]);
    assert_eq!(on_a["output"][0]["content"], on_b["output"][0]["content"]);
    assert!(metric(&b, "fetched") >= 1 && metric(&a, "published") >= 3);

    // Deleted on b, a's last response is gone from a too (a held it in memory).
    let deleted_id = on_a["id"].as_str().unwrap().to_string();
    let (status, deleted) = delete(&b, &deleted_id);
    assert_eq!(
        (status, deleted["deleted"].as_bool()),
        (200, Some(true)),
        "{deleted}"
    );
    wait_for("a drops the deleted response", || {
        a.get(&format!("/v1/responses/{deleted_id}"), false).0 == 404
    });
    assert_eq!(delete(&a, &deleted_id).0, 404);
    assert!(metric(&a, "dropped") >= 1);

    // NATS goes away: a keeps serving and keeping responses in its memory, without
    // waiting on NATS; b says plainly that it cannot reach the shared responses.
    let port = nats.port;
    drop(nats);
    let t = Instant::now();
    let (status, alone_a) = respond(&a, turn("Name a fruit.", None));
    assert_eq!(
        (status, alone_a["store"].as_bool()),
        (200, Some(true)),
        "{alone_a}"
    );
    let during_outage = alone_a["id"].as_str().unwrap().to_string();
    assert_eq!(
        a.get(&format!("/v1/responses/{during_outage}"), false).0,
        200
    );
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    let (status, refused) = b.get(&format!("/v1/responses/{during_outage}"), false);
    assert_eq!(status, 503, "{refused}");
    assert_eq!(refused["error"]["code"], "shared_responses_unavailable");
    assert!(metric(&b, "failed") >= 1);

    // NATS back (same storage): sharing resumes by itself, and the response a kept
    // while it was away, waiting in a's outbox, reaches b.
    let nats = Nats::start(&nats_dir, Some(port));
    wait_for("the response kept during the outage reaches b", || {
        b.get(&format!("/v1/responses/{during_outage}"), false).0 == 200
    });
    assert!(metric(&a, "queued") >= 1);
    let mut shared_again = String::new();
    wait_for("a shares again", || {
        let (status, r) = respond(&a, turn("Name a tree.", None));
        assert_eq!(status, 200, "{r}");
        shared_again = r["id"].as_str().unwrap().to_string();
        b.get(&format!("/v1/responses/{shared_again}"), false).0 == 200
    });
    // A replica started now, holding nothing, continues the three-turn conversation the
    // stream kept through the outage as a did, and does not find the deleted response.
    let c = Server::start_with(&tmp.path().join("c"), &flags, false);
    let (status, on_c) = respond(&c, turn("Why?", Some(&third_id)));
    assert_eq!(status, 200, "{on_c}");
    assert_eq!(on_c["usage"]["input_tokens"], on_a["usage"]["input_tokens"]);
    assert_eq!(on_c["output"][0]["content"], on_a["output"][0]["content"]);
    assert_eq!(c.get(&format!("/v1/responses/{deleted_id}"), false).0, 404);
    c.stop();

    // NATS back without its storage: the responses stream is made again by the first
    // replica that needs it, and sharing goes on without a restart.
    drop(nats);
    let _nats = Nats::start(&tmp.path().join("nats-empty"), Some(port));
    wait_for("a shares again on a NATS that lost its storage", || {
        let (status, r) = respond(&a, turn("Name a river.", None));
        assert_eq!(status, 200, "{r}");
        let id = r["id"].as_str().unwrap().to_string();
        b.get(&format!("/v1/responses/{id}"), false).0 == 200
    });
    assert_eq!(
        b.get(&format!("/v1/responses/{first_id}"), false).0,
        200,
        "b still holds it"
    );
    a.stop();
    b.stop();
}

/// Behind tenants' API keys (the same file on both replicas), a response made on a under
/// team-b's key is found on b by team-b's key only: the tenant travels with it.
#[test]
fn a_tenant_s_response_is_its_own_on_every_replica() {
    if !model_present() {
        return;
    }
    const TEAM_B: &str = "sk-team-b-0123456789abcdef";
    const TEAM_C: &str = "sk-team-c-0123456789abcdef";
    let tmp = tempfile::tempdir().unwrap();
    let nats = Nats::start(&tmp.path().join("nats"), None);
    let url = nats.url();
    let keys = tmp.path().join("keys");
    std::fs::write(&keys, format!("{TEAM_B} team-b\n{TEAM_C} team-c\n")).unwrap();
    let flags = [
        "--replicate",
        url.as_str(),
        "--cluster",
        "tenants",
        "--api-keys",
        keys.to_str().unwrap(),
    ];
    let a = Server::start_with(&tmp.path().join("a"), &flags, false);
    let b = Server::start_with(&tmp.path().join("b"), &flags, false);
    let with_key =
        |request: ureq::Request, key: &str| request.set("Authorization", &format!("Bearer {key}"));
    let made = with_key(ureq::post(&a.url("/v1/responses")), TEAM_B)
        .set("content-type", "application/json")
        .send_string(&turn("Name three colours.", None).to_string());
    let (status, made) = answer(made);
    assert_eq!(status, 200, "{made}");
    let path = format!("/v1/responses/{}", made["id"].as_str().unwrap());
    let read = |key: &str| answer(with_key(ureq::get(&b.url(&path)), key).call());
    assert_eq!(read(TEAM_C).0, 404, "another tenant, on the other replica");
    let (status, found) = read(TEAM_B);
    assert_eq!(status, 200, "{found}");
    assert_eq!(found, made);
    assert_eq!(read(TEAM_C).0, 404, "once b holds it too");
    let deleted = answer(with_key(ureq::delete(&b.url(&path)), TEAM_C).call());
    assert_eq!(deleted.0, 404, "{}", deleted.1);
    assert_eq!(read(TEAM_B).0, 200, "another tenant's delete took nothing");
}
