//! The queue's bound: a full queue answers 429, and a tenant that fills it is refused
//! while the others still get in.

use std::sync::Arc;

use serde_json::{Value, json};

use super::TestServer;

/// The queue holds `max_queued` (4 here) requests waiting for the model thread; the
/// next gets 429 with `Retry-After`.
#[test]
fn a_full_queue_answers_429_with_retry_after() {
    let server = Arc::new(TestServer::start());
    // The scripted model sleeps on SLOW prompts: the first holds it, four more queue.
    let waiting: Vec<_> = (0..5)
        .map(|i| {
            let server = server.clone();
            let handle = std::thread::spawn(move || {
                server
                    .post(
                        "/v1/completions",
                        json!({"prompt": format!("SLOW {i}"), "max_tokens": 1}),
                    )
                    .0
            });
            std::thread::sleep(std::time::Duration::from_millis(150));
            handle
        })
        .collect();
    let response = ureq::post(&format!("{}/v1/completions", server.base))
        .set("Content-Type", "application/json")
        .send_string(&json!({"prompt": "hi"}).to_string());
    let Err(ureq::Error::Status(429, r)) = response else {
        panic!("a full queue answered {response:?}");
    };
    assert_eq!(r.header("retry-after"), Some("1"));
    let body: Value = serde_json::from_str(&r.into_string().unwrap()).unwrap();
    assert_eq!(body["error"]["type"], "rate_limit_error", "{body}");
    for handle in waiting {
        assert_eq!(
            handle.join().unwrap(),
            200,
            "the queued requests are served"
        );
    }
}

/// With the queue full of one namespace's requests (the scripted model holds the first
/// of them, `max_queued` 4 wait), another namespace's request still gets in and is
/// served; the full namespace's next one gets 429 naming it and its share (the whole
/// bound, alone in the queue).
#[test]
fn a_namespace_filling_the_queue_leaves_room_for_the_others() {
    let server = Arc::new(TestServer::start());
    let post_as = |user: &str, prompt: String| {
        let server = server.clone();
        let body = json!({"prompt": prompt, "max_tokens": 1, "user": user});
        std::thread::spawn(move || server.post("/v1/completions", body).0)
    };
    let busy: Vec<_> = (0..5)
        .map(|i| {
            let handle = post_as("busy", format!("SLOW {i}"));
            std::thread::sleep(std::time::Duration::from_millis(150));
            handle
        })
        .collect();
    let refused = ureq::post(&format!("{}/v1/completions", server.base))
        .set("Content-Type", "application/json")
        .send_string(&json!({"prompt": "more", "user": "busy"}).to_string());
    let Err(ureq::Error::Status(429, r)) = refused else {
        panic!("the full namespace's next request answered {refused:?}");
    };
    let body: Value = serde_json::from_str(&r.into_string().unwrap()).unwrap();
    let message = body["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("namespace \"busy\"") && message.contains("its share: 4"),
        "{message}"
    );
    // Another namespace gets in past the full queue, as does a second of its own (its
    // share is half the bound); its third waits for room.
    let quiet: Vec<_> = (0..2)
        .map(|i| post_as("quiet", format!("hi {i}")))
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(300));
    let third = server.post(
        "/v1/completions",
        json!({"prompt": "third", "max_tokens": 1, "user": "quiet"}),
    );
    assert_eq!(third.0, 429, "{}", third.1);
    for handle in quiet.into_iter().chain(busy) {
        assert_eq!(
            handle.join().unwrap(),
            200,
            "every admitted request is served"
        );
    }
    // Served, nothing counts as waiting any more (the scripted model drops a job just
    // after it answers).
    let counts = &server.app.waiting_by_namespace;
    let drained = (0..100).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(10));
        counts.share_of("busy") == (0, 1) && counts.share_of("quiet") == (0, 1)
    });
    assert!(drained, "{counts:?}");
    // Each refusal is counted against its namespace.
    let metrics = ureq::get(&format!("{}/metrics", server.base))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    for namespace in ["busy", "quiet"] {
        let line = format!("suffixd_namespace_queue_refusals_total{{namespace=\"{namespace}\"}} 1");
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} not in\n{metrics}"
        );
    }
}
